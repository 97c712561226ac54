"""Device and precision choices that depend on the hardware.

"auto" precision picks bf16 autocast only where it was measured faster than fp32 for training:
- CUDA devices that support bf16;
- AMD CPUs with native bf16 matmuls (AVX512-BF16): 2–3× faster than fp32 (AMD EPYC, 2 threads, the recipes' model).
On Intel Xeons with AVX512-BF16 the recipe's step was *slower* in bf16 than in fp32 (1.46× with AVX512-BF16 alone,
1.43× with AMX as well, 2 threads), and without native bf16 (AVX2 only) bf16 matmuls are emulated and up to ~100×
slower (a 1024² matmul: 0.08 s in fp32, 9.3 s in bf16 on an AVX2 EPYC). Elsewhere "auto" is fp32; `bf16` forces
autocast and the recipes' `precision: measure` times both on the machine at hand.
"""

from __future__ import annotations

from functools import lru_cache

import torch

PRECISIONS = ("auto", "bf16", "fp32")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True if bf16 autocast trains faster than fp32 on this CPU, as measured per CPU family (module docstring): an
    AMD CPU with native bf16 matmuls (`avx512_bf16` in /proc/cpuinfo); False on Intel, whose Xeons with AVX512-BF16
    (with or without AMX) ran the recipe's step faster in fp32, and on every CPU without native bf16."""
    try:
        with open("/proc/cpuinfo") as info:
            text = info.read()
    except OSError:
        return False
    return "AuthenticAMD" in text and "avx512_bf16" in text


def bf16_is_fast(device: torch.device | str | None = None) -> bool:
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu_has_fast_bf16()


def use_bf16(precision: str, device: torch.device | str | None = None) -> bool:
    """Resolve a precision setting ("auto", "bf16", "fp32") to whether bf16 autocast is used."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} is not one of {', '.join(map(repr, PRECISIONS))}.")
    if precision == "auto":
        return bf16_is_fast(device)
    return precision == "bf16"


def device_of(model) -> torch.device:
    """The device of a model's first parameter (or buffer); CPU for a model with neither."""
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")
