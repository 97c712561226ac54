"""`HeadScores`: one score per head for every site of a model's `HeadLayout` (low = prune first), with the
normalisations of Michel et al.'s code and an exact JSON form."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from prunetrain.engine.heads import HeadLayout
from prunetrain.utils.door import checked

NORMALIZE_EPS = 1e-20
"""Added to each layer's L2 norm before dividing, as in the authors' code (a layer of all-zero scores stays zero)."""


@checked(own=("values",))
@dataclass(eq=False)
class HeadScores:
    """One score per head for every site of a `HeadLayout` (float64, CPU). Low score = less important.

    `values[site_name]` is a tensor `[num_heads]` indexed by the head's current position in the site (the
    position `HeadMask.set` takes). `method` names the scorer, `meta` holds JSON-serialisable details of how the
    scores were computed (options, token and batch counts, world size).
    """

    layout: HeadLayout
    values: dict[str, torch.Tensor]
    method: str = "custom"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.layout, HeadLayout):
            raise ValueError(f"layout: expected a prunetrain.HeadLayout, got {type(self.layout).__name__}.")
        unknown = [name for name in self.values if name not in self.layout]
        if unknown:
            raise ValueError(f"values: unknown site {unknown[0]!r}; valid sites: "
                             f"{', '.join(self.layout.names[:4])}, ...")
        clean = {}
        for site in self.layout:
            if site.name not in self.values:
                raise ValueError(f"values: site {site.name!r} is missing; every site of the layout needs scores.")
            value = self.values[site.name]
            value = value.detach() if torch.is_tensor(value) else value
            tensor = torch.as_tensor(value, dtype=torch.float64, device="cpu").reshape(-1).clone()
            if tensor.numel() != site.num_heads:
                raise ValueError(f"values[{site.name!r}]: got {tensor.numel()} scores, but this site has "
                                 f"{site.num_heads} heads.")
            clean[site.name] = tensor
        self.values = clean

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.values:
            raise KeyError(f"unknown site {name!r}; valid sites: {', '.join(self.layout.names[:4])}, ...")
        return self.values[name]

    def items(self):
        return self.values.items()

    @property
    def num_heads(self) -> int:
        return self.layout.total_heads

    def flat(self) -> torch.Tensor:
        """All scores in layout order (site by site, heads in position order)."""
        return torch.cat([self.values[s.name] for s in self.layout]) if len(self.layout) else torch.zeros(0)

    def ranked(self, descending: bool = False) -> list[tuple[str, int, float]]:
        """`(site, head, score)` for every head, lowest score first (ties: site order, then head index)."""
        rows = [(i, h, float(v)) for i, s in enumerate(self.layout) for h, v in enumerate(self.values[s.name].tolist())]
        rows.sort(key=lambda r: ((-r[2] if descending else r[2]), r[0], r[1]))
        names = self.layout.names
        return [(names[i], h, v) for i, h, v in rows]

    def restricted(self, units) -> "HeadScores":
        """The scores of the sites of `units` only ("heads", "neurons" or both)."""
        layout = self.layout.restricted(units)
        return HeadScores(layout, {s.name: self.values[s.name] for s in layout}, self.method, dict(self.meta))

    def as_matrix(self) -> torch.Tensor:
        """`[num_sites, max_heads]` float64, NaN where a site has fewer heads (rows in layout order): for heatmaps."""
        width = max((s.num_heads for s in self.layout), default=0)
        out = torch.full((len(self.layout), width), float("nan"), dtype=torch.float64)
        for i, s in enumerate(self.layout):
            out[i, : s.num_heads] = self.values[s.name]
        return out

    def normalized(self, how: str = "layer") -> "HeadScores":
        """A copy with normalised scores.

        `"layer"`: each site's scores divided by their L2 norm (+1e-20), as Michel et al.'s code does by default;
        `"minmax"`: all scores mapped linearly onto [0, 1] (min → 0, max → 1; all-equal scores → 0).
        """
        if how == "layer":
            values = {n: v / (v.norm(p=2) + NORMALIZE_EPS) for n, v in self.values.items()}
        elif how == "minmax":
            flat = self.flat()
            lo, hi = (float(flat.min()), float(flat.max())) if flat.numel() else (0.0, 0.0)
            span = hi - lo
            values = {n: (v - lo) / span if span > 0 else torch.zeros_like(v) for n, v in self.values.items()}
        else:
            raise ValueError(f"how: {how!r} is not one of 'layer', 'minmax'.")
        return HeadScores(self.layout, values, self.method, {**self.meta, "normalize": how})

    def allclose(self, other: "HeadScores", rtol: float = 1e-5, atol: float = 1e-8) -> bool:
        return self.layout.names == other.layout.names and all(
            v.shape == other.values[n].shape and torch.allclose(v, other.values[n], rtol=rtol, atol=atol)
            for n, v in self.values.items()
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeadScores):
            return NotImplemented
        return (self.layout == other.layout and self.method == other.method and self.meta == other.meta
                and all(torch.equal(v, other.values[n]) for n, v in self.values.items()))

    def __repr__(self) -> str:
        return f"HeadScores(method={self.method!r}, {len(self.layout)} sites, {self.num_heads} heads)"

    # serialisation ---------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "format": "prunetrain.HeadScores/1",
            "method": self.method,
            "meta": self.meta,
            "layout": self.layout.to_dict(),
            "scores": {name: [float(x) for x in v.tolist()] for name, v in self.values.items()},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """JSON text (float64 values written with Python's shortest exact repr: `from_json` gives equal scores)."""
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: Mapping) -> "HeadScores":
        if not isinstance(data, Mapping) or data.get("format") != "prunetrain.HeadScores/1":
            raise ValueError("data: expected the output of HeadScores.to_dict() (format 'prunetrain.HeadScores/1').")
        layout = HeadLayout.from_dict(data["layout"])
        values = {n: torch.tensor(v, dtype=torch.float64) for n, v in data["scores"].items()}
        return cls(layout, values, data.get("method", "custom"), dict(data.get("meta", {})))

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "HeadScores":
        from prunetrain.utils.files import parse_json, read_json

        text = str(text_or_path)
        if not text.lstrip().startswith("{"):  # a key given twice is refused, not read as its last value
            return cls.from_dict(read_json(text_or_path, "scores", allow_nan=True))
        return cls.from_dict(parse_json(text, "scores", allow_nan=True))


__all__ = ["HeadScores", "NORMALIZE_EPS"]
