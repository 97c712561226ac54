"""Device and precision choices that depend on the hardware.

bf16 autocast is 2–3× faster than fp32 for training on CPUs with native bf16 instructions (AVX512-BF16 / AMX), but
on a CPU without them (e.g. AVX2 only) bf16 matmuls are emulated and can be ~100× *slower* than fp32 (measured here:
a 1024² matmul took 0.08 s in fp32 and 9.3 s in bf16 on an AVX2 EPYC). So "auto" precision picks bf16 only where
it is fast: on CUDA devices that support it, and on CPUs that report AVX512-BF16 or AMX-BF16.
"""

from __future__ import annotations

from functools import lru_cache

import torch

PRECISIONS = ("auto", "bf16", "fp32")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@lru_cache(maxsize=None)
def cpu_has_fast_bf16() -> bool:
    """True if this CPU has native bf16 matmul instructions (avx512_bf16 or amx_bf16 in /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = info.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


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
