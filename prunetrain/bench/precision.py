"""Which precision trains a model fastest on this machine, measured: bf16 autocast against fp32.

Whether bf16 autocast pays depends on the machine *and* the model: on an AVX2-only CPU bf16 is emulated (~100× slower,
never measured here: `prunetrain.utils.device.bf16_is_fast` rules it out); on an AMD EPYC with AVX512-BF16 it trained
the main recipe's model 2–3× faster than fp32; on an Intel Xeon with AMX and AVX512-BF16 the same model trained 1.43×
*faster in fp32* (benchmarks/README.md k). So a recipe can ask for `train.precision: measure`: a few real training
steps in each precision, on a throw-away copy of the model (its weights, the optimizer and the random streams of the
run are not touched), interleaved in rotating order, and the faster one (median seconds per step) trains the run.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Mapping, Sequence

import torch
from torch import nn

from prunetrain.utils.device import bf16_is_fast, device_of


def time_precisions(model: nn.Module, batches: Sequence[Mapping], rounds: int = 3) -> dict:
    """Median seconds per training step (forward, backward, AdamW) of `model` on `batches` in each precision the
    hardware runs natively, and the fastest.

    Args:
        model: the model to train (copied; the original is left exactly as it was).
        batches: real training batches (keyword inputs with `labels`), each step takes the next one.
        rounds: timed rounds after one warm-up round; each round runs every batch once per precision.

    Returns:
        {"candidates": {"bf16": s, "fp32": s} (only "fp32" where bf16 is not native), "chosen": "bf16" | "fp32",
         "device": str, "steps_per_precision": int}.
    """
    device = device_of(model)
    candidates = ["bf16", "fp32"] if bf16_is_fast(device) else ["fp32"]
    if len(candidates) == 1:
        return {"candidates": {}, "chosen": "fp32", "device": str(device), "steps_per_precision": 0,
                "why": "bf16 is not native on this hardware (prunetrain.utils.device.bf16_is_fast)"}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        trial = copy.deepcopy(model).train()
        optimizer = torch.optim.AdamW(trial.parameters(), lr=1e-6)
        times: dict[str, list[float]] = {name: [] for name in candidates}
        for round_ in range(rounds + 1):
            for name in candidates[round_ % 2:] + candidates[: round_ % 2]:
                for batch in batches:
                    seconds = _step(trial, optimizer, batch, name == "bf16", device)
                    if round_ > 0:  # the first round warms up both precisions' kernels
                        times[name].append(seconds)
        del trial, optimizer
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {"candidates": medians, "chosen": min(medians, key=medians.get), "device": str(device),
            "steps_per_precision": len(times["fp32"])}


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


__all__ = ["time_precisions"]
