"""A/B speed benchmarks of an original model against pruned (shrunk) versions of it.

`benchmark(model_a, model_b, ...)` times the same calls on both models on the same inputs and reports, per
(task, batch size, sequence length):

- latency (median and inter-quartile range of the per-call wall time) and throughput (tokens/s, sequences/s);
  tasks are `forward` and, for models that generate, `greedy` / `beam4` generation with a *forced* number of new
  tokens (`min_new_tokens = max_new_tokens`), so both models produce sequences of the same length;
- the **measured speedup** as the ratio of medians `median_a / median_b` and as the median of per-pair ratios;
- matmul FLOPs of one call of each model (`prunetrain.bench.flops`, exact for matmuls) and the **FLOP-ideal speedup**
  `flops_a / flops_b`; `efficiency` = measured / ideal speedup;
- parameter counts and bytes, attention heads, and a peak-memory figure (see `peak_memory`: on CUDA from the
  allocator's peak, on CPU an estimate from torch.profiler allocation events, labelled as such);
- the settings that matter for reading the numbers: thread count, device, dtype, warm-up, repeats, versions.

Runs are **interleaved**: every round runs each model once, and the order rotates from round to round
(`order="abba"`: AB, BA, AB, ...; `"abab"`: AB, AB, ...), so slow drifts of a shared machine hit both models alike
and cancel in the ratio. The executed order is recorded in the result.

`model_b` may also be a mapping `{label: model}` of several variants: they are all interleaved with the one
baseline (A, B1, B2, ... rotated each round) and each gets its own rows.

`run_bench(path_a, path_b, ...)` is the same from two saved model directories (`prunetrain.save_pruned` output or
any Hugging Face `save_pretrained` directory); it is what a `prunetrain bench` command calls.

This module holds those entry points; the parts live beside it, by what they measure: `timing` (the interleaved
loop and its statistics), `cases` (inputs and the measured cases), `profiling` (memory and op breakdowns), `report`
(FLOP-ideal columns, `BenchResult`, the table), `config` (`BenchConfig`) and `environment` (machine and load). Their
names stay importable from here.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch
from torch import nn

from prunetrain.bench.cases import BenchCase, bench_case, can_generate, check_compatible, make_inputs, param_info
from prunetrain.bench.config import DTYPES, GENERATE_MODES, BenchConfig
from prunetrain.bench.environment import environment, loadavg, torch_threads
from prunetrain.bench.profiling import MATMUL_OPS, breakdown_table, op_breakdown, peak_memory
from prunetrain.bench.report import JSON_FORMAT, BenchResult, format_table
from prunetrain.bench.timing import ORDERS, Alternation, alternate, compare_times, summarize
from prunetrain.utils.device import default_device
from prunetrain.utils.door import checked

__all__ = [
    "DTYPES",
    "GENERATE_MODES",
    "ORDERS",
    "Alternation",
    "BenchConfig",
    "BenchResult",
    "alternate",
    "benchmark",
    "breakdown_table",
    "compare_times",
    "load_model",
    "make_inputs",
    "op_breakdown",
    "peak_memory",
    "run_bench",
    "summarize",
]
# also importable from here as before the split: JSON_FORMAT, MATMUL_OPS, format_table


@checked
def benchmark(model_a: nn.Module, model_b: nn.Module | Mapping[str, nn.Module], config: BenchConfig | None = None,
              *, progress: Callable[[str], Any] | None = None, **options) -> BenchResult:
    """Compare `model_a` (the original) with `model_b` (a pruned / shrunk model, or `{label: model}` variants).

    The models are moved to the configured device and put in eval mode.

    Args:
        model_a: the baseline.
        model_b: one model or `{label: model}` variants, all interleaved with the baseline.
        config: what to measure (`BenchConfig`); default `BenchConfig()`.
        progress: called with one line per measured case.
        **options: `BenchConfig` fields overriding `config` (e.g. `repeats=20`).

    Returns:
        A `BenchResult` (rows per variant, task, batch size and length; the settings in `meta`).
    """
    config = BenchConfig.with_options(config, options)
    if not isinstance(model_a, nn.Module):
        raise ValueError(f"model_a: expected a torch.nn.Module, got {type(model_a).__name__}.")
    variants = dict(model_b) if isinstance(model_b, Mapping) else {config.label_b: model_b}
    if not variants:
        raise ValueError("model_b: empty mapping; expected a model or {label: model}.")
    if config.label_a in variants:
        raise ValueError(f"label_a: {config.label_a!r} is also a label of model_b; labels must differ.")
    for label, m in variants.items():
        if not isinstance(m, nn.Module):
            raise ValueError(f"model_b[{label!r}]: expected a torch.nn.Module, got {type(m).__name__}.")
        check_compatible(model_a, m, label)
    for mode in config.generate:
        for label, m in [(config.label_a, model_a), *variants.items()]:
            if not can_generate(m):
                raise ValueError(f"generate: {mode!r} needs models that can generate, but {label!r} "
                                 f"({type(m).__name__}) cannot; use generate=None.")

    dev = torch.device(config.device) if config.device is not None else default_device()
    models = {config.label_a: model_a, **variants}
    for m in models.values():
        m.to(dev).eval()
    say = progress or (lambda msg: None)

    with torch_threads(config.threads):
        meta = _bench_meta(config, dev, list(variants))
        info = {label: param_info(m) for label, m in models.items()}
        rows: list[dict] = []
        for task in config.tasks:
            for batch in config.batch_sizes:
                for seq_len in config.seq_lens:
                    say(f"{task} batch={batch} seq_len={seq_len}")
                    rows.extend(bench_case(models, BenchCase(task, batch, seq_len), config, dev, info))
        meta["loadavg_after"] = loadavg()
        meta["memory_method"] = next((r["memory_a"]["method"] for r in rows if r.get("memory_a")), None)
    return BenchResult(meta=meta, models=info, rows=rows)


def _bench_meta(config: BenchConfig, dev: torch.device, variants: list[str]) -> dict:
    return {
        **environment(dev),
        "dtype": config.dtype,
        "warmup": config.warmup,
        "repeats": config.repeats,
        "order": config.order,
        "baseline": config.label_a,
        "variants": variants,
        "tasks": config.tasks,
        "batch_sizes": list(config.batch_sizes),
        "seq_lens": list(config.seq_lens),
        "tgt_len": config.tgt_len,
        "new_tokens": config.new_tokens if config.generate else None,
        "timer": "time.perf_counter wall time per call" + (" with cuda synchronize" if dev.type == "cuda" else ""),
        "flops": "matmul FLOPs of one call, torch FlopCounterMode + CPU sdpa (prunetrain.bench.flops)"
                 if config.flops else None,
        "seed": config.seed,
        "warmup_note": "the first warm-up round runs each model once under the FLOP counter and the memory "
                       "profiler (untimed); the other warm-up rounds are plain, interleaved like the timed ones",
    }


# ----------------------------------------------------------------------------------------------------------------
# saved models
# ----------------------------------------------------------------------------------------------------------------
def load_model(path: str | os.PathLike, attn_implementation: str | None = None,
               device: str | torch.device | None = None) -> nn.Module:
    """A model from a directory (`prunetrain.engine.model_dir.load_model_dir`: checked file by file, then
    `load_pruned` for a prunetrain layout, else the Hugging Face class its config names).

    Args:
        path: a model directory.
        attn_implementation: attention backend (None: transformers' default).
        device: where the model goes.
    """
    from prunetrain.engine.model_dir import load_model_dir

    return load_model_dir(path, attn_implementation=attn_implementation, device=device, argument="path")


def run_bench(
    path_a: str | os.PathLike,
    path_b: str | os.PathLike,
    *,
    attn_implementation: str | None = None,
    json_path: str | os.PathLike | None = None,
    print_table: bool = False,
    **kwargs,
) -> BenchResult:
    """Benchmark two saved models (original, pruned): what the `prunetrain bench A B` command runs.

    `attn_implementation` ('sdpa', 'eager', ...) is set on both models; the other keyword arguments are those of
    `benchmark` (batch_sizes, seq_lens, dtype, generate, new_tokens, warmup, repeats, device, threads, ...).
    The result is written to `json_path` when given, and its table printed when `print_table`.

    Args:
        path_a: the original model's directory.
        path_b: the pruned model's directory.
        attn_implementation: attention backend for both models.
        json_path: write the result here.
        print_table: print the result's table.
        **kwargs: `BenchConfig` options.
    """
    model_a = load_model(path_a, attn_implementation)
    model_b = load_model(path_b, attn_implementation)
    kwargs.setdefault("label_a", "A")
    kwargs.setdefault("label_b", "B")
    result = benchmark(model_a, model_b, **kwargs)
    result.meta["paths"] = {kwargs["label_a"]: str(path_a), kwargs["label_b"]: str(path_b)}
    if json_path is not None:
        result.to_json(json_path)
    if print_table:
        print(result.table())
    return result
