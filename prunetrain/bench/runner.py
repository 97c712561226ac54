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
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from prunetrain.bench.flops import count_flops
from prunetrain.utils.device import default_device, device_of
from prunetrain.utils.validate import allowed_text, check_choice, check_int, check_ints

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

DTYPES = ("fp32", "bf16")
"""`fp32`: plain float32. `bf16`: `torch.autocast(dtype=torch.bfloat16)` around every call of both models."""

GENERATE_MODES = ("greedy", "beam4")
ORDERS = ("abba", "abab")
JSON_FORMAT = "prunetrain.BenchResult/1"


# ----------------------------------------------------------------------------------------------------------------
# argument checking
# ----------------------------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------------------------
# statistics and interleaved timing
# ----------------------------------------------------------------------------------------------------------------
def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summarize(values: Sequence[float]) -> dict:
    """Median, quartiles, IQR, min, max and n of a list of measurements."""
    if not values:
        raise ValueError("values: empty; expected at least one measurement.")
    s = sorted(float(v) for v in values)
    q1, q3 = _quantile(s, 0.25), _quantile(s, 0.75)
    return {"n": len(s), "median": statistics.median(s), "q1": q1, "q3": q3, "iqr": q3 - q1,
            "min": s[0], "max": s[-1]}


def compare_times(times_a: Sequence[float], times_b: Sequence[float]) -> dict:
    """Speedup of B over A from paired times (pair i = round i): ratio of medians (the headline), median and
    quartiles of the per-pair ratios, and the ratio of minima (other processes only ever add time, so on a shared
    machine the fastest run of each is the least disturbed one; with few runs it is itself noisy)."""
    if len(times_a) != len(times_b) or not times_a:
        raise ValueError(f"times_a, times_b: need the same non-zero number of paired runs, got "
                         f"{len(times_a)} and {len(times_b)}.")
    pair = [a / b for a, b in zip(times_a, times_b)]
    ps = summarize(pair)
    return {
        "speedup": statistics.median(times_a) / statistics.median(times_b),
        "speedup_min": min(times_a) / min(times_b),
        "speedup_pair_median": ps["median"],
        "speedup_pair_q1": ps["q1"],
        "speedup_pair_q3": ps["q3"],
        "speedup_pairs": pair,
    }


def _ideal_columns(speedup: float, pair_speedup: float, ideal: float | None) -> dict:
    """Measured vs FLOP-ideal: `efficiency` (speedup / ideal speedup) and `saving_efficiency` (time saved / ideal)."""
    if not ideal:
        return {"efficiency": None, "efficiency_pair": None, "saving_efficiency": None}
    ideal_saving = 1.0 - 1.0 / ideal
    return {
        "efficiency": speedup / ideal,
        "efficiency_pair": pair_speedup / ideal,
        "saving_efficiency": (1.0 - 1.0 / speedup) / ideal_saving if abs(ideal_saving) > 1e-12 else None,
    }


