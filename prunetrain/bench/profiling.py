"""Where memory and time go in one call of a model: `peak_memory` (CUDA allocator peak, or a CPU estimate from
torch.profiler allocation events) and `op_breakdown` (self time of aten ops by category), with `breakdown_table`."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Mapping

import torch
from torch import nn

from prunetrain.utils.device import device_of


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


__all__ = ["MATMUL_OPS", "breakdown_table", "op_breakdown", "peak_memory"]
