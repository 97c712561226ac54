"""Shrink on FSDP2 (`torch.distributed.fsdp.fully_shard`) models: gather, edit, shard again.

Under FSDP2 every parameter is a DTensor whose rows (dim 0 by default) are split over the ranks, and FSDP keeps its
own record of each parameter (`FSDPParam`: global size, padded local shard, all-gather buffers) sized when
`fully_shard` ran. `shrink` edits parameters through an editor (`select(param, dim, index)`,
`scale(param, dim, factors)`, `flush()`); `ShardedEditor` is the one for a sharded model:

1. the first edit of a parameter gathers it (`DTensor.full_tensor`, a collective), its gradient and its optimizer
   state (`exp_avg`, `exp_avg_sq`, ... are DTensors with the parameter's placement; a 0-d `step` stays as it is);
2. the edits (row/column selections, the output-projection scale of soft keep values) apply to the full tensors;
3. `flush()` (after every attention site, so at most one site's projections are whole at a time) builds a fresh
   `FSDPParam` for the edited full tensor with the old one's mesh, placement, mixed-precision and offload policy,
   swaps its sharded parameter into the old `nn.Parameter` object (`torch.utils.swap_tensors`: the parameter's
   identity, and with it the optimizer's param groups, stays valid), and shards the optimizer state and the
   gradient the same way (each rank keeps the rows FSDP's chunking gives it).

Every rank must run the same `shrink` with the same mask (the gathers are collectives, issued in module order);
selection is deterministic given all-reduced scores, so every rank computes the same mask. The result is the model
one process gets by shrinking the unsharded model, sharded: tested against one process on the same global batches
(tests/test_fsdp_shrink.py).
"""

from __future__ import annotations

import torch
from torch import nn


def fsdp2_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of `model` that `fully_shard` was applied to (empty for an unsharded model)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module) -> bool:
    """Whether `model` holds DTensor parameters (FSDP2, or tensor parallel): `shrink` then edits through
    `ShardedEditor`, which refuses what it cannot gather and shard again."""
    from torch.distributed.tensor import DTensor

    return bool(fsdp2_modules(model)) or any(isinstance(p, DTensor) for p in model.parameters())


def _fsdp_index(model: nn.Module) -> dict[int, tuple[object, int]]:
    """id(sharded parameter) -> (its FSDPParamGroup, its position in the group), for every FSDP2-managed parameter."""
    index = {}
    for module in fsdp2_modules(model):
        module.reshard()  # between steps every group is sharded already; make sure (not recursive: every module)
        for group in module._get_fsdp_state()._fsdp_param_groups:
            for position, fsdp_param in enumerate(group.fsdp_params):
                index[id(fsdp_param.sharded_param)] = (group, position)
    return index


def _optimizer_state(optimizer, param: nn.Parameter) -> dict | None:
    return optimizer.state.get(param) if optimizer is not None else None


class _Gathered:
    """One parameter being edited: its full value, full gradient and full optimizer state (tensors shaped like it)."""

    def __init__(self, param: nn.Parameter, state: dict | None):
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            self.full = param.full_tensor()
            self.grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else None
            self.state: dict[str, torch.Tensor] = {}
            for key, value in (state or {}).items():
                if isinstance(value, DTensor) and value.shape == param.shape:
                    self.state[key] = value.full_tensor()
                elif torch.is_tensor(value) and value.dim() > 0:
                    raise ValueError(
                        f"optimizer: state {key!r} of shape {tuple(value.shape)} does not follow its parameter "
                        f"{tuple(param.shape)}, so it cannot be sliced; supported are optimizers whose state has the "
                        f"parameter's shape (SGD with momentum, Adam, AdamW, RMSprop, Adagrad).")

    def tensors(self) -> list[torch.Tensor]:
        return [self.full, *([self.grad] if self.grad is not None else []), *self.state.values()]