@dataclass
class Alternation:
    """Wall times of interleaved runs: `times[label]` (one per timed round) and the executed order of each round."""

    labels: list[str]
    times: dict[str, list[float]]
    order: list[list[str]]
    warmup_order: list[list[str]]
    cpu_times: dict[str, list[float]] = field(default_factory=dict)

    def order_string(self) -> str:
        """The executed order, one group per round, arms as letters in label order: `AB BA AB` (A = first label)."""
        letter = {label: chr(ord("A") + i) if i < 26 else f"[{label}]" for i, label in enumerate(self.labels)}
        return " ".join("".join(letter[label] for label in r) for r in self.order)


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(
    fns: Mapping[str, Callable[[], Any]],
    warmup: int = 1,
    repeats: int = 5,
    order: str = "abba",
    device: torch.device | str | None = None,
    between: Callable[[], Any] | None = None,
) -> Alternation:
    """Time several callables interleaved: `warmup` untimed rounds, then `repeats` timed rounds.

    Every round calls each function once. With `order="abba"` round r runs the labels rotated by r (two arms: AB,
    BA, AB, ...; three: ABC, BCA, CAB, ...) so that no arm is always first; `"abab"` keeps one order. Wall time
    (`time.perf_counter`) around each call, with CUDA synchronisation when `device` is a CUDA device; the process
    CPU time of the call (`time.process_time`, all threads) is recorded too: on a shared machine `cpu / wall`
    below the thread count shows the call did not have the cores to itself. `between()` (untimed) runs before
    every call, e.g. to reset state.

    Args:
        fns: label -> callable without arguments.
        warmup: untimed rounds.
        repeats: timed rounds.
        order: "abba" (rotate every round) or "abab".
        device: synchronise this CUDA device around each call.
        between: untimed callable run before every call.
    """
    check_choice("order", order, ORDERS)
    warmup = check_int("warmup", warmup, 0)
    repeats = check_int("repeats", repeats, 1)
    if not fns:
        raise ValueError("fns: empty; expected at least one callable.")
    labels = list(fns)
    dev = torch.device(device) if device is not None else None
    times: dict[str, list[float]] = {label: [] for label in labels}
    cpu_times: dict[str, list[float]] = {label: [] for label in labels}
    rounds: list[list[str]] = []
    warm: list[list[str]] = []
    gc_was_enabled = gc.isenabled()
    try:
        for r in range(warmup + repeats):
            timed_index = r - warmup if r >= warmup else r  # timed rounds start with the given order
            k = timed_index % len(labels) if order == "abba" else 0
            round_labels = labels[k:] + labels[:k]
            gc.collect()  # once per round; the collector is off during each timed call
            for label in round_labels:
                if between is not None:
                    between()
                gc.disable()
                _sync(dev)
                cpu_start = time.process_time()
                start = time.perf_counter()
                fns[label]()
                _sync(dev)
                elapsed = time.perf_counter() - start
                cpu = time.process_time() - cpu_start
                if gc_was_enabled:
                    gc.enable()
                if r >= warmup:
                    times[label].append(elapsed)
                    cpu_times[label].append(cpu)
            (warm if r < warmup else rounds).append(round_labels)
    finally:
        if gc_was_enabled:
            gc.enable()
    return Alternation(labels=labels, times=times, order=rounds, warmup_order=warm, cpu_times=cpu_times)


# ----------------------------------------------------------------------------------------------------------------
# models, inputs, memory
# ----------------------------------------------------------------------------------------------------------------
def _text_config(model: nn.Module):
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _is_seq2seq(model: nn.Module) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def _can_generate(model: nn.Module) -> bool:
    can = getattr(model, "can_generate", None)
    return bool(can()) if callable(can) else hasattr(model, "generate")


def make_inputs(model: nn.Module, batch: int, seq_len: int, tgt_len: int | None = None, seed: int = 0,
                device: torch.device | str | None = None, for_generate: bool = False) -> dict[str, torch.Tensor]:
    """Random token inputs of shape `[batch, seq_len]` (no padding) for `model`.

    Ids are drawn from `[4, vocab_size)` to avoid the usual special tokens. Seq2seq models also get
    `decoder_input_ids` of length `tgt_len` (default `seq_len`) unless `for_generate`.

    Args:
        model: the model (its config gives the vocabulary).
        batch: sequences.
        seq_len: tokens per sequence.
        tgt_len: decoder length for seq2seq models (default seq_len).
        seed: the generator's seed.
        device: where the tensors go.
        for_generate: leave out decoder inputs (generation makes its own).
    """
    check_int("batch", batch, 1)
    check_int("seq_len", seq_len, 1)
    vocab = int(getattr(_text_config(model), "vocab_size"))
    low = 4 if vocab > 8 else 0
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, vocab, (batch, seq_len), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if _is_seq2seq(model) and not for_generate:
        t = tgt_len or seq_len
        inputs["decoder_input_ids"] = torch.randint(low, vocab, (batch, t), generator=gen)
    if device is not None:
        inputs = {k: v.to(device) for k, v in inputs.items()}
    return inputs


def _param_info(model: nn.Module) -> dict:
    params = list(model.parameters())
    buffers = list(model.buffers())
    info = {
        "class": type(model).__name__,
        "params": int(sum(p.numel() for p in params)),
        "param_bytes": int(sum(p.numel() * p.element_size() for p in params)),
        "buffer_bytes": int(sum(b.numel() * b.element_size() for b in buffers)),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "heads": None,
        "heads_summary": None,
    }
    try:
        from prunetrain.engine.heads import find_heads

        layout = find_heads(model)
        info["heads"] = layout.total_heads
        info["heads_summary"] = layout.summary()
    except (ValueError, AttributeError):
        pass
    return info


