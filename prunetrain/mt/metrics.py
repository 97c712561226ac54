"""Translation metrics as `metric(model) -> dict` callables, for pruning curves (`pruning_curve`,
`PruningCurveCallback(metric=...)`) and the studies."""

from __future__ import annotations

from typing import Sequence

from torch import nn

from prunetrain.methods.curve import Metric


def bleu_metric(tokenizer, pairs: Sequence[tuple[str, str]], *, batch_size: int = 64, num_beams: int = 1,
                autocast_bf16: bool = False, **generate_kwargs) -> Metric:
    """sacreBLEU (detokenized) of the model's translations of `pairs`; the metric returns `evaluate_bleu`'s dict
    (use `key="bleu"` / `metric_key="bleu"`).

    Args:
        tokenizer: the model's tokenizer.
        pairs: (source, reference) sentence pairs.
        batch_size: sentences per generate call.
        num_beams: 1 for greedy decoding, more for beam search.
        autocast_bf16: generate under bf16 autocast.
        **generate_kwargs: passed on to `generate`.
    """
    from prunetrain.mt.translation import evaluate_bleu

    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs: the BLEU metric needs at least one (source, reference) pair.")

    def metric(model: nn.Module) -> dict:
        if not hasattr(model, "generate"):
            raise ValueError(f"metric: 'bleu' needs a model that can generate; {type(model).__name__} cannot.")
        return evaluate_bleu(model, tokenizer, pairs, batch_size=batch_size, num_beams=num_beams,
                             autocast_bf16=autocast_bf16, **generate_kwargs)

    return metric


__all__ = ["bleu_metric"]