class ShardedEditor:
    """`shrink`'s editor for an FSDP2 model: `select`/`scale` on gathered full tensors, `flush` shards them again.

    Parameters FSDP2 does not manage (a model whose root was not `fully_shard`-ed) are edited in place as in one
    process. Under FSDP2 a gradient or optimizer state on the *plain* path would be a user error, so it is sliced
    the same way for consistency.

    Args:
        model: the `fully_shard`-ed model.
        optimizer: the optimizer training it (its per-parameter state is sliced), or None.
        plain: the one-process editor for unmanaged parameters.
    """

    def __init__(self, model: nn.Module, optimizer, plain):
        self.optimizer = optimizer
        self.plain = plain
        self._index = _fsdp_index(model)
        _refuse_unsupported(model, self._index)  # before any parameter is edited: never a half-shrunk model
        self._open: dict[int, tuple[nn.Parameter, _Gathered]] = {}  # in first-edit order (same on every rank)

    def _gathered(self, param: nn.Parameter) -> _Gathered | None:
        if id(param) not in self._index:
            return None
        if id(param) not in self._open:
            self._open[id(param)] = (param, _Gathered(param, _optimizer_state(self.optimizer, param)))
        return self._open[id(param)][1]

    def __call__(self, param: nn.Parameter, dim: int, index: torch.Tensor) -> None:
        """`select`: keep `index` along `dim` of `param` (and of its gradient and optimizer state)."""
        gathered = self._gathered(param)
        if gathered is None:
            self.plain(param, dim, index)
            return
        index = index.to(gathered.full.device)
        gathered.full = gathered.full.index_select(dim, index).contiguous()
        if gathered.grad is not None:
            gathered.grad = gathered.grad.index_select(dim, index).contiguous()
        for key, value in gathered.state.items():
            gathered.state[key] = value.index_select(dim, index.to(value.device)).contiguous()

    def scale(self, param: nn.Parameter, dim: int, factors: torch.Tensor) -> None:
        """Multiply `param` by `factors` along `dim` (the weights only: a fold of soft keep values)."""
        gathered = self._gathered(param)
        if gathered is None:
            self.plain.scale(param, dim, factors)
            return
        shape = [1] * gathered.full.dim()
        shape[dim] = -1
        gathered.full.mul_(factors.to(gathered.full).view(shape))

    def flush(self) -> None:
        """Shard every gathered parameter again, in first-edit order (the same on every rank)."""
        for param, gathered in self._open.values():
            group, position = self._index[id(param)]
            _reshard(group, position, param, gathered, _optimizer_state(self.optimizer, param))
        self._open.clear()
        self.plain.flush()