def peak_memory(fn: Callable[[], Any], model: nn.Module, device: torch.device | str | None = None) -> dict:
    """Peak memory of one call `fn()` of `model`, and how it was obtained.

    - CUDA: the model's own parameter+buffer bytes plus `torch.cuda.max_memory_allocated() - memory_allocated()`
      before the call (so another model on the same GPU does not count).
    - CPU: an *estimate*, the model's parameter+buffer bytes plus the peak of live bytes allocated during the call,
      reconstructed from torch.profiler memory events (allocations and frees of torch's CPU allocator in time order).
      Buffers that oneDNN/BLAS allocate outside torch's allocator are not seen; process RSS is not used (it is
      process-wide, so useless for an A/B comparison).
    """
    dev = torch.device(device) if device is not None else device_of(model)
    static = sum(p.numel() * p.element_size() for p in model.parameters())
    static += sum(b.numel() * b.element_size() for b in model.buffers())
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - before
        return {"peak_bytes": int(static + peak), "activation_bytes": int(peak), "static_bytes": int(static),
                "method": "cuda max_memory_allocated (own params+buffers + peak allocated during the call)"}
    if dev.type != "cpu":
        return {"peak_bytes": None, "activation_bytes": None, "static_bytes": int(static),
                "method": f"n/a on {dev.type}"}
    from torch.profiler import ProfilerActivity, profile

    method = ("cpu estimate: own params+buffers + peak live bytes allocated during the call (allocation events of "
              "torch's CPU allocator recorded by torch.profiler)")
    try:
        from torch._C._profiler import _EventType

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        allocations = []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
                allocations.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
            stack.extend(node.children)
    except Exception as exc:  # private profiler API: report n/a rather than a wrong number
        return {"peak_bytes": None, "activation_bytes": None, "static_bytes": int(static),
                "method": f"n/a (profiler allocation events unavailable: {type(exc).__name__})"}
    allocations.sort()
    live = peak = 0
    for _, size in allocations:  # size < 0 for frees
        live += size
        peak = max(peak, live)
    return {"peak_bytes": int(static + peak), "activation_bytes": int(peak), "static_bytes": int(static),
            "method": method}


MATMUL_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation")


def _op_category(name: str) -> str:
    if name in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "fused attention"
    if "softmax" in name:
        return "softmax"
    return "other ops"


