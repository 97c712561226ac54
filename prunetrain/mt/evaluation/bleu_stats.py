"""Corpus BLEU as a function of per-sentence statistics, for paired bootstrap tests
(`prunetrain.methods.significance`).

sacreBLEU's corpus BLEU (13a tokenization, exp smoothing, as in `score_translations`) sums, over the sentences,

    s_i = (hypothesis length, reference length, matched n-grams for n = 1…4, hypothesis n-grams for n = 1…4)

and computes BLEU = BP · exp(¼ Σ_n log p_n) from the sums (p_n = matched_n / total_n, BP = min(1, e^{1 − r/c})).
`bleu_from_stats(Σ_i s_i)` equals `BLEU().corpus_score(hypotheses, [references]).score` exactly.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

STATS_PER_SENTENCE = 10


@lru_cache(maxsize=1)
def _bleu():
    """sacreBLEU's BLEU with the defaults `score_translations` uses (13a, exp smoothing, cased)."""
    from sacrebleu.metrics import BLEU

    return BLEU()


def bleu_sentence_stats(hypotheses: Sequence[str], references: Sequence[str]) -> list[list[int]]:
    """One row `s_i` per sentence (the module docstring's layout), from sacreBLEU's own n-gram counting."""
    if len(hypotheses) != len(references):
        raise ValueError(f"bleu_sentence_stats: {len(hypotheses)} hypotheses but {len(references)} references.")
    bleu = _bleu()
    rows = []
    for hypothesis, reference in zip(hypotheses, references):
        one = bleu.corpus_score([hypothesis], [[reference]])
        rows.append([int(one.sys_len), int(one.ref_len), *map(int, one.counts), *map(int, one.totals)])
    return rows


def bleu_from_stats(sums: Sequence[float] | np.ndarray) -> float:
    """Corpus BLEU from the per-sentence statistics summed over a corpus (or a resample of it)."""
    sums = [int(round(float(x))) for x in sums]
    if len(sums) != STATS_PER_SENTENCE:
        raise ValueError(f"bleu_from_stats: expected {STATS_PER_SENTENCE} summed statistics, got {len(sums)}.")
    bleu = _bleu()
    return float(bleu.compute_bleu(correct=sums[2:6], total=sums[6:10], sys_len=sums[0], ref_len=sums[1],
                                   smooth_method=bleu.smooth_method, smooth_value=bleu.smooth_value,
                                   effective_order=bleu.effective_order,
                                   max_ngram_order=bleu.max_ngram_order).score)


__all__ = ["STATS_PER_SENTENCE", "bleu_from_stats", "bleu_sentence_stats"]
