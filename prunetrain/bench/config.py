"""What `benchmark` measures and how: `BenchConfig`, four records (workload, calls, timing, report), every option
with a default and checked once in its record."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

import torch

from prunetrain.bench.timing import ORDERS
from prunetrain.utils.door import checked
from prunetrain.utils.validate import allowed_text, check_bool, check_choice, check_int, check_ints

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


@dataclass(frozen=True)
class BenchWorkload:
    """What the models are fed.

    Args:
        batch_sizes: batch sizes; every combination with `seq_lens` is measured.
        seq_lens: sequence lengths (the source length for seq2seq models and for generation).
        tgt_len: decoder length of the seq2seq `forward` task (default seq_len).
        inputs: `inputs(batch, seq_len) -> dict` to replace the random token inputs of `make_inputs`.
        seed: seed of the random inputs.
    """

    batch_sizes: Sequence[int] | int = (1, 8, 32, 64)
    seq_lens: Sequence[int] | int = (128,)
    tgt_len: int | None = None
    inputs: Callable[[int, int], Mapping[str, torch.Tensor]] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", _int_list("batch_sizes", self.batch_sizes))
        object.__setattr__(self, "seq_lens", _int_list("seq_lens", self.seq_lens))
        if self.tgt_len is not None:
            check_int("tgt_len", self.tgt_len, 1)
        check_int("seed", self.seed, 0)


@dataclass(frozen=True)
class BenchCalls:
    """What is timed.

    Args:
        forward: time `model(**inputs)` (under `torch.inference_mode`).
        generate: None, "greedy", "beam4" or a sequence of them: time `generate` with exactly `new_tokens` new
            tokens (min_new_tokens = max_new_tokens); throughput in new tokens/s (per sequence, not per beam).
        new_tokens: tokens each generation produces.
        dtype: "fp32", or "bf16" (autocast around every call of both models).
    """

    forward: bool = True
    generate: str | Sequence[str] | None = None
    new_tokens: int = 26
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPES)
        object.__setattr__(self, "generate", _generate_modes(self.generate))
        check_int("new_tokens", self.new_tokens, 1)
        object.__setattr__(self, "forward", check_bool("forward", self.forward))
        if not self.forward and not self.generate:
            raise ValueError("forward: False with generate=None leaves nothing to measure; allowed: forward=True "
                             f"and/or generate in {allowed_text(GENERATE_MODES)}.")


@dataclass(frozen=True)
class BenchTiming:
    """How the calls are timed.

    Args:
        warmup: untimed rounds (the first runs the FLOP counter and the memory profiler).
        repeats: timed rounds; each round runs every model once, interleaved (`order`).
        order: "abba" (the order rotates every round) or "abab".
        device: where the models run (default CUDA when available, else CPU).
        threads: `torch.set_num_threads` for the run (default: leave as is); the count used is recorded.
    """

    warmup: int = 1
    repeats: int = 10
    order: str = "abba"
    device: str | torch.device | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        check_choice("order", self.order, ORDERS)
        check_int("warmup", self.warmup, 0)
        check_int("repeats", self.repeats, 1)
        if self.threads is not None:
            check_int("threads", self.threads, 1)


@dataclass(frozen=True)
class BenchReport:
    """What the result names and measures besides time.

    Args:
        label_a: the baseline's label.
        label_b: the variant's label when `model_b` is one model.
        flops: count matmul FLOPs of one call per model (FlopCounterMode) and the FLOP-ideal speedup.
        memory: measure peak memory of one call per model (see `peak_memory`).
    """

    label_a: str = "original"
    label_b: str = "pruned"
    flops: bool = True
    memory: bool = True

    def __post_init__(self) -> None:
        for name in ("label_a", "label_b"):
            label = getattr(self, name)
            if not isinstance(label, str) or not label.strip():
                raise ValueError(f"{name}: {label!r} is not allowed; expected a non-empty label (str).")
        for name in ("flops", "memory"):
            object.__setattr__(self, name, check_bool(name, getattr(self, name)))


GROUPS = {"workload": BenchWorkload, "calls": BenchCalls, "timing": BenchTiming, "report": BenchReport}
FIELD_ORDER = ("batch_sizes", "seq_lens", "tgt_len", "inputs", "dtype", "forward", "generate", "new_tokens", "warmup",
               "repeats", "order", "device", "threads", "label_a", "label_b", "flops", "memory", "seed")
"""Every option of `benchmark`, in the order `BenchConfig.to_dict` lists them (the order they always had)."""
_GROUP_OF = {f.name: name for name, cls in GROUPS.items() for f in fields(cls)}


@checked(own=("workload", "calls", "timing", "report"))
@dataclass(init=False)
class BenchConfig:
    """What `benchmark` measures and how, in four records: `workload` (`BenchWorkload`: batch sizes, lengths,
    inputs, seed), `calls` (`BenchCalls`: forward and/or generation, new tokens, dtype), `timing` (`BenchTiming`:
    warmup, repeats, order, device, threads) and `report` (`BenchReport`: labels, FLOPs, memory). Every option
    has a default and is checked once, in its record.

        BenchConfig(timing=BenchTiming(repeats=20), calls=BenchCalls(generate="greedy"))
        BenchConfig(repeats=20, generate="greedy")          # the same: any option by its own name

    Every option is also read by its own name (`config.repeats`), and `benchmark(a, b, repeats=20)` overrides one.

    Args:
        workload, calls, timing, report: the records (default: their defaults).
        **options: options by name (`FIELD_ORDER`), each going into its record; not with that record given.
    """

    workload: BenchWorkload
    calls: BenchCalls
    timing: BenchTiming
    report: BenchReport

    def __init__(self, workload: BenchWorkload | None = None, calls: BenchCalls | None = None,
                 timing: BenchTiming | None = None, report: BenchReport | None = None, **options: Any):
        given = {"workload": workload, "calls": calls, "timing": timing, "report": report}
        unknown = [k for k in options if k not in _GROUP_OF]
        if unknown:
            raise ValueError(f"{unknown[0]}: not an option of benchmark; the options are {', '.join(FIELD_ORDER)}.")
        for name, cls in GROUPS.items():
            named = {k: v for k, v in options.items() if _GROUP_OF[k] == name}
            record = given[name]
            if record is not None and not isinstance(record, cls):
                raise ValueError(f"{name}: {record!r} is not a {cls.__name__}; pass {name}={cls.__name__}(...).")
            if record is not None and named:
                raise ValueError(f"{name}: give either {name}={cls.__name__}(...) or the options "
                                 f"{', '.join(named)} by name, not both.")
            setattr(self, name, record if record is not None else cls(**named))

    def __getattr__(self, name: str):
        """An option by its own name (`config.repeats` is `config.timing.repeats`)."""
        group = _GROUP_OF.get(name)
        if group is None or group not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.__dict__[group], name)

    @property
    def tasks(self) -> list[str]:
        return (["forward"] if self.calls.forward else []) + list(self.calls.generate)

    def to_dict(self) -> dict[str, Any]:
        """Every option by name, in `FIELD_ORDER` (one flat record, as results and study journals hold it)."""
        return {name: getattr(self, name) for name in FIELD_ORDER}

    def replace(self, **options: Any) -> "BenchConfig":
        """A copy with `options` (by name) replacing fields; an unknown option is refused."""
        unknown = [k for k in options if k not in _GROUP_OF]
        if unknown:
            raise ValueError(f"{unknown[0]}: not an option of benchmark; the options are {', '.join(FIELD_ORDER)}.")
        records = {}
        for name in GROUPS:
            named = {k: v for k, v in options.items() if _GROUP_OF[k] == name}
            records[name] = dataclasses.replace(getattr(self, name), **named) if named else getattr(self, name)
        return BenchConfig(**records)

    @classmethod
    def with_options(cls, config: "BenchConfig | None", options: Mapping[str, Any]) -> "BenchConfig":
        """`config` (default: the defaults) with `options` replacing fields; an unknown option is refused."""
        base = config if config is not None else cls()
        return base.replace(**options) if options else base


__all__ = ["DTYPES", "FIELD_ORDER", "GENERATE_MODES", "BenchCalls", "BenchConfig", "BenchReport", "BenchTiming",
           "BenchWorkload"]
