"""Paired bootstrap significance (Michel et al. 2019 mark Table 1's significant changes at p < 0.01) on real
sacreBLEU scores of real Multi30k sentences: per-sentence statistics reproduce corpus BLEU exactly, a resample is
literally a resample of sentences, and the p-value equals a direct (slow) computation from resampled text."""

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from prunetrain.methods.significance import paired_bootstrap, resample_counts
from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats, bleu_sentence_stats
from prunetrain.mt.text.data import read_parallel


@pytest.fixture(scope="module")
def references(multi30k_dir):
    return [t for _, t in read_parallel(multi30k_dir, "test", limit=300)]


def _drop_last_word(references, every, offset=0, words=1):
    return [" ".join(r.split()[:-words]) if i % every == offset else r for i, r in enumerate(references)]


def test_summed_sentence_statistics_give_sacrebleu_corpus_bleu_exactly(references):
    systems = {
        "half shortened": _drop_last_word(references, 2),
        "shuffled words": [" ".join(reversed(r.split())) for r in references],  # few 4-gram matches
        "with empty lines": ["" if i % 5 == 0 else r for i, r in enumerate(references)],
        "one word each": [r.split()[0] for r in references],  # no 4-gram matches: exp smoothing is used
    }
    for name, hypotheses in systems.items():
        stats = np.array(bleu_sentence_stats(hypotheses, references))
        assert stats.shape == (len(references), 10)
        assert bleu_from_stats(stats.sum(0)) == BLEU().corpus_score(hypotheses, [references]).score, name


def test_a_resample_is_the_corpus_bleu_of_the_resampled_sentences(references):
    hypotheses = _drop_last_word(references, 3)
    stats = np.array(bleu_sentence_stats(hypotheses, references))
    counts = resample_counts(len(references), 4, seed=3)
    assert counts.shape == (4, len(references)) and (counts.sum(1) == len(references)).all()
    assert len({tuple(c) for c in counts}) == 4  # four different resamples
    for row in counts:
        chosen = [i for i, n in enumerate(row) for _ in range(n)]
        direct = BLEU().corpus_score([hypotheses[i] for i in chosen], [[references[i] for i in chosen]]).score
        assert bleu_from_stats(row @ stats) == pytest.approx(direct, abs=1e-9)


def test_p_value_equals_a_direct_computation_on_resampled_text(references):
    base, other = _drop_last_word(references, 4), _drop_last_word(references, 4, offset=1, words=2)
    samples, seed = 60, 7
    p = paired_bootstrap(bleu_sentence_stats(base, references), bleu_sentence_stats(other, references),
                         bleu_from_stats, samples=samples, seed=seed)
    # the same equation, from sacreBLEU on resampled sentence lists (no statistics)
    observed = BLEU().corpus_score(other, [references]).score - BLEU().corpus_score(base, [references]).score
    extreme = 0
    for row in resample_counts(len(references), samples, seed):
        chosen = [i for i, n in enumerate(row) for _ in range(n)]
        refs = [[references[i] for i in chosen]]
        delta = (BLEU().corpus_score([other[i] for i in chosen], refs).score
                 - BLEU().corpus_score([base[i] for i in chosen], refs).score)
        extreme += abs(delta - observed) >= abs(observed) - 1e-9
    assert p == pytest.approx((1 + extreme) / (samples + 1), abs=1e-12)


def test_p_values_separate_noise_from_real_differences(references):
    base = bleu_sentence_stats(references, references)
    assert paired_bootstrap(base, base, bleu_from_stats) == 1.0  # identical systems
    much_worse = bleu_sentence_stats(_drop_last_word(references, 1, words=2), references)
    assert paired_bootstrap(base, much_worse, bleu_from_stats) == pytest.approx(1 / 1001)  # never crosses 0
    one_sentence = bleu_sentence_stats(_drop_last_word(references, len(references)), references)
    assert paired_bootstrap(base, one_sentence, bleu_from_stats) > 0.2  # one short sentence in 300 is noise
    # deterministic for a seed, symmetric in the two systems
    some = bleu_sentence_stats(_drop_last_word(references, 7), references)
    assert paired_bootstrap(base, some, bleu_from_stats, seed=1) == paired_bootstrap(base, some, bleu_from_stats,
                                                                                     seed=1)
    assert paired_bootstrap(base, some, bleu_from_stats) == paired_bootstrap(some, base, bleu_from_stats)


def test_bad_input_is_refused_in_one_sentence(references):
    stats = bleu_sentence_stats(references[:5], references[:5])
    with pytest.raises(ValueError, match=r"need two equal-shaped \(sentences, statistics\) arrays, got \(5, 10\) "
                                         r"and \(4, 10\)"):
        paired_bootstrap(stats, stats[:4], bleu_from_stats)
    with pytest.raises(ValueError, match=r"samples: 0 is not allowed; expected a positive integer"):
        paired_bootstrap(stats, stats, bleu_from_stats, samples=0)
    with pytest.raises(ValueError, match=r"bleu_sentence_stats: 2 hypotheses but 1 references"):
        bleu_sentence_stats(["a", "b"], ["a"])
    with pytest.raises(ValueError, match=r"bleu_from_stats: expected 10 summed statistics, got 3"):
        bleu_from_stats([1, 2, 3])
