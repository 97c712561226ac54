"""The translation application (German→English recipes): corpora, tokenizer and line-exact text I/O (`data`),
translate/evaluate with sacreBLEU (`translation`), BLEU as a pruning-curve metric (`metrics`) and as summable
per-sentence statistics for significance tests (`bleu_stats`), Multi30k fetched and verified
when no local copy exists (`corpus`), recipe configs validated at load (`recipe`, shipped in `recipes/` as package data),
run directories (`run_dir`), what every recipe's Trainer shares (`training_setup`), the recipe runner (`runner`),
Voita et al.'s gate sweeps (`l0_sweep`) and the run report (`report`). The library (engine, methods, training, ...)
never imports it."""
