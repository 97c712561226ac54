"""Which distributed engine a run uses, what prunetrain supports under each, and the DDP rebuild after a shrink.

| engine | masks, importance, gates, curves | mid-training `shrink` | final shrink + `save_pruned` |
|---|---|---|---|
| single process | yes | yes | yes |
| DDP (torchrun, Trainer default) | yes (importance all-reduced, gate gradients averaged) | yes: every rank shrinks the same heads, DDP's reducer (buckets) is rebuilt, the optimizer state sliced | yes |
| FSDP2 (`fully_shard`) | yes (activations are not sharded; the hooks see whole heads) | yes: each affected parameter and its sharded optimizer state gathered, sliced and sharded again (`prunetrain.engine.sharded`) | yes (or from `gathered_copy`) |
| DeepSpeed ZeRO-1/2 | yes | refused | refused |
| DeepSpeed ZeRO-3, FSDP1, tensor parallel, context / pipeline parallel, `device_map` over devices | refused | refused | refused |

Every refusal is one line naming the engine and why (`WHY_REFUSED`), raised when the Trainer is built
(`on_init_end`, from the training arguments and the model) and again when training starts (from the model the
Trainer prepared).

Under DDP and FSDP every rank computes the same masks: importance sums and counts are all-reduced (`head_importance`
and the other scorers), Hard-Concrete gate gradients are averaged over ranks before each gate step, and selection is
deterministic given the scores, so no mask is ever broadcast.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from prunetrain.engine.sharded import fsdp2_modules

ENGINES = ("single", "ddp", "fsdp2", "deepspeed", "deepspeed_zero3", "fsdp1", "tensor_parallel", "model_parallel")
SUPPORTED = {"single": "everything", "ddp": "everything", "fsdp2": "everything",
             "deepspeed": "masks, importance, Hard-Concrete gates and pruning curves, but no shrink: ZeRO's optimizer "
                          "keeps flat copies of every parameter, sized when training starts"}
WHY_REFUSED = {
    "deepspeed_zero3": "ZeRO-3 (or a DeepSpeed config whose ZeRO stage cannot be read) partitions every parameter "
                       "outside PyTorch's view, so the attention projections cannot be read or sliced; use ZeRO-1/2, "
                       "or FSDP2 to shard parameters",
    "fsdp1": "FSDP1 flattens the parameters into FlatParameters and renames the modules; use FSDP2 "
             "(TrainingArguments(fsdp=..., fsdp_config={'version': 2}))",
    "tensor_parallel": "tensor parallelism splits each attention site's heads over the ranks, so no rank sees whole "
                       "heads",
    "model_parallel": "layers on several devices (device_map) and context or pipeline parallelism are not supported",
}


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


def _is_fsdp1(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return any(isinstance(m, FullyShardedDataParallel) for m in module.modules())


def _is_tensor_parallel(model: nn.Module) -> bool:
    """Tensor-parallel weights: a transformers `tp_plan` model, or DTensor parameters FSDP2 did not make."""
    from torch.distributed.tensor import DTensor

    if (getattr(model, "_tp_size", None) or 1) > 1:
        return True
    made_by_fsdp = set()
    for module in fsdp2_modules(model):
        for group in module._get_fsdp_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                if getattr(fsdp_param, "is_dtensor", False):  # FSDP2 applied over tensor-parallel DTensors
                    return True
                made_by_fsdp.add(id(fsdp_param.sharded_param))
    return any(isinstance(p, DTensor) and id(p) not in made_by_fsdp for p in model.parameters())


def _zero_stage(args, model: nn.Module | None) -> int | None:
    """The DeepSpeed ZeRO stage of a run (from the engine or the Trainer's DeepSpeed config); None if unreadable."""
    if model is not None and callable(getattr(model, "zero_optimization_stage", None)):
        return int(model.zero_optimization_stage())
    config = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)
    spec = getattr(args, "deepspeed", None)
    if config is None and isinstance(spec, dict):
        config = spec
    elif config is None and isinstance(spec, (str, Path)) and Path(spec).is_file():
        try:
            config = json.loads(Path(spec).read_text())
        except (OSError, ValueError):
            config = None
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    return stage if isinstance(stage, int) and not isinstance(stage, bool) else None


def _deepspeed_engine(args, model: nn.Module | None) -> str:
    stage = _zero_stage(args, model)
    return "deepspeed" if stage is not None and stage < 3 else "deepspeed_zero3"


