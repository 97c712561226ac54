"""Physical removal of heads and FFN neurons: slice the rows of the projections before a site (q/k/v; up and
gate) and the columns of its output projection (attention's output projection; the FFN's down projection), in
place, optimizer state included.

`shrink(model, mask)` makes the model compute exactly what the masked model computes, with fewer weights:
for every head h with ξ_h = 0 the q/k/v rows and output-projection columns of h are removed; a kept head with
0 < ξ_h < 1 has ξ_h folded into its output-projection columns (Σ_h ξ_h Att_h W_o^h = Σ_h Att_h (ξ_h W_o^h)).

Parameters are shrunk in place (`param.data` is replaced), so parameter identities, and with them the optimizer's
param groups, stay valid; the optimizer's per-parameter state (Adam/AdamW `exp_avg`/`exp_avg_sq`, SGD
`momentum_buffer`) is sliced the same way, so training continues and the kept weights keep learning. Under FSDP2
the edits go through `prunetrain.engine.sharded.ShardedEditor` (gather, edit, shard again), site by site.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from prunetrain.engine import peft_support
from prunetrain.engine.compile_room import make_room_for_layouts
from prunetrain.engine.config_records import make_records_cheap_to_copy
from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, AttentionSite, HeadLayout, find_sites, live_sites, unwrap_model
from prunetrain.engine.kv_cache import track_headless_cache
from prunetrain.engine.mask import HeadMask, attached_masks, stray_mask_hooks
from prunetrain.engine.own_config import own_config
from prunetrain.engine.remote_code import mark_pruned
from prunetrain.engine.sharded import ShardedEditor, is_sharded
from prunetrain.utils.door import checked

GQA_ROUNDING = ("error", "keep", "drop")

FOLDED_CONFIG_KEY = "prunetrain_folded"
"""Config record of the soft keep values the last `shrink` folded in ({site: {original head: value}}): saved with the
config, so the guard against folding them twice holds across save/load, copies and separate commands."""


class _OptimizerSlicer:
    """`select(param, dim, index)` for `shrink`: slices the parameter, its gradient and its optimizer state."""

    def __init__(self, optimizer: torch.optim.Optimizer | None):
        while optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
            optimizer = optimizer.optimizer  # accelerate's AcceleratedOptimizer and similar wrappers
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer: expected a torch.optim.Optimizer (or a wrapper with .optimizer), "
                            f"got {type(optimizer).__name__}.")
        self.optimizer = optimizer

    def __call__(self, param: nn.Parameter, dim: int, index: torch.Tensor) -> None:
        index = index.to(param.device)
        old_shape = param.shape
        state = self.optimizer.state.get(param) if self.optimizer is not None else None
        if state:
            for key, value in list(state.items()):
                if not torch.is_tensor(value) or value.dim() == 0:
                    continue  # step counters
                if value.shape != old_shape:
                    raise ValueError(
                        f"optimizer: state {key!r} of shape {tuple(value.shape)} does not follow its parameter "
                        f"{tuple(old_shape)}, so it cannot be sliced; supported are optimizers whose state has the "
                        f"parameter's shape (SGD with momentum, Adam, AdamW, RMSprop, Adagrad)."
                    )
                state[key] = value.index_select(dim, index.to(value.device)).contiguous()
        grad = param.grad
        param.data = param.data.index_select(dim, index).contiguous()
        if grad is not None:
            param.grad = grad.index_select(dim, index).contiguous()

    @staticmethod
    def scale(param: nn.Parameter, dim: int, factors: torch.Tensor) -> None:
        """Multiply `param` by `factors` along `dim`, in place (the weights only: a fold of soft keep values)."""
        shape = [1] * param.dim()
        shape[dim] = -1
        with torch.no_grad():
            param.mul_(factors.to(param).view(shape))

    def flush(self) -> None:
        """Edits apply at once in one process; nothing is pending."""


def _keep_positions(site: AttentionSite, keep: torch.Tensor, gqa_rounding: str) -> torch.Tensor:
    """Positions of the query heads that stay, whole key/value groups at a time under GQA."""
    alive = keep != 0
    g = site.info.group_size
    if g > 1:
        groups = alive.view(-1, g)
        partial = groups.any(1) & ~groups.all(1)
        if partial.any() and int(groups.any(1).sum()) > 1:  # one surviving group is multi-query: any heads may go
            group = int(torch.nonzero(partial)[0])
            if gqa_rounding == "error":
                raise ValueError(
                    f"mask: site {site.info.name!r} removes only part of key/value group {group} "
                    f"(query heads {group * g}..{group * g + g - 1}, keep={keep.view(-1, g)[group].tolist()}); with "
                    f"grouped-query attention heads are removed {g} at a time. Make the mask group-aligned, or pass "
                    f"gqa_rounding='keep' (keep such groups, zeroed heads stay zero) or 'drop' (remove such groups)."
                )
            groups = groups.any(1, keepdim=True) if gqa_rounding == "keep" else groups.all(1, keepdim=True)
            alive = groups.expand(-1, g).reshape(-1)
    return torch.nonzero(alive).flatten()


def _fold_scale(site: AttentionSite, keep: torch.Tensor, positions: torch.Tensor, editor) -> None:
    """Multiply each head's output-projection input columns by its keep value ξ_h (exactness for soft masks).

    Only kept heads matter (the columns of removed heads go), so a binary mask folds nothing."""
    if bool((keep[positions] == 1).all()):
        return
    per_feature = keep.repeat_interleave(site.info.head_dim)  # [H * d]
    # nn.Linear weight [out, in]: the heads are columns (dim 1); transformers Conv1D weight [in, out]: rows (dim 0)
    editor.scale(site.out_proj.weight, peft_support.weight_axis_of_inputs(site.out_proj), per_feature)


@checked(own=("mask", "optimizer"))
def shrink(
    model: nn.Module,
    mask: HeadMask,
    optimizer: torch.optim.Optimizer | None = None,
    gqa_rounding: Literal["error", "keep", "drop"] = "error",
) -> HeadLayout:
    """Physically remove every head whose keep value is 0, in place; returns the model's new `HeadLayout`.

    - Kept heads with 0 < ξ < 1 have ξ folded into their output-projection columns, so the shrunk model computes
      what the masked model computes.
    - A site with every head removed keeps only its output-projection bias (the residual path around it stays);
      a head-less self-attention site still counts its cached positions, so cached generation stays exact
      (`prunetrain.engine.kv_cache`).
    - Grouped-query attention: heads go in whole key/value groups, except where a single group survives (the site
      becomes multi-query: its query heads may go one by one). A mask that removes part of a group otherwise raises,
      unless `gqa_rounding` is `'keep'` (keep the group; its zeroed heads stay zero, so outputs are unchanged) or
      `'drop'` (remove the whole group; outputs change).
    - `optimizer`: its state for the sliced parameters is sliced the same way (Adam/AdamW, SGD momentum, ...).
    - A `fully_shard`-ed (FSDP2) model is shrunk as a collective (every rank, the same mask): each affected
      parameter, its gradient and its sharded optimizer state are gathered, sliced and sharded again, the
      parameter objects kept (`prunetrain.engine.sharded`).
    - If `mask` is attached to `model` it is detached first (its zeros are now physical). Any other attached
      HeadMask is an error, since it would no longer match the model's shape.
    - Dynamo's recompile limits are raised to hold a graph per layer layout (`prunetrain.engine.compile_room`).
    """
    if gqa_rounding not in GQA_ROUNDING:
        raise ValueError(f"gqa_rounding: {gqa_rounding!r} is not one of {', '.join(map(repr, GQA_ROUNDING))}.")
    if not isinstance(mask, HeadMask):
        raise TypeError(f"mask: expected a prunetrain.HeadMask, got {type(mask).__name__}.")
    peft_support.refuse_prompt_learning(model)
    model = unwrap_model(model)  # a PeftModel: its base model, adapters sliced with it (engine.peft_support)
    if mask.attached and mask._model_ref is not model:
        raise ValueError("mask: it is attached to another model (a copy made before attaching has no hooks of it); "
                         "shrink the model it is attached to, or give this one a detached copy (mask.copy()).")
    sites = live_sites(model, mask.layout.units)
    mask.check_matches(sites)
    others = [m for m in attached_masks(model) if m is not mask]
    if others:
        raise ValueError("model: another HeadMask is attached to it; detach it before shrink, since it would no "
                         "longer match the shrunk model.")
    stray = stray_mask_hooks(model)
    if stray:
        raise ValueError(f"model: site {stray[0]!r} carries a HeadMask hook that no attached mask owns (a deep copy "
                         f"of a model with a mask attached copies its hooks); shrink the original's mask into it "
                         f"first, or detach masks before copying.")
    select = _OptimizerSlicer(optimizer)
    if is_sharded(model):  # sharded parameters: gathered, edited and sharded again, site by site
        select = ShardedEditor(model, select.optimizer, select)
    select = peft_support.adapter_aware(model, select)
    keeps = {site.info.name: mask[site.info.name].detach().clone() for site in sites}
    _refuse_second_fold(model, keeps, mask.layout.units)
    plans = [(site, _keep_positions(site, keeps[site.info.name], gqa_rounding)) for site in sites]
    for site, positions in plans:
        changes = len(positions) != site.info.num_heads or not bool((keeps[site.info.name] == 1).all())
        reason = (site.adapter.shrink_refusal(site) or peft_support.shrink_refusal(site)) if changes else None
        if reason:
            raise ValueError(f"model: shrink of site {site.info.name!r} is refused: {reason} Masks and importance "
                             f"work on this model; keep the mask attached instead of shrinking.")
    if mask.attached:
        mask.detach()

    own_config(model)  # copy-on-write: another model built from the same config object keeps it unchanged
    layout_record = dict(getattr(model.config, LAYOUT_CONFIG_KEY, None) or {})
    for site, positions in plans:
        _fold_scale(site, keeps[site.info.name], positions, select)
        if len(positions) < site.info.num_heads:
            site.adapter.remove_heads(site, positions, select)
            layout_record[site.info.name] = [site.info.heads[i] for i in positions.tolist()]
        select.flush()
    setattr(model.config, LAYOUT_CONFIG_KEY, layout_record)
    track_headless_cache(model)
    mark_pruned(model)  # every later save_pretrained (Trainer checkpoints too) writes a pruned directory
    if any(bool(((keeps[s.info.name][p] != 0) & (keeps[s.info.name][p] != 1)).any()) for s, p in plans):
        setattr(model.config, FOLDED_CONFIG_KEY, {  # soft values folded in: recorded by original head index
            site.info.name: {str(site.info.heads[i]): float(keeps[site.info.name][i]) for i in positions.tolist()}
            for site, positions in plans})
    make_records_cheap_to_copy(model.config)  # deep copies of the config stay cheap (engine.config_records)
    layout = find_sites(model, mask.layout.units)
    make_room_for_layouts(model, layout)  # a compiled model keeps a graph per layer layout (engine.compile_room)
    return layout


def _refuse_second_fold(model: nn.Module, keeps: dict[str, torch.Tensor], units: tuple[str, ...]) -> None:
    """A soft mask equal to the one the last `shrink` folded into this model would scale the same heads again."""
    record = getattr(model.config, FOLDED_CONFIG_KEY, None)
    if not isinstance(record, dict) or set(record) != set(keeps) or not all(isinstance(v, dict) for v in
                                                                          record.values()):
        return
    heads = {site.name: site.heads for site in find_sites(model, units)}
    same = all({str(h): float(v) for h, v in zip(heads[n], keeps[n].tolist()) if v != 0} ==
               {h: v for h, v in record[n].items() if v != 0} for n in keeps)
    soft = any(bool(((v != 0) & (v != 1)).any()) for v in keeps.values())
    if same and soft:
        raise ValueError("mask: this model was already shrunk with these soft keep values, which are now folded into "
                         "its output projections; shrinking again would scale those heads a second time. Use a "
                         "binary mask (or HeadMask.ones) for further shrinking.")
