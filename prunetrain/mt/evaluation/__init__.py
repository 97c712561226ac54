"""Translating and scoring: sacreBLEU (`translation`), BLEU as a curve metric (`metrics`) and as per-sentence
statistics (`bleu_stats`), the test sets of a run (`eval_sets`), CTranslate2 speed (`ctranslate2_speed`)."""