def _refuse_unsupported(model: nn.Module, index: dict[int, tuple[object, int]]) -> None:
    """FSDP2 set-ups whose parameters this editor cannot gather and shard again, refused in one line."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import DTensor

    for group, position in index.values():
        if isinstance(group.offload_policy, CPUOffloadPolicy):
            raise ValueError("model: FSDP2 with CPU offload (offload_policy=CPUOffloadPolicy()): a shrink of the "
                             "sharded model is not supported; train without offload, or shrink a gathered copy "
                             "(prunetrain.training.distributed.gathered_copy).")
        if getattr(group.fsdp_params[position], "is_dtensor", False):
            raise ValueError("model: FSDP2 over tensor-parallel DTensors: a shrink is not supported (tensor "
                             "parallelism splits each site's heads over the ranks).")
    if any(isinstance(p, DTensor) and id(p) not in index for p in model.parameters()):
        raise ValueError("model: it holds DTensor parameters that FSDP2 does not manage (tensor parallel?); "
                         "prunetrain shrinks FSDP2-sharded and unsharded parameters only.")


def _reshard(group, position: int, param: nn.Parameter, gathered: _Gathered, state: dict | None) -> None:
    """Replace FSDP's record of `param` by one for the edited full tensor; `param` keeps its identity."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import ShardPlacementResult
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

    old = group.fsdp_params[position]
    placement = ShardPlacementResult(placement=old.fsdp_placement, mesh_info=old.mesh_info)
    # a parameter left with no elements (a site without heads) has nothing to train, and FSDP2's reduce-scatter
    # refuses empty gradients: it leaves training (one process would compute an empty gradient; the same model)
    trainable = param.requires_grad and gathered.full.numel() > 0
    with torch.no_grad():
        fresh = FSDPParam(nn.Parameter(gathered.full, requires_grad=trainable), old._module_info,
                          group.mesh_info, group.post_forward_mesh_info, old.device, lambda _: placement,
                          group.mp_policy, group.offload_policy)
    if not trainable and gathered.full.numel() == 0:
        _fix_empty_shard(fresh, gathered.full)
    fresh.init_dtype_attrs(group.mp_policy)
    fresh._param_fqn = old._param_fqn
    old._post_load_hook_handle.remove()
    replaced = fresh.sharded_param
    torch.utils.swap_tensors(param, replaced)  # `param` now holds the new shard; `replaced` the old one
    fresh.sharded_param = param
    fresh._setattr_on_modules(param)
    group.fsdp_params[position] = fresh
    local = _local_rows(fresh)
    with torch.no_grad():
        param.grad = _shard_like(param, gathered.grad, local) if gathered.grad is not None else None
        for key, value in gathered.state.items():
            state[key] = _shard_like(param, value, local)


def _fix_empty_shard(fsdp_param, full: torch.Tensor) -> None:
    """Give an empty parameter's shard the shape DTensor expects.

    FSDP2 (torch 2.13) shards a tensor without elements, e.g. an output projection [d, 0] of a site without heads,
    as [0, 0] on every rank while its DTensor says [d / W, 0], so gathering it (`full_tensor`, a state dict) fails.
    The shard is rebuilt with DTensor's chunking: rank r holds rows [r·c, min((r+1)·c, n)) of n, c = ⌈n / W⌉.
    """
    from torch.distributed.tensor import DTensor

    dim = fsdp_param.fsdp_placement.dim
    rows, world = full.size(dim), fsdp_param.mesh_info.shard_mesh_size
    chunk = -(-rows // world)
    length = max(0, min(chunk, rows - fsdp_param.mesh_info.shard_mesh_rank * chunk))
    local_size = list(full.shape)
    local_size[dim] = length
    local = full.new_zeros(local_size)
    fsdp_param.sharded_size = local.size()
    fsdp_param.contiguous_sharded_stride = local.stride()
    fsdp_param._sharded_param_data = local.view(-1)
    fsdp_param.sharded_param = nn.Parameter(DTensor.from_local(local, fsdp_param._sharding_spec.mesh,
                                                                fsdp_param._sharding_spec.placements,
                                                                run_check=False, shape=full.shape,
                                                                stride=full.stride()), requires_grad=False)
    fsdp_param._setattr_on_modules(fsdp_param.sharded_param)


def _local_rows(fsdp_param) -> tuple[int, int, int]:
    """(dim, start, length) of this rank's shard of the full tensor (FSDP's chunking: equal chunks, last short)."""
    dim = fsdp_param.fsdp_placement.dim
    rank = fsdp_param.mesh_info.shard_mesh_rank
    start = rank * fsdp_param.padded_sharded_param_size[dim]
    return dim, start, fsdp_param.sharded_size[dim]


def _shard_like(param, full: torch.Tensor, local: tuple[int, int, int]):
    """A DTensor with `param`'s placement whose local shard is this rank's rows of `full` (a copy)."""
    dim, start, length = local
    out = torch.zeros_like(param)
    if length:
        out.to_local().copy_(full.narrow(dim, start, length))
    return out


__all__ = ["ShardedEditor", "fsdp2_modules", "is_sharded"]
