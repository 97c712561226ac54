"""What a benchmark reports: the measured speed-up beside the FLOP-ideal one (`ideal_columns`), the result with its
JSON form (`BenchResult`) and its Markdown table (`format_table`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence
from prunetrain.utils.door import checked

JSON_FORMAT = "prunetrain.BenchResult/1"


def ideal_columns(speedup: float, pair_speedup: float, ideal: float | None) -> dict:
    """Measured vs FLOP-ideal: `efficiency` (speedup / ideal speedup) and `saving_efficiency` (time saved / ideal)."""
    if not ideal:
        return {"efficiency": None, "efficiency_pair": None, "saving_efficiency": None}
    ideal_saving = 1.0 - 1.0 / ideal
    return {
        "efficiency": speedup / ideal,
        "efficiency_pair": pair_speedup / ideal,
        "saving_efficiency": (1.0 - 1.0 / speedup) / ideal_saving if abs(ideal_saving) > 1e-12 else None,
    }


@checked
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
        from prunetrain.utils.output_paths import write_file

        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_file(path, text + "\n")  # atomic: a failed write (a full disk) leaves no partial file
        return text

    @classmethod
    def from_dict(cls, data: Mapping) -> "BenchResult":
        if not isinstance(data, Mapping) or data.get("format") != JSON_FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"data: format {got!r} is not {JSON_FORMAT!r}.")
        return cls(meta=dict(data["meta"]), models=dict(data["models"]), rows=list(data["rows"]))

    @classmethod
    def from_json(cls, text_or_path: str | os.PathLike) -> "BenchResult":
        from prunetrain.utils.files import parse_json, read_json

        text = str(text_or_path)
        if not text.lstrip().startswith("{"):  # a key given twice is refused, not read as its last value
            return cls.from_dict(read_json(text_or_path, "bench result", allow_nan=True))
        return cls.from_dict(parse_json(text, "bench result", allow_nan=True))

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


__all__ = ["JSON_FORMAT", "BenchResult", "format_table", "ideal_columns"]
