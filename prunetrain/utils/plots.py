"""Figures (matplotlib, headless) and TensorBoard output shared by callbacks, studies and the run report."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Mapping, Sequence

import torch


def pyplot():
    """`matplotlib.pyplot` with the non-interactive Agg backend (figures are written to files and TensorBoard)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def heatmap_figure(matrix: torch.Tensor, row_labels: Sequence[str], title: str, *, vmin: float | None = None,
                   vmax: float | None = None, colorbar_label: str = "", xlabel: str = "head"):
    """Sites × units heatmap (NaN cells, i.e. units a site does not have, are blank); at most 16 inches wide, with
    a tick per column up to 64 columns (FFN neurons: ticks chosen by matplotlib)."""
    plt = pyplot()
    matrix = matrix.detach().float().cpu().numpy()
    fig, ax = plt.subplots(figsize=(min(16, max(4, 0.45 * matrix.shape[1] + 3)),
                                    max(2.5, 0.3 * len(row_labels) + 1.2)))
    image = ax.imshow(matrix, aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_yticks(range(len(row_labels)), labels=row_labels, fontsize=7)
    if matrix.shape[1] <= 64:
        ax.set_xticks(range(matrix.shape[1]), labels=[str(i) for i in range(matrix.shape[1])], fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    fig.tight_layout()
    return fig


def widths_figure(labels: Sequence[str], kept: Sequence[int], original: Sequence[int], title: str):
    """One bar per FFN site: the neurons it keeps, over a pale bar of its original width."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(min(16, max(4, 0.35 * len(labels) + 2)), 3.5))
    positions = range(len(labels))
    ax.bar(positions, original, color="lightgray", label="original")
    ax.bar(positions, kept, color="tab:blue", label="kept")
    ax.set_xticks(list(positions), labels=labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("FFN width (neurons)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def curves_figure(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, ylabel: str, title: str):
    """One line per series (e.g. per epoch): x = % of heads pruned, y = metric."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label, (fractions, values) in series.items():
        ax.plot([100 * f for f in fractions], values, marker="o", markersize=3, label=label)
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save_figure(fig, path: str | os.PathLike) -> Path:
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure_to_array(fig):
    """RGB uint8 array [H, W, 3] of a figure (for TensorBoard `add_image`), closing the figure."""
    import numpy as np

    plt = pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    buffer.seek(0)
    image = plt.imread(buffer)  # float [H, W, 4]
    return (image[..., :3] * 255).astype(np.uint8)


class TensorBoardLog:
    """A lazily created `SummaryWriter` (rank 0 only is the caller's business). Scalars, figures, text."""

    def __init__(self, log_dir: str | os.PathLike):
        self.log_dir = Path(log_dir)
        self._writer = None

    @property
    def writer(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.log_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        return self._writer

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.writer.add_scalar(tag, float(value), step)

    def scalars(self, prefix: str, values: Mapping[str, float], step: int) -> None:
        for name, value in values.items():
            self.scalar(f"{prefix}/{name}", value, step)

    def figure(self, tag: str, fig, step: int) -> None:
        self.writer.add_image(tag, figure_to_array(fig), step, dataformats="HWC")

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_scalars(log_dir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """All scalar series in the event files under `log_dir`: tag -> [(step, value)] (tensorboard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for directory in _event_dirs(log_dir):
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0, "images": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def read_image_tags(log_dir: str | os.PathLike) -> dict[str, int]:
    """Image tags in the event files under `log_dir` and how many images each holds."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, int] = {}
    for directory in _event_dirs(log_dir):
        acc = EventAccumulator(str(directory), size_guidance={"images": 0})
        acc.Reload()
        for tag in acc.Tags().get("images", []):
            out[tag] = out.get(tag, 0) + len(acc.Images(tag))
    return out


def _event_dirs(log_dir: str | os.PathLike) -> list[Path]:
    return sorted({p.parent for p in Path(log_dir).rglob("events.out.tfevents.*")})
