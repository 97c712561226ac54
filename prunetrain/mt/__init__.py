"""The translation application (German→English recipes), in five rooms:

- `text`: corpora, the tokenizer and line-exact text I/O (`data`), Multi30k fetched and verified when no local copy
  exists (`corpus`);
- `evaluation`: translate and score with sacreBLEU (`translation`), BLEU as a pruning-curve metric (`metrics`) and as
  summable per-sentence statistics for significance tests (`bleu_stats`), the test sets of a run (`eval_sets`),
  CTranslate2 speed (`ctranslate2_speed`);
- `config`: recipe configs validated at load (`recipe`, `recipe_l0`, `recipe_budget`, `recipe_yaml`; the YAMLs ship
  in `recipes/` as package data);
- `run`: the recipe runner (`runner`) and what it relies on: run directories and records, preflight checks, run
  settings, the starting model, what every recipe's Trainer shares (`training_setup`), Voita et al.'s gate sweeps
  (`l0_sweep`) and the run report (`report`);
- `comparison`: comparing runs and arms over seeds and test sets (`compare`, `compare_arms`, `compare_seeds`,
  `compare_validation`).

The library (engine, methods, training, ...) never imports it."""
