"""Matmul FLOP counts of a model call, with `torch.utils.flop_counter.FlopCounterMode`.

`FlopCounterMode` counts every matrix multiplication exactly (2·M·N·K for `mm`/`addmm`/`bmm`/`baddbmm`, and the
convolutions and CUDA attention kernels it knows). Two things are added here:

- CPU fused attention (`aten._scaled_dot_product_flash_attention_for_cpu` and its backward, what `sdpa` runs on CPU
  in eval mode or without attention dropout) is not in torch's registry, so an `sdpa` model would be counted without
  its QKᵀ and AV products. It is registered here.
- All attention kernels are counted *algorithmically*: forward QKᵀ + AV, backward the four products of their
  gradients, exactly what an `eager` model's `bmm`s give. (torch's own formula for the CUDA flash backward also counts
  the recomputation of the scores; we do not, so `eager` and `sdpa` models have the same count.) Causal masking is
  not subtracted, as in torch.

Element-wise work (softmax, layer norm, GELU, the optimizer) is not counted: these are *matmul* FLOPs, the basis of
the "FLOP-ideal speedup" `flops_a / flops_b` in `prunetrain.bench`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import flop_counter as _fc
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten

__all__ = ["FlopCount", "count_flops", "flop_counter", "attention_flops_forward", "attention_flops_backward"]


def attention_flops_forward(query_shape, key_shape, value_shape) -> int:
    """QKᵀ and AV of one attention call: 2·B·H·Sq·Sk·(d_qk + d_v)."""
    return _fc.sdpa_flop_count(query_shape, key_shape, value_shape)


def attention_flops_backward(grad_out_shape, query_shape, key_shape, value_shape) -> int:
    """Gradients of QKᵀ and AV (dQ, dK, dP = dO·Vᵀ, dV): 4 products, without recomputing the scores."""
    b, h_q, s_q, d_q = query_shape
    s_k = key_shape[2]
    recompute = _fc.bmm_flop((b * h_q, s_q, d_q), (b * h_q, d_q, s_k))
    return _fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape) - recompute


def _sdpa_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return attention_flops_forward(query_shape, key_shape, value_shape)


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return attention_flops_backward(grad_out_shape, query_shape, key_shape, value_shape)


def _custom_mapping() -> dict:
    mapping: dict[Any, Callable] = {}
    forward_ops = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")
    backward_ops = ("_scaled_dot_product_flash_attention_for_cpu_backward",
                    "_scaled_dot_product_flash_attention_backward",
                    "_scaled_dot_product_efficient_attention_backward",
                    "_scaled_dot_product_cudnn_attention_backward")
    for name in forward_ops:
        op = getattr(aten, name, None)
        if op is not None:
            mapping[op] = _sdpa_forward
    for name in backward_ops:
        op = getattr(aten, name, None)
        if op is not None:
            mapping[op] = _sdpa_backward
    return mapping


def flop_counter(display: bool = False, depth: int | None = None) -> FlopCounterMode:
    """A `FlopCounterMode` that also counts CPU fused attention (and counts every attention kernel like eager)."""
    return FlopCounterMode(display=display, depth=depth, custom_mapping=_custom_mapping())


@dataclass
class FlopCount:
    """Matmul FLOPs of one call: the total, per aten op, and per top-level module (`model.encoder`, ...)."""

    total: int
    by_op: dict[str, int] = field(default_factory=dict)
    by_module: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"total": self.total, "by_op": dict(self.by_op), "by_module": dict(self.by_module)}


def count_flops(fn: Callable[[], Any], module_depth: int = 2) -> FlopCount:
    """Run `fn()` once under the counter and return its matmul FLOPs.

    `by_module` holds the counts of modules up to `module_depth` levels below the model (FlopCounterMode's module
    names, e.g. `BertModel.encoder`), which shows where the FLOPs are.
    """
    counter = flop_counter(display=False)
    with counter:
        fn()
    counts = counter.get_flop_counts()
    by_op: dict[str, int] = defaultdict(int)
    for op, n in counts.get("Global", {}).items():
        by_op[str(op).replace("aten.", "").split(".")[0]] += int(n)
    by_module = {}
    for name, ops in counts.items():
        if name == "Global" or name.count(".") >= module_depth:
            continue
        by_module[name] = int(sum(ops.values()))
    return FlopCount(total=int(counter.get_total_flops()), by_op=dict(by_op), by_module=by_module)