def op_breakdown(fn: Callable[[], Any], top: int = 12) -> dict:
    """Where the time of one call `fn()` goes, from torch.profiler (CPU activity, self times of aten ops).

    Returns the wall time of the profiled call, the self time per category (`matmul`: addmm/mm/bmm/baddbmm;
    `fused attention`: sdpa kernels; `softmax`; `other ops`), `outside ops` = wall time minus all op self times
    (Python, Hugging Face glue, generation bookkeeping, profiler overhead), and the `top` ops by self time.
    Profiling slows many small ops down, so compare A with B rather than reading absolute numbers.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    ops = {}
    calls = {}
    for avg in prof.key_averages():
        if avg.key.startswith("[") or avg.key.startswith("ProfilerStep"):
            continue
        ops[avg.key] = avg.self_cpu_time_total / 1e6
        calls[avg.key] = avg.count
    categories: dict[str, float] = {"matmul": 0.0, "fused attention": 0.0, "softmax": 0.0, "other ops": 0.0}
    for name, sec in ops.items():
        categories[_op_category(name)] += sec
    categories["outside ops"] = max(wall - sum(ops.values()), 0.0)
    ranked = sorted(ops.items(), key=lambda kv: -kv[1])[:top]
    return {"wall_s": wall, "categories": categories,
            "top_ops": [{"op": k, "self_s": v, "calls": calls[k]} for k, v in ranked],
            "op_calls": int(sum(calls.values()))}


def breakdown_table(breakdowns: Mapping[str, dict]) -> str:
    """Markdown table comparing `op_breakdown` results (e.g. {'original': ..., 'pruned': ...}) by category."""
    labels = list(breakdowns)
    cats = list(next(iter(breakdowns.values()))["categories"])
    lines = ["| time (s) | " + " | ".join(labels) + (" | ratio |" if len(labels) == 2 else " |"),
             "|---|" + "---|" * (len(labels) + (1 if len(labels) == 2 else 0))]
    for cat in cats + ["wall_s", "op_calls"]:
        vals = [breakdowns[k]["categories"][cat] if cat in cats else breakdowns[k][cat] for k in labels]
        fmt = (lambda v: f"{v:d}") if cat == "op_calls" else (lambda v: f"{v:.3f}")
        ratio = f" | {vals[0] / vals[1]:.3f}" if len(labels) == 2 and vals[1] else (" | –" if len(labels) == 2 else "")
        lines.append(f"| {cat.replace('_s', '') if cat == 'wall_s' else cat} | " + " | ".join(fmt(v) for v in vals)
                     + ratio + " |")
    return "\n".join(lines)


def _autocast(dtype: str, device: torch.device):
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def _generate_kwargs(mode: str, new_tokens: int) -> dict:
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if mode == "greedy":
        kwargs["num_beams"] = 1
    else:
        kwargs["num_beams"] = int(mode[len("beam"):])
        kwargs["early_stopping"] = False
    return kwargs


def _pad_token_kwargs(model: nn.Module) -> dict:
    """Generation of a randomly initialised model: make sure a pad token exists (HF warns and guesses otherwise)."""
    gc_ = getattr(model, "generation_config", None)
    if gc_ is not None and gc_.pad_token_id is None:
        eos = gc_.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        if eos is not None:
            return {"pad_token_id": eos}
    return {}


@contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _loadavg() -> list[float] | None:
    """1/5/15-minute load averages (other processes on a shared machine show up here), None where unsupported."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _environment(device: torch.device) -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or None
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "loadavg_before": _loadavg(),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        env["transformers"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


# ----------------------------------------------------------------------------------------------------------------
# the result
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class BenchResult:
    """Everything one benchmark measured: `meta` (settings, environment), `models` (label -> size info) and
    `rows` (one per variant × task × batch × seq_len; see the module docstring for the columns)."""

    meta: dict
    models: dict[str, dict]
    rows: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"format": JSON_FORMAT, "meta": self.meta, "models": self.models, "rows": self.rows}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: Mapping) -> "BenchResult":
        if not isinstance(data, Mapping) or data.get("format") != JSON_FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"data: format {got!r} is not {JSON_FORMAT!r}.")
        return cls(meta=dict(data["meta"]), models=dict(data["models"]), rows=list(data["rows"]))

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> "BenchResult":
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text_or_path).read_text()
        return cls.from_dict(json.loads(text))

    def row(self, variant: str | None = None, task: str = "forward", batch: int | None = None,
            seq_len: int | None = None) -> dict:
        """The one row matching the given fields (None matches anything); ValueError if not exactly one."""
        found = [r for r in self.rows
                 if (variant is None or r["variant"] == variant) and r["task"] == task
                 and (batch is None or r["batch"] == batch) and (seq_len is None or r["seq_len"] == seq_len)]
        if len(found) != 1:
            raise ValueError(f"row: {len(found)} rows match variant={variant!r}, task={task!r}, batch={batch!r}, "
                             f"seq_len={seq_len!r}; expected exactly one.")
        return found[0]

    def table(self) -> str:
        """A Markdown table: one line per row, times in ms, speedups and the FLOP-ideal speedup."""
        return format_table(self.rows, self.meta)

    def __str__(self) -> str:
        return self.table()


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds < 10 else f"{seconds * 1e3:.0f}"


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**20:.0f}M" if n >= 2**20 else f"{n / 2**10:.0f}K"


