"""The translation application (German→English recipes): corpora and tokenizer (`data`), translate/evaluate with
sacreBLEU (`translation`), recipe configs (`recipe`) shipped in `recipes/`, the recipe runner (`runner`), Voita et al.'s
gate sweeps (`l0_sweep`) and the run report (`report`). The library (engine, methods, training) never imports it."""
