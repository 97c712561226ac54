"""Shared pieces of the benchmark scripts: models of the benchmarked shapes, head-removal masks, CLI, output."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from prunetrain import HeadMask, find_heads, shrink

RESULTS = Path(__file__).resolve().parent / "results"


def rounds_in_fresh_processes(keys: list, command: Callable[[object], list[str]], rounds: int) -> dict:
    """{key: [one JSON result per round]}: every key run once per round, each run a new process (`command(key)`, an
    argv whose last stdout line is JSON), the order rotating from round to round. A failing process ends the
    benchmark with its stderr. For engines whose threads outlive their object in a process (CTranslate2's OpenMP
    pool slows every later intra-threaded translator of the process ~3×, benchmarks/README.md j)."""
    results = {key: [] for key in keys}
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            child = subprocess.run(command(key), capture_output=True, text=True)
            if child.returncode:
                sys.exit(f"{key}: the timing process failed: {child.stderr.strip()[-800:]}")
            results[key].append(json.loads(child.stdout.splitlines()[-1]))
        print(f"round {r + 1} done", flush=True)
    return results


def parser(description: str, repeats: int, warmup: int = 1) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--repeats", type=int, default=repeats, help=f"timed rounds (default {repeats})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"warm-up rounds (default {warmup})")
    p.add_argument("--quick", action="store_true", help="small shapes and few repeats: a smoke run, not a result")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    p.add_argument("--out", type=Path, default=None, help="JSON output (default benchmarks/results/<name>.json)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                   help="before starting, wait up to SECONDS for the machine to be idle (other processes' CPU use "
                        "< 25%% of the cores over 3 s); the busy fraction at start is recorded")
    return p


def cpu_busy(interval: float = 3.0) -> float | None:
    """Fraction of all cores busy (any process) over `interval` seconds, from /proc/stat; None where unavailable."""
    def sample():
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        return sum(fields), idle

    try:
        t0, i0 = sample()
        time.sleep(interval)
        t1, i1 = sample()
    except OSError:
        return None
    return 1.0 - (i1 - i0) / max(t1 - t0, 1e-9)


def wait_for_idle(max_wait: float, threshold: float = 0.25) -> float | None:
    busy = cpu_busy()
    waited = 0.0
    while busy is not None and busy > threshold and waited < max_wait:
        print(f"machine busy ({busy:.0%} of cores in use by other processes); waiting ...", flush=True)
        time.sleep(10)
        waited += 13
        busy = cpu_busy()
    return busy


def setup(args) -> dict:
    """Threads, seed and a quiet start: the record every result keeps of its start (how busy the machine was, its
    load) and of the machine (`prunetrain.bench.environment.machine()`: CPU name, generation, cores, bf16
    instructions, GPU), so a number always says which machine it came from."""
    from prunetrain.bench.environment import machine

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    busy = wait_for_idle(args.wait_idle) if args.wait_idle > 0 else cpu_busy(1.0)
    print(f"machine busy at start: {busy:.0%} of cores (other processes); load average {loadavg()}", flush=True)
    return {**machine(), "busy_at_start": busy, "loadavg_at_start": loadavg()}


def quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def marian_config(attn: str = "sdpa", dropout: float = 0.1, vocab: int = 8000):
    """The paper's small translation setting: Marian 6+6 layers, d_model 256, 8 heads, FFN 1024, vocab 8000."""
    import transformers as tf

    cfg = tf.MarianConfig(
        vocab_size=vocab, d_model=256, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=256,
        dropout=dropout, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, eos_token_id=2,
        bos_token_id=0, decoder_start_token_id=1, forced_eos_token_id=None,
    )
    cfg._attn_implementation = attn
    return cfg


def marian_model(attn: str = "sdpa", dropout: float = 0.1, seed: int = 0):
    """Random weights (enough for speed: the work per call does not depend on the weights' values)."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.MarianMTModel(marian_config(attn, dropout))
    model.generation_config.pad_token_id = 1
    model.generation_config.eos_token_id = 2
    model.generation_config.decoder_start_token_id = 1
    model.generation_config.forced_eos_token_id = None
    model.generation_config.bad_words_ids = None
    model.generation_config.max_length = None
    return model


def removal_mask(model, kept: Callable[[object], int], seed: int = 0) -> HeadMask:
    """A HeadMask keeping `kept(site)` heads of every site; which ones is random (seeded): position is irrelevant
    to speed."""
    gen = torch.Generator().manual_seed(seed)
    remove = {}
    for site in find_heads(model):
        k = kept(site)
        order = torch.randperm(site.num_heads, generator=gen).tolist()
        remove[site.name] = sorted(order[k:])
    return HeadMask.from_heads(model, remove)


def shrunk_copy(model, kept: Callable[[object], int], seed: int = 0):
    clone = copy.deepcopy(model)
    shrink(clone, removal_mask(clone, kept, seed))
    return clone


def shrunk_to(model, kept: Callable[[object], int]):
    """A shrunk copy of `model` keeping the first `kept(site)` heads or neurons of every site (which units stay does
    not change the work)."""
    clone = copy.deepcopy(model)
    mask = HeadMask.ones(clone, units=("heads", "neurons"))
    for site in mask.layout:
        mask[site.name] = [1.0] * kept(site) + [0.0] * (site.num_heads - kept(site))
    shrink(clone, mask)
    return clone


def round_width(width: int, multiple: int) -> int:
    """`width` rounded to the nearest multiple of `multiple` (ties: up), at least `multiple`."""
    return max(multiple, multiple * ((2 * width + multiple) // (2 * multiple)))


def fraction_kept(fraction_removed: float) -> Callable[[object], int]:
    return lambda site: site.num_heads - int(round(fraction_removed * site.num_heads))


def add_device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the models run (auto: CUDA when present, as the recipe's Trainer does)")


def chosen_device(args) -> torch.device:
    """The device `--device` names (`add_device_option`); auto is CUDA when present."""
    from prunetrain.utils.device import default_device

    return default_device() if args.device == "auto" else torch.device(args.device)


def device_clock(device: torch.device) -> float:
    """`time.perf_counter()` once `device` is idle: CUDA runs kernels asynchronously, so a time read without waiting
    for them would miss the work still queued (on a CPU: the clock as is)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def device_label(device: torch.device) -> str:
    """What a result's JSON records as its device: the GPU's name, or cpu."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def output_path(args, name: str) -> Path:
    return args.out if args.out is not None else RESULTS / (f"{name}_quick.json" if args.quick else f"{name}.json")


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"\nwrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Stopwatch:
    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def verdict(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    ok = value >= target if higher_is_better else value <= target
    return "MET" if ok else "MISSED"


def profile_calls(title: str, fns: dict) -> dict:
    """One profiled call of each function (untimed by the benchmark): where the time goes, by op category."""
    from prunetrain.bench import breakdown_table, op_breakdown

    breakdowns = {label: op_breakdown(fn) for label, fn in fns.items()}
    print(f"\n### profile: {title} (one call each under torch.profiler; self time of aten ops by category)")
    print(breakdown_table(breakdowns), flush=True)
    return breakdowns


def fmt_list(xs: Sequence[float], spec: str = ".3f") -> str:
    return "[" + ", ".join(format(x, spec) for x in xs) + "]"