def _fmt_flops(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def format_table(rows: Sequence[Mapping], meta: Mapping | None = None) -> str:
    header = ("| variant | task | batch×len | A ms (IQR) | B ms (IQR) | speedup | pair-median (IQR) | FLOP-ideal "
              "| eff. | CPU-time speedup | cpu/wall A, B | tok/s A → B | FLOPs A → B | heads A → B | mem A → B |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for r in rows:
        a, b = r["a"], r["b"]
        shape = f"{r['batch']}×{r['seq_len']}" + (f"+{r['new_tokens']}" if r.get("new_tokens") else "")
        mem_a = (r.get("memory_a") or {}).get("peak_bytes")
        mem_b = (r.get("memory_b") or {}).get("peak_bytes")
        lines.append(
            f"| {r['variant']} | {r['task']} | {shape} "
            f"| {_fmt_time(a['median'])} ({_fmt_time(a['iqr'])}) | {_fmt_time(b['median'])} ({_fmt_time(b['iqr'])}) "
            f"| {r['speedup']:.3f} | {r['speedup_pair_median']:.3f} ({r['speedup_pair_q1']:.3f}–"
            f"{r['speedup_pair_q3']:.3f}) | {_fmt(r.get('flop_ideal_speedup'))} | {_fmt(r.get('efficiency'), '.2f')} "
            f"| {_fmt(r.get('speedup_cpu_time'))} | {_fmt(a.get('cpu_per_wall'), '.2f')}, {_fmt(b.get('cpu_per_wall'), '.2f')} "
            f"| {a['tokens_per_s']:.0f} → {b['tokens_per_s']:.0f} "
            f"| {_fmt_flops(r.get('flops_a'))} → {_fmt_flops(r.get('flops_b'))} | {r.get('heads_a')} → {r.get('heads_b')} "
            f"| {_fmt_bytes(mem_a)} → {_fmt_bytes(mem_b)} |"
        )
    if meta:
        lines.append("")
        lines.append(
            f"device {meta.get('device')}, {meta.get('threads')} threads, dtype {meta.get('dtype')}, "
            f"warm-up {meta.get('warmup')} rounds, {meta.get('repeats')} timed rounds, order {meta.get('order')}; "
            f"speedup = median_A / median_B (wall time); eff. = speedup / FLOP-ideal; CPU-time speedup = the same "
            f"with process CPU time; cpu/wall = median CPU seconds per wall second (the thread count when the "
            f"machine is otherwise idle). Load average before/after: {meta.get('loadavg_before')} / "
            f"{meta.get('loadavg_after')}."
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# benchmark
# ----------------------------------------------------------------------------------------------------------------
def _check_compatible(a: nn.Module, b: nn.Module, label: str) -> None:
    ta, tb = _text_config(a), _text_config(b)
    if getattr(a.config, "model_type", None) != getattr(b.config, "model_type", None):
        raise ValueError(f"model_b[{label!r}]: model_type {b.config.model_type!r} differs from model_a's "
                         f"{a.config.model_type!r}; both models must take the same inputs.")
    if getattr(ta, "vocab_size", None) != getattr(tb, "vocab_size", None):
        raise ValueError(f"model_b[{label!r}]: vocab_size {tb.vocab_size} differs from model_a's {ta.vocab_size}.")


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
        _check_compatible(model_a, m, label)
    for mode in config.generate:
        for label, m in [(config.label_a, model_a), *variants.items()]:
            if not _can_generate(m):
                raise ValueError(f"generate: {mode!r} needs models that can generate, but {label!r} "
                                 f"({type(m).__name__}) cannot; use generate=None.")

    dev = torch.device(config.device) if config.device is not None else default_device()
    models = {config.label_a: model_a, **variants}
    for m in models.values():
        m.to(dev).eval()
    say = progress or (lambda msg: None)

    with _threads(config.threads):
        meta = _bench_meta(config, dev, list(variants))
        info = {label: _param_info(m) for label, m in models.items()}
        rows: list[dict] = []
        for task in config.tasks:
            for batch in config.batch_sizes:
                for seq_len in config.seq_lens:
                    say(f"{task} batch={batch} seq_len={seq_len}")
                    rows.extend(_bench_case(models, _Case(task, batch, seq_len), config, dev, info))
        meta["loadavg_after"] = _loadavg()
        meta["memory_method"] = next((r["memory_a"]["method"] for r in rows if r.get("memory_a")), None)
    return BenchResult(meta=meta, models=info, rows=rows)


def _bench_meta(config: BenchConfig, dev: torch.device, variants: list[str]) -> dict:
    return {
        **_environment(dev),
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


@dataclass(frozen=True)
class _Case:
    """One measured combination: the task ("forward", "greedy", "beam4"), batch size and sequence length."""

    task: str
    batch: int
    seq_len: int

    @property
    def generates(self) -> bool:
        return self.task != "forward"


def _case_inputs(model_a: nn.Module, case: _Case, config: BenchConfig, dev: torch.device) -> dict:
    if config.inputs is not None:
        return {k: (v.to(dev) if torch.is_tensor(v) else v) for k, v in dict(config.inputs(case.batch,
                                                                                           case.seq_len)).items()}
    return make_inputs(model_a, case.batch, case.seq_len, config.tgt_len, seed=config.seed, device=dev,
                       for_generate=case.generates)


def _case_call(model: nn.Module, case: _Case, config: BenchConfig, inputs: dict, dev: torch.device):
    """The timed call of one model for `case`."""
    if case.generates:
        kwargs = {**_generate_kwargs(case.task, config.new_tokens), **_pad_token_kwargs(model)}

        def run():
            with torch.inference_mode(), _autocast(config.dtype, dev):
                return model.generate(**inputs, **kwargs)
    else:
        def run():
            with torch.inference_mode(), _autocast(config.dtype, dev):
                return model(**inputs)
    return run


def _instrumented_round(models, fns, case: _Case, config: BenchConfig, inputs: dict, dev) -> tuple[dict, dict]:
    """The first warm-up round: FLOP counter and memory profiler, one call per model (in the rotation's first
    order); with warmup=0 these calls happen anyway, untimed, before the timed rounds. Also checks that generation
    produced exactly the forced number of tokens."""
    flop_counts: dict[str, int | None] = {}
    mems: dict[str, dict | None] = {}
    for label, fn in fns.items():
        outputs = []

        def instrumented(fn=fn, outputs=outputs, label=label):
            if config.flops:
                flop_counts[label] = count_flops(lambda: outputs.append(fn())).total
            else:
                outputs.append(fn())

        if config.memory:
            mems[label] = peak_memory(instrumented, models[label], dev)
        else:
            instrumented()
            mems[label] = None
        flop_counts.setdefault(label, None)
        if case.generates:  # the forced length must really hold, otherwise tokens/s compares different work
            out = outputs[0]
            sequences = out.sequences if hasattr(out, "sequences") else out
            seq2seq = _is_seq2seq(models[label])
            produced = sequences.shape[-1] - (0 if seq2seq else inputs["input_ids"].shape[-1])
            expected = config.new_tokens + (1 if seq2seq else 0)  # a seq2seq output starts with the decoder start
            if produced != expected:
                raise RuntimeError(f"generate: model {label!r} produced {produced} tokens per sequence, expected "
                                   f"{expected}; the benchmark needs a fixed length.")
        del outputs[:]
    return flop_counts, mems


def _bench_case(models: dict, case: _Case, config: BenchConfig, dev: torch.device, info: dict) -> list[dict]:
    label_a = config.label_a
    model_a = models[label_a]
    inputs = _case_inputs(model_a, case, config, dev)
    fns = {label: _case_call(m, case, config, inputs, dev) for label, m in models.items()}
    flop_counts, mems = _instrumented_round(models, fns, case, config, inputs, dev)
    alt = alternate(fns, warmup=max(config.warmup - 1, 0), repeats=config.repeats, order=config.order, device=dev)
    alt.warmup_order.insert(0, list(fns))

    if case.generates:
        tokens = case.batch * config.new_tokens
    else:
        tokens = sum(int(v.numel()) for k, v in inputs.items()
                     if k in ("input_ids", "decoder_input_ids") and torch.is_tensor(v))
        tokens = tokens or case.batch * case.seq_len

    def side(label: str) -> dict:
        s = summarize(alt.times[label])
        cpu = alt.cpu_times[label]
        return {**s, "times": alt.times[label], "tokens_per_s": tokens / s["median"],
                "sequences_per_s": case.batch / s["median"], "cpu_times": cpu, "cpu_median": statistics.median(cpu),
                "cpu_per_wall": statistics.median(c / w for c, w in zip(cpu, alt.times[label]))}

    rows = []
    a = side(label_a)
    for label in models:
        if label == label_a:
            continue
        cmp = compare_times(alt.times[label_a], alt.times[label])
        fa, fb = flop_counts[label_a], flop_counts[label]
        ideal = fa / fb if fa and fb else None
        rows.append({
            "variant": label,
            "baseline": label_a,
            "task": case.task,
            "batch": case.batch,
            "seq_len": case.seq_len,
            "tgt_len": (config.tgt_len or case.seq_len) if (not case.generates and _is_seq2seq(model_a)) else None,
            "new_tokens": config.new_tokens if case.generates else None,
            "tokens_per_call": tokens,
            "dtype": config.dtype,
            "a": a,
            "b": side(label),
            **cmp,
            "speedup_cpu_time": (statistics.median(alt.cpu_times[label_a]) / statistics.median(alt.cpu_times[label])
                                 if dev.type == "cpu" else None),
            "flops_a": fa,
            "flops_b": fb,
            "flop_ideal_speedup": ideal,
            **_ideal_columns(cmp["speedup"], cmp["speedup_pair_median"], ideal),
            "params_a": info[label_a]["params"],
            "params_b": info[label]["params"],
            "heads_a": info[label_a]["heads"],
            "heads_b": info[label]["heads"],
            "memory_a": mems[label_a],
            "memory_b": mems[label],
            "order": alt.order,
            "order_string": alt.order_string(),
            "warmup_order": alt.warmup_order,
        })
    return rows


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
