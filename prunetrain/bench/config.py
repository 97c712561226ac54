"""What `benchmark` measures and how: `BenchConfig` (every field has a default and is checked once)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Sequence

import torch

from prunetrain.bench.timing import ORDERS
from prunetrain.utils.validate import allowed_text, check_choice, check_int, check_ints

DTYPES = ("fp32", "bf16")
"""`fp32`: plain float32. `bf16`: `torch.autocast(dtype=torch.bfloat16)` around every call of both models."""

GENERATE_MODES = ("greedy", "beam4")


def _int_list(name: str, values: Any) -> tuple[int, ...]:
    """One int or a sequence of ints >= 1."""
    if isinstance(values, int) and not isinstance(values, bool):
        values = (values,)
    return check_ints(name, values, 1)


def _generate_modes(generate: Any) -> tuple[str, ...]:
    if generate is None:
        return ()
    modes = (generate,) if isinstance(generate, str) else tuple(generate)
    for mode in modes:
        if mode not in GENERATE_MODES:
            raise ValueError(f"generate: {mode!r} is not one of None, {allowed_text(GENERATE_MODES)} "
                             f"(or a sequence of them).")
    return modes


@dataclass
class BenchConfig:
    """What `benchmark` measures and how (every field has a default; `benchmark(a, b, repeats=20)` overrides one).

    Args:
        batch_sizes: batch sizes; every combination with `seq_lens` is measured.
        seq_lens: sequence lengths (the source length for seq2seq models and for generation).
        tgt_len: decoder length of the seq2seq `forward` task (default seq_len).
        inputs: `inputs(batch, seq_len) -> dict` to replace the random token inputs of `make_inputs`.
        dtype: "fp32", or "bf16" (autocast around every call of both models).
        forward: time `model(**inputs)` (under `torch.inference_mode`).
        generate: None, "greedy", "beam4" or a sequence of them: time `generate` with exactly `new_tokens` new
            tokens (min_new_tokens = max_new_tokens); throughput in new tokens/s (per sequence, not per beam).
        new_tokens: tokens each generation produces.
        warmup: untimed rounds (the first runs the FLOP counter and the memory profiler).
        repeats: timed rounds; each round runs every model once, interleaved (`order`).
        order: "abba" (the order rotates every round) or "abab".
        device: where the models run (default CUDA when available, else CPU).
        threads: `torch.set_num_threads` for the run (default: leave as is); the count used is recorded.
        label_a: the baseline's label.
        label_b: the variant's label when `model_b` is one model.
        flops: count matmul FLOPs of one call per model (FlopCounterMode) and the FLOP-ideal speedup.
        memory: measure peak memory of one call per model (see `peak_memory`).
        seed: seed of the random inputs.
    """

    batch_sizes: Sequence[int] | int = (1, 8, 32, 64)
    seq_lens: Sequence[int] | int = (128,)
    tgt_len: int | None = None
    inputs: Callable[[int, int], Mapping[str, torch.Tensor]] | None = None
    dtype: str = "fp32"
    forward: bool = True
    generate: str | Sequence[str] | None = None
    new_tokens: int = 26
    warmup: int = 1
    repeats: int = 10
    order: str = "abba"
    device: str | torch.device | None = None
    threads: int | None = None
    label_a: str = "original"
    label_b: str = "pruned"
    flops: bool = True
    memory: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        self.batch_sizes = _int_list("batch_sizes", self.batch_sizes)
        self.seq_lens = _int_list("seq_lens", self.seq_lens)
        check_choice("dtype", self.dtype, DTYPES)
        self.generate = _generate_modes(self.generate)
        check_choice("order", self.order, ORDERS)
        check_int("warmup", self.warmup, 0)
        check_int("repeats", self.repeats, 1)
        check_int("new_tokens", self.new_tokens, 1)
        if self.tgt_len is not None:
            check_int("tgt_len", self.tgt_len, 1)
        if self.threads is not None:
            check_int("threads", self.threads, 1)
        if not self.forward and not self.generate:
            raise ValueError("forward: False with generate=None leaves nothing to measure; allowed: forward=True "
                             f"and/or generate in {allowed_text(GENERATE_MODES)}.")

    @property
    def tasks(self) -> list[str]:
        return (["forward"] if self.forward else []) + list(self.generate)

    @classmethod
    def with_options(cls, config: "BenchConfig | None", options: Mapping[str, Any]) -> "BenchConfig":
        """`config` (default: the defaults) with `options` replacing fields; an unknown option is refused."""
        known = [f.name for f in fields(cls)]
        unknown = [k for k in options if k not in known]
        if unknown:
            raise ValueError(f"{unknown[0]}: not an option of benchmark; the options are {', '.join(known)}.")
        base = config if config is not None else cls()
        return replace(base, **options) if options else base


__all__ = ["DTYPES", "GENERATE_MODES", "BenchConfig"]
