"""Translation metrics as `metric(model) -> dict` callables, for pruning curves (`pruning_curve`,
`PruningCurveCallback(metric=...)`) and the studies."""

from __future__ import annotations

from typing import Sequence

from torch import nn

from prunetrain.methods.curve import Metric


def bleu_metric(tokenizer, pairs: Sequence[tuple[str, str]], *, batch_size: int = 64, num_beams: int = 1,
                autocast_bf16: bool = False, sentence_stats: bool = False, **generate_kwargs) -> Metric:
    """sacreBLEU (detokenized) of the model's translations of `pairs`; the metric returns `evaluate_bleu`'s dict
    (use `key="bleu"` / `metric_key="bleu"`).

    With `sentence_stats=True` the dict also holds BLEU's per-sentence statistics and the metric carries
    `score_from_stats` (`prunetrain.mt.evaluation.bleu_stats.bleu_from_stats`): the studies then test every ablation's change
    for significance (`prunetrain.methods.significance.paired_bootstrap`).

    Args:
        tokenizer: the model's tokenizer.
        pairs: (source, reference) sentence pairs.
        batch_size: sentences per generate call.
        num_beams: 1 for greedy decoding, more for beam search.
        autocast_bf16: generate under bf16 autocast.
        sentence_stats: also return per-sentence BLEU statistics (about 0.2 s per 1000 sentences).
        **generate_kwargs: passed on to `generate`.
    """
    from prunetrain.mt.evaluation.translation import evaluate_bleu

    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs: the BLEU metric needs at least one (source, reference) pair.")

    def metric(model: nn.Module) -> dict:
        if not hasattr(model, "generate"):
            raise ValueError(f"metric: 'bleu' needs a model that can generate; {type(model).__name__} cannot.")
        return evaluate_bleu(model, tokenizer, pairs, batch_size=batch_size, num_beams=num_beams,
                             autocast_bf16=autocast_bf16, sentence_stats=sentence_stats, **generate_kwargs)

    if sentence_stats:
        from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats

        metric.score_from_stats = bleu_from_stats
    return metric


__all__ = ["bleu_metric"]