def training_engine(model: nn.Module | None, args=None) -> str:
    """The engine a run trains with, from the Trainer's arguments and the model: one of `ENGINES`.

    Args:
        model: the model the Trainer hands to callbacks (or the user's model in a plain loop).
        args: the `TrainingArguments`, or None outside a Trainer.
    """
    if args is not None and getattr(args, "deepspeed", None) or type(model).__name__ == "DeepSpeedEngine":
        return _deepspeed_engine(args, model)
    if model is not None:
        devices = set((getattr(model, "hf_device_map", None) or {}).values())
        if len(devices) > 1 or getattr(model, "is_parallelizable", False) and getattr(model, "model_parallel", False):
            return "model_parallel"
        if _is_tensor_parallel(model):
            return "tensor_parallel"
        if _is_fsdp1(model):
            return "fsdp1"
        if fsdp2_modules(model):
            return "fsdp2"
    if args is not None and getattr(args, "fsdp", None) and not getattr(args, "use_cpu", False):
        # (with use_cpu=True, transformers 5.23 / accelerate 1.15 ignore `fsdp` and train with DDP: measured)
        # transformers 5 reads a missing fsdp_config["version"] as 2 (`TrainingArguments._setup_fsdp`)
        version = int((getattr(args, "fsdp_config", None) or {}).get("version", 2))
        return "fsdp2" if version == 2 else "fsdp1"
    if args is not None and getattr(args, "parallelism_config", None) is not None:
        config = args.parallelism_config
        if getattr(config, "tp_size", 1) > 1:
            return "tensor_parallel"
        if any(getattr(config, f"{name}_size", 1) > 1 for name in ("cp", "sp")):
            return "model_parallel"
    return "ddp" if world_size() > 1 else "single"


def require(engine: str, feature: str, allowed: tuple[str, ...]) -> None:
    """Refuse `feature` under `engine` with one line naming the engine, why, and what is supported."""
    if engine in allowed:
        return
    if engine in SUPPORTED:
        detail = f"under {engine}, prunetrain supports {SUPPORTED[engine]}"
    else:
        detail = (f"{WHY_REFUSED.get(engine, 'this engine is not supported')}; prunetrain supports single-process, "
                  f"DDP and FSDP2 training, and DeepSpeed ZeRO-1/2 without shrinking")
    raise ValueError(f"{feature}: not supported under {engine}; {detail}.")


def find_ddp(net: nn.Module):
    """The `DistributedDataParallel` wrapper around `net`, if any (the Trainer hands callbacks the inner model).

    Found from the objects that hold `net` (`gc.get_referrers`): DDP keeps its module in its `_modules` dict, which
    its instance dictionary holds, so the wrapper is at most three holders up, through dictionaries only — a few
    reference look-ups per shrink, never a walk over every live object. Objects are matched by `type()` alone, so
    nothing else is touched: a dead weak proxy (torch.compile leaves some) is never dereferenced. A compiled model
    (`torch.compile(DDP(net))`) holds the same DDP, which is what is returned.
    """
    from torch.nn.parallel import DistributedDataParallel

    def is_ddp_of(obj) -> bool:
        return issubclass(type(obj), DistributedDataParallel) and obj.module is net

    if issubclass(type(net), DistributedDataParallel):
        return net
    level: list = [net]
    for _ in range(3):  # `_modules` dict, the instance dictionary, the wrapper
        holders = gc.get_referrers(*level)
        found = next((h for h in holders if is_ddp_of(h)), None)
        if found is not None:
            return found
        level = [h for h in holders if type(h) is dict]
        if not level:
            break
    return None


def _snapshots_of(ddp) -> list[dict]:
    """Copies of `ddp`'s attribute dictionary that hold its current reducer: torch.compile wraps the module's call in
    functions made with `functools.wraps`, which copies the module's `__dict__` (reducer and logger included) into
    each wrapper's own. Found from the objects that hold the reducer (a reference look-up, no walk over every
    object)."""
    reducer = ddp.reducer
    return [holder for holder in gc.get_referrers(reducer)
            if type(holder) is dict and holder is not vars(ddp) and holder.get("reducer") is reducer]


def rebuild_ddp(ddp) -> None:
    """Rebuild DDP's reducer after the wrapped model's parameters changed shape in place (a shrink).

    DDP sizes its gradient buckets when it is built; the parameters keep their identity through a shrink but not
    their size, so the buckets are rebuilt exactly as `DistributedDataParallel.__setstate__` does. Every rank must
    call this (the shape check is a collective); ranks whose shapes differ fail here instead of averaging wrong
    gradients later. Under torch.compile the compiled wrapper's copies of the module's attributes are pointed at the
    new reducer too (else they keep the old one, and its accumulators, alive).
    """
    from torch.nn.parallel.distributed import _verify_param_shape_across_processes

    # The old reducer holds each parameter's gradient accumulator, which remembers the old shape (and the autograd
    # graph reuses a live accumulator): drop every reference to it first, so the new reducer gets fresh ones.
    snapshots = _snapshots_of(ddp) if ddp.reducer is not None else []
    for snapshot in snapshots:
        snapshot["reducer"], snapshot["logger"] = None, None
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
    for snapshot in snapshots:
        snapshot["reducer"], snapshot["logger"] = ddp.reducer, ddp.logger


def original_class(model: nn.Module) -> type:
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
    plain = original_class(model)(model.config)  # built on the CPU: non-persistent buffers get their values
    missing, unexpected = plain.load_state_dict(state, strict=False)
    untied = [k for k in missing if not any(k == t or k.endswith(t) for t in _tied_keys(plain))]
    if unexpected or untied:
        raise ValueError(f"model: the gathered state does not fit a fresh {type(plain).__name__} "
                         f"(missing {untied[:3]}, unexpected {unexpected[:3]}).")
    if hasattr(plain, "tie_weights"):
        plain.tie_weights()
    return plain.eval()


__all__ = ["ENGINES", "SUPPORTED", "WHY_REFUSED", "any_rank", "find_ddp", "gathered_copy", "original_class",
           "rebuild_ddp", "require", "training_engine"]
