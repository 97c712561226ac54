"""The settings a benchmark records beside its numbers: the machine, versions, threads and load averages."""

from __future__ import annotations

import os
import platform
from contextlib import contextmanager
from pathlib import Path

import torch


@contextmanager
def torch_threads(n: int | None):
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages (other processes on a shared machine show up here), None where unsupported."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def environment(device: torch.device) -> dict:
    cpu = machine()["cpu"]
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "loadavg_before": loadavg(),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        env["transformers"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


CPU_GENERATION = {"cpu family": "cpu_family", "model": "cpu_model_number", "stepping": "cpu_stepping"}
"""`/proc/cpuinfo`'s names of the CPU's x86 generation, and the keys `machine()` records them under."""


def machine() -> dict:
    """The machine a run's timings belong to: CPU model, core count, the CPU's generation (x86 family, model and
    stepping: two CPUs sold under one name, e.g. "AMD EPYC", stepped the recipe's model 1.65–1.89× apart,
    benchmarks/README.md l7), its native bf16/AMX instructions and the GPU, if any. Runs compared at equal
    wall-clock must share it (`prunetrain compare` shows it per arm; scripts/study_runs.sh refuses a timed run on
    another machine than its study's kept ones)."""
    cpu, flags, generation = None, set(), {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and cpu is None:
                cpu = value
            elif key == "flags" and not flags:
                flags = set(value.split())
            elif key in CPU_GENERATION and CPU_GENERATION[key] not in generation:
                generation[CPU_GENERATION[key]] = value
    except OSError:
        cpu = platform.processor() or None
    record = {"cpu": cpu, "cpu_count": os.cpu_count(),
              **{name: generation.get(name) for name in CPU_GENERATION.values()},
              "cpu_bf16": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"}),
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    return record


__all__ = ["CPU_GENERATION", "environment", "loadavg", "machine", "torch_threads"]
