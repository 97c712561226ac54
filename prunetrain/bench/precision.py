"""Which precision and which attention kernel train a model fastest on this machine, measured.

Whether bf16 autocast pays depends on the machine *and* the model: on an AVX2-only CPU bf16 is emulated (~100× slower,
never measured here: `prunetrain.utils.device.bf16_is_fast` rules it out); on an AMD EPYC with AVX512-BF16 it trained
the main recipe's model 2–3× faster than fp32; on an Intel Xeon with AMX and AVX512-BF16 the same model trained 1.43×
*faster in fp32* (benchmarks/README.md k). The attention kernel differs the same way: on the EPYC, eager attention
trained the recipe's model 1.5× faster than sdpa (benchmarks/README.md f), while on a GPU sdpa's fused kernels are
the fast ones. So a recipe can ask for `train.precision: measure` and/or `model.attn_implementation: measure`: a few
real training steps with each candidate setting, on a throw-away copy of the model (its weights, the optimizer and
the random streams of the run are not touched), interleaved in rotating order, and the fastest (median seconds per
step) trains the run. Eager and sdpa compute the same function; the choice changes the speed, not the model.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Mapping, Sequence

import torch
from torch import nn

from prunetrain.utils.device import bf16_is_fast, device_of


def _native_precisions(device: torch.device) -> list[str]:
    """The precisions this hardware trains in natively: bf16 autocast only where it is fast, fp32 always."""
    return ["bf16", "fp32"] if bf16_is_fast(device) else ["fp32"]


def time_training(model: nn.Module, batches: Sequence[Mapping], precisions: Sequence[str] | None = None,
                  attentions: Sequence[str] | None = None, rounds: int = 3) -> dict:
    """Median seconds per training step (forward, backward, AdamW) of `model` on `batches` for every pair of a
    precision and an attention implementation, and the fastest pair.

    Args:
        model: the model to train (copied; the original is left exactly as it was).
        batches: real training batches (keyword inputs with `labels`), each step takes the next one.
        precisions: the precisions to time (default: every native one); bf16 where it is not native is never timed.
        attentions: the attention implementations to time (default: only the model's own).
        rounds: timed rounds after one warm-up round; each round runs every batch once per candidate.

    Returns:
        {"candidates": {"<precision> <attention>": s, ...} (empty when there is nothing to choose), "chosen":
         "bf16" | "fp32", "attention": the chosen implementation, "device": str, "steps_per_candidate": int}, and
        "why" when only one candidate was left.
    """
    device = device_of(model)
    own = model.config._attn_implementation
    attentions = list(dict.fromkeys(attentions or [own]))
    native = _native_precisions(device)
    wanted = list(dict.fromkeys(precisions or native))
    usable = [p for p in wanted if p in native] or ["fp32"]
    candidates = [(p, a) for p in usable for a in attentions]
    if len(candidates) == 1:
        why = ("bf16 is not native on this hardware (prunetrain.utils.device.bf16_is_fast)" if "bf16" in wanted
               and "bf16" not in native else "one precision and one attention implementation: nothing to time")
        return {"candidates": {}, "chosen": usable[0], "attention": attentions[0], "device": str(device),
                "steps_per_candidate": 0, "why": why}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        trial = copy.deepcopy(model).train()
        optimizer = torch.optim.AdamW(trial.parameters(), lr=1e-6)
        times: dict[tuple[str, str], list[float]] = {c: [] for c in candidates}
        for round_ in range(rounds + 1):
            shift = round_ % len(candidates)
            for precision, attention in candidates[shift:] + candidates[:shift]:
                trial.set_attn_implementation(attention)
                for batch in batches:
                    seconds = _step(trial, optimizer, batch, precision == "bf16", device)
                    if round_ > 0:  # the first round warms up every candidate's kernels
                        times[(precision, attention)].append(seconds)
        del trial, optimizer
    medians = {c: statistics.median(values) for c, values in times.items()}
    precision, attention = min(medians, key=medians.get)
    return {"candidates": {f"{p} {a}": s for (p, a), s in medians.items()}, "chosen": precision,
            "attention": attention, "device": str(device), "steps_per_candidate": len(times[candidates[0]])}


def _step(model: nn.Module, optimizer, batch: Mapping, bf16: bool, device: torch.device) -> float:
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


__all__ = ["time_training"]
