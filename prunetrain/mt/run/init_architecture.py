"""The architecture a translation run starts from: the full model, or — for the baselines that decide whether pruning
during training pays — a smaller one built before the first step.

- `pruning.init_layout`: the per-site heads (and FFN neurons, where it pruned them) a pruned model ended with (its
  `prunetrain_layout.json`), freshly initialised — the same architecture trained from scratch (Liu et al. 2019,
  "Rethinking the value of network pruning"; Voita et al. 2019, Table 2). The fresh full model is built with the
  run's seed and shrunk to that layout: a kept unit's weights are drawn exactly as a full model's are (the
  initialiser does not depend on the number of heads or neurons), so this is a from-scratch initialisation of the
  small architecture.
- `pruning.init_heads`: that many heads kept at random at initialisation (seeded by `train.seed`, every site keeping
  `pruning.min_heads_per_layer`): does *which* per-site distribution the pruned run found matter?
"""

from __future__ import annotations

from pathlib import Path

from prunetrain.engine.heads import HeadLayout, find_heads
from prunetrain.engine.persist import LAYOUT_FILE, shrink_to_layout
from prunetrain.utils.files import read_json


def layout_file(path: str | Path) -> Path:
    """The `prunetrain_layout.json` that `pruning.init_layout` names: the file itself, a pruned model directory, or
    a finished run directory (its `pruned/`)."""
    path = Path(path)
    for candidate in (path, path / LAYOUT_FILE, path / "pruned" / LAYOUT_FILE):
        if candidate.is_file():
            return candidate
    raise ValueError(f"pruning.init_layout: {str(path)!r} holds no {LAYOUT_FILE}; give a pruned model directory, "
                     f"a finished run directory (with pruned/) or the layout file itself.")


def read_layout(path: str | Path) -> HeadLayout:
    """The recorded layout of `pruning.init_layout` (one clear line when it is not one)."""
    file = layout_file(path)
    data = read_json(file, "pruning.init_layout")  # strict JSON: a key given twice is refused, not read as the last
    try:
        return HeadLayout.from_dict(data)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"pruning.init_layout: {str(file)!r} is not a prunetrain head layout ({err}).") from None


def apply_initial_architecture(recipe, model) -> dict | None:
    """Shrink the freshly built `model` to the recipe's initial architecture (in place, before training).

    Returns what was done, for the run's records ({"from", "heads", "per_site"}), or None for the full model.
    """
    from prunetrain.engine.shrink import shrink
    from prunetrain.methods.importance import random_scores
    from prunetrain.methods.selection import select_heads

    p = recipe.pruning
    if p.init_layout:
        layout = read_layout(p.init_layout)
        try:
            after = shrink_to_layout(model, layout)
        except ValueError as err:
            raise ValueError(f"pruning.init_layout: {p.init_layout!r} does not fit the recipe's model "
                             f"({err})") from None
        origin = str(layout_file(p.init_layout))
    elif p.init_heads:
        layout = find_heads(model)
        if p.init_heads > layout.total_heads:
            raise ValueError(f"pruning.init_heads: {p.init_heads} is more than the model's {layout.total_heads} "
                             f"heads.")
        try:
            mask = select_heads(random_scores(layout, seed=recipe.train.seed), layout.total_heads - p.init_heads,
                                min_heads_per_layer=p.min_heads_per_layer)
        except ValueError as err:
            raise ValueError(f"pruning.init_heads: {p.init_heads} cannot be kept with pruning.min_heads_per_layer="
                             f"{p.min_heads_per_layer} ({err})") from None
        after = shrink(model, mask) if mask.num_kept < mask.num_heads else layout
        origin = f"random (seed {recipe.train.seed})"
    else:
        return None
    neurons = {"neurons": after.total_neurons, "neurons_per_kind": after.neurons_per_kind()} \
        if "neurons" in after.units else {}
    return {"from": origin, "heads": after.total_heads, **neurons, "per_kind": after.heads_per_kind(),
            "per_site": {site.name: list(site.heads) for site in after}}


__all__ = ["apply_initial_architecture", "layout_file", "read_layout"]
