"""Where a study's files go: PNG figures and a TensorBoard log under one study directory, and the figure parts
that several studies share."""

from __future__ import annotations

import math
from pathlib import Path

from prunetrain.utils.plots import TensorBoardLog, pyplot

KIND_COLORS = {"encoder_self": "#4477aa", "decoder_self": "#ee6677", "cross": "#228833", "self": "#4477aa"}
"""One colour per attention kind in the studies' figures."""


class StudyOutputs:
    """PNG files and a TensorBoard log under one study directory (nothing when `out_dir` is None).

    Args:
        out_dir: the study's directory (None: figures are closed unwritten, scalars dropped).
        study: the TensorBoard tag prefix.
    """

    def __init__(self, out_dir: str | Path | None, study: str):
        self.out = Path(out_dir) if out_dir is not None else None
        self.study = study
        self.tb = TensorBoardLog(self.out / "tensorboard") if self.out is not None else None

    def figure(self, fig, filename: str) -> None:
        if self.out is None:
            pyplot().close(fig)
            return
        self.out.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.out / filename, dpi=110)
        self.tb.figure(f"{self.study}/{Path(filename).stem}", fig, 0)  # closes the figure

    def text(self, filename: str, text: str, encoding: str | None = None) -> None:
        """Write a text file (a Markdown table) into the study's directory; nothing when there is none."""
        if self.out is not None:
            (self.out / filename).write_text(text, encoding=encoding)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.tb is not None and value is not None and math.isfinite(value):
            self.tb.scalar(f"{self.study}/{tag}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def sites_figure(rows, key: str, title: str):
    """A bar per site (coloured by kind): the metric's change `delta` of each row."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * len(rows) + 2), 3.6))
    colors = [KIND_COLORS.get(r["kind"], "#999999") for r in rows]
    ax.bar(range(len(rows)), [r["delta"] for r in rows], color=colors)
    ax.set_xticks(range(len(rows)), labels=[f"{r['kind']} {r['layer']}" for r in rows], rotation=90, fontsize=6)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_ylabel(f"{key} change")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def fraction_axes(ax, ylabel: str, title: str) -> None:
    """The x-axis, labels, grid and legend of a plot over the % of heads pruned."""
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


__all__ = ["KIND_COLORS", "StudyOutputs", "fraction_axes", "sites_figure"]
