"""Which distributed engine a run uses, what prunetrain supports under each, and the DDP rebuild after a shrink.

| engine | masks, importance, gates, curves | mid-training `shrink` | final shrink + `save_pruned` |
|---|---|---|---|
| single process | yes | yes | yes |
| DDP (torchrun, Trainer default) | yes (importance all-reduced, gate gradients averaged) | yes: every rank shrinks the same heads, DDP's reducer (buckets) is rebuilt, the optimizer state sliced | yes |
| FSDP2 (`fully_shard`) | yes (activations are not sharded; the hooks see whole heads) | refused | from the gathered full state (`gathered_copy`) |
| FSDP1, DeepSpeed, tensor / pipeline / model parallel | refused | refused | refused |

Under DDP and FSDP every rank computes the same masks: importance sums and counts are all-reduced (`head_importance`
and the other scorers), Hard-Concrete gate gradients are averaged over ranks before each gate step, and selection is
deterministic given the scores, so no mask is ever broadcast.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from torch import nn

ENGINES = ("single", "ddp", "fsdp2", "fsdp1", "deepspeed", "model_parallel")
SUPPORTED = {"single": "everything", "ddp": "everything",
             "fsdp2": "masks, importance, Hard-Concrete gates, pruning curves and a final shrink from the gathered "
                      "full state (not a mid-training shrink)"}


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def any_rank(flag: bool) -> bool:
    """Whether `flag` is true on any rank (a collective: every rank calls it); `flag` itself in one process.

    Decisions taken from something that differs between ranks (wall time) must agree, or one rank stops training
    while the others wait for it in the next all-reduce."""
    if world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def _is_fsdp2(module: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch < 2.6
        return False
    return any(isinstance(m, FSDPModule) for m in module.modules())


def _is_fsdp1(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def training_engine(model: nn.Module | None, args=None) -> str:
    """The engine a run trains with, from the Trainer's arguments and the model: one of `ENGINES`.

    Args:
        model: the model the Trainer hands to callbacks (or the user's model in a plain loop).
        args: the `TrainingArguments`, or None outside a Trainer.
    """
    if args is not None and getattr(args, "deepspeed", None):
        return "deepspeed"
    if model is not None:
        devices = set((getattr(model, "hf_device_map", None) or {}).values())
        if len(devices) > 1 or getattr(model, "is_parallelizable", False) and getattr(model, "model_parallel", False):
            return "model_parallel"
        if type(model).__name__ == "DeepSpeedEngine":
            return "deepspeed"
        if _is_fsdp1(model):
            return "fsdp1"
        if _is_fsdp2(model):
            return "fsdp2"
    if args is not None and getattr(args, "fsdp", None) and not getattr(args, "use_cpu", False):
        # (with use_cpu=True, transformers 5.23 / accelerate 1.15 ignore `fsdp` and train with DDP: measured)
        version = int((getattr(args, "fsdp_config", None) or {}).get("version", 1))
        return "fsdp2" if version == 2 else "fsdp1"
    if args is not None and getattr(args, "parallelism_config", None) is not None:
        config = args.parallelism_config
        if any(getattr(config, f"{name}_size", 1) > 1 for name in ("tp", "cp", "sp")):
            return "model_parallel"
    return "ddp" if world_size() > 1 else "single"


def require(engine: str, feature: str, allowed: tuple[str, ...]) -> None:
    """Refuse `feature` under `engine` with one line naming the engine and what is supported."""
    if engine not in allowed:
        supported = SUPPORTED.get(engine)
        detail = f"under {engine}, prunetrain supports {supported}" if supported else \
            f"prunetrain supports single-process, DDP and FSDP2 training only"
        raise ValueError(f"{feature}: not supported under {engine}; {detail}.")


def find_ddp(net: nn.Module):
    """The `DistributedDataParallel` wrapper around `net`, if any (the Trainer hands callbacks the inner model)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(net, DistributedDataParallel):
        return net
    for obj in gc.get_objects():
        if isinstance(obj, DistributedDataParallel) and obj.module is net:
            return obj
    return None


def rebuild_ddp(ddp) -> None:
    """Rebuild DDP's reducer after the wrapped model's parameters changed shape in place (a shrink).

    DDP sizes its gradient buckets when it is built; the parameters keep their identity through a shrink but not
    their size, so the buckets are rebuilt exactly as `DistributedDataParallel.__setstate__` does. Every rank must
    call this (the shape check is a collective); ranks whose shapes differ fail here instead of averaging wrong
    gradients later.
    """
    from torch.nn.parallel.distributed import _verify_param_shape_across_processes

    # The old reducer holds each parameter's gradient accumulator, which remembers the old shape; drop it first
    # so the new reducer gets fresh accumulators.
    ddp.logger = None
    ddp.reducer = None
    gc.collect()
    parameters, expect_sparse_gradient = ddp._build_params_for_reducer()
    _verify_param_shape_across_processes(ddp.process_group, parameters)
    mapping = ddp._build_debug_param_to_name_mapping(parameters)
    ddp._ddp_init_helper(parameters, expect_sparse_gradient, mapping, ddp.static_graph)
    if ddp.static_graph:
        ddp.reducer._set_static_graph()
        ddp.logger._set_static_graph()


def _original_class(model: nn.Module) -> type:
    """The model's own class (`fully_shard` swaps in a subclass named `FSDP<Class>`)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if issubclass(c, nn.Module) and not issubclass(c, FSDPModule))


def _tied_keys(model: nn.Module) -> list[str]:
    keys = getattr(model, "_tied_weights_keys", None) or []
    return list(keys) if not isinstance(keys, dict) else list(keys)


def gathered_copy(model: nn.Module) -> nn.Module | None:
    """A plain (unsharded, CPU) copy of an FSDP2 model with its full state gathered, on rank 0; None elsewhere.

    A collective: every rank must call it. Use it for the final shrink + `save_pruned` of a sharded run:
    `copy = gathered_copy(model); if copy is not None: shrink(copy, mask); save_pruned(copy, path)`.

    Args:
        model: the `fully_shard`-ed model.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    plain = _original_class(model)(model.config)  # built on the CPU: non-persistent buffers get their values
    missing, unexpected = plain.load_state_dict(state, strict=False)
    untied = [k for k in missing if not any(k == t or k.endswith(t) for t in _tied_keys(plain))]
    if unexpected or untied:
        raise ValueError(f"model: the gathered state does not fit a fresh {type(plain).__name__} "
                         f"(missing {untied[:3]}, unexpected {unexpected[:3]}).")
    if hasattr(plain, "tie_weights"):
        plain.tie_weights()
    return plain.eval()


__all__ = ["ENGINES", "find_ddp", "gathered_copy", "rebuild_ddp", "require", "training_engine"]
