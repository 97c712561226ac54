"""The distillation teacher across a checkpoint: what `DistillationCallback` records of it in every Trainer
checkpoint, and how a resumed run gets the same teacher back.

A teacher given by the user is not saved (the user gives it again when resuming); its architecture — the name and
shape of every tensor of its `state_dict` — is recorded, and a resumed run whose teacher differs from it is refused.
A snapshot teacher (a frozen copy of the student taken when training began, before any head was pruned) exists
nowhere else, so its weights are saved with the callback's state (`prunetrain-distillation.safetensors`, written
before the JSON that marks the state complete) together with its config, class and attention implementation; a
resumed run rebuilds it from these — the same class from the config, shrunk to the head layout the config records,
the weights loaded exactly — so the rest of the run sees the teacher the uninterrupted run saw.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY
from prunetrain.engine.persist import shrink_to_layout
from prunetrain.training.distributed import original_class
from prunetrain.training.state import RngState

TEACHER_PREFIX = "teacher."


def architecture(teacher: nn.Module) -> dict[str, list[int]]:
    """{tensor name: shape} of the teacher's `state_dict` (parameters and persistent buffers)."""
    return {name: list(tensor.shape) for name, tensor in teacher.state_dict().items()}


def architecture_difference(recorded: dict[str, list[int]], teacher: nn.Module) -> str | None:
    """The first way `teacher`'s tensors differ from `recorded` ones, in words; None if they do not."""
    own = architecture(teacher)
    missing, extra = sorted(recorded.keys() - own.keys()), sorted(own.keys() - recorded.keys())
    reshaped = sorted(k for k in recorded.keys() & own.keys() if recorded[k] != own[k])
    if reshaped:
        return f"tensor {reshaped[0]!r} is {tuple(own[reshaped[0]])}, recorded {tuple(recorded[reshaped[0]])}"
    if missing:
        return f"it has no tensor {missing[0]!r}"
    if extra:
        return f"it has a tensor {extra[0]!r} the recorded one has not"
    return None


def check_same_architecture(recorded: dict[str, list[int]] | None, teacher: nn.Module) -> None:
    """Refuse, in one line, a teacher whose tensors differ in name or shape from those recorded in a checkpoint."""
    if recorded is None:  # a checkpoint written before the architecture was recorded
        return
    detail = architecture_difference(recorded, teacher)
    if detail is not None:
        raise ValueError(f"teacher: it is not the architecture of the teacher the checkpoint was trained with "
                         f"({detail}); give the same teacher model to resume.")


def snapshot_record(teacher: nn.Module) -> dict:
    """What rebuilds a snapshot teacher besides its weights: its class, config and attention implementation."""
    config = getattr(teacher, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return {}
    cls = original_class(teacher)  # a sharded student's own class, not FSDP's subclass of it
    return {"class": f"{cls.__module__}.{cls.__qualname__}",
            "config": json.loads(config.to_json_string(use_diff=False)),
            "attn_implementation": getattr(config, "_attn_implementation", None)}


def snapshot_tensors(teacher: nn.Module) -> dict[str, torch.Tensor]:
    """The snapshot teacher's weights for the checkpoint (copies: tied weights share storage, which safetensors
    refuses; each name gets its own copy of the same values)."""
    return {TEACHER_PREFIX + name: tensor.detach().cpu().clone() for name, tensor in teacher.state_dict().items()}


def rebuild_snapshot(student: nn.Module, record: dict, tensors: dict[str, torch.Tensor] | None,
                     checkpoint: str) -> nn.Module:
    """The snapshot teacher saved in `checkpoint`, rebuilt as the student's class from its recorded config.

    Raises:
        ValueError: the checkpoint holds no teacher weights (written by a run with a given teacher, or by an older
            prunetrain), or they do not fit the rebuilt model (one line each).
    """
    weights = {k[len(TEACHER_PREFIX):]: v for k, v in (tensors or {}).items() if k.startswith(TEACHER_PREFIX)}
    if not weights or not record.get("config"):
        raise ValueError(f"teacher: {checkpoint!r} holds no teacher weights (the run that wrote it distilled from a "
                         f"given teacher, which checkpoints do not hold); give that teacher model (teacher=...) to "
                         f"resume.")
    cls = original_class(student)
    if record.get("class") != f"{cls.__module__}.{cls.__qualname__}":
        raise ValueError(f"teacher: {checkpoint!r} holds a teacher of class {record.get('class')}, not the student's "
                         f"{cls.__module__}.{cls.__qualname__}; resume with the model class the run was trained with.")
    return _rebuilt(cls, student, record, weights, f"the teacher saved in {checkpoint!r}", " to resume")


def replicated_snapshot(student: nn.Module) -> nn.Module:
    """The snapshot teacher of a `fully_shard`-ed (FSDP2) student: a whole, unsharded replica on every rank.

    The teacher takes no gradients and has no optimizer state, so sharding it would save only its weights' memory
    and cost an all-gather per layer per forward; a replica runs on each rank alone. Every parameter is all-gathered
    on every rank (a collective: every rank calls it, at `on_train_begin`), and the model is rebuilt as the student's
    own class from its config, shrunk to the head layout the config records, with the gathered weights loaded
    exactly; the random-number streams are left as they were (a one-process run's deep copy draws none).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(student, options=StateDictOptions(full_state_dict=True))
    weights = {name: tensor.detach().cpu().clone() for name, tensor in state.items()}
    return _rebuilt(original_class(student), student, snapshot_record(student), weights, "the sharded student", "")


def _rebuilt(cls: type, student: nn.Module, record: dict, weights: dict[str, torch.Tensor], source: str,
             when: str) -> nn.Module:
    """`cls` built from `record`'s config (shrunk to its head layout) with `weights` loaded exactly; refused in one
    line (naming `source`; the remedy ends with `when`) where they do not fit or a tensor's dtype would differ."""
    dtypes = {t.dtype for t in weights.values() if t.is_floating_point()}
    rng = RngState.capture()  # building the model initialises weights: leave the training stream untouched
    try:
        config = dict(record["config"])
        layout = config.pop(LAYOUT_CONFIG_KEY, None)  # built whole, then shrunk to it (as load_pruned does)
        teacher = cls._from_config(type(student.config).from_dict(config),
                                   attn_implementation=record.get("attn_implementation"),
                                   **({"dtype": next(iter(dtypes))} if len(dtypes) == 1 else {}))
        shrink_to_layout(teacher, layout)  # a student already pruned when training began: its teacher was too
        detail = architecture_difference({k: list(v.shape) for k, v in weights.items()}, teacher)
        if detail is None:
            teacher.load_state_dict(weights, strict=True)
    except (RuntimeError, ValueError) as err:
        detail = str(err).strip().splitlines()[0]
    finally:
        rng.restore()
    if detail is not None:  # e.g. a peft student: its copy held adapter layers its config does not build
        raise ValueError(f"teacher: {source} cannot be rebuilt as {cls.__name__} from its config ({detail}); give "
                         f"the teacher model (teacher=...){when}.")
    for name, tensor in teacher.state_dict().items():
        if tensor.dtype != weights[name].dtype:
            raise ValueError(f"teacher: {source} cannot be rebuilt exactly ({name!r} is {weights[name].dtype} in "
                             f"it, {tensor.dtype} in a rebuilt {cls.__name__}); give the teacher model "
                             f"(teacher=...){when}.")
    return teacher


__all__ = ["architecture", "architecture_difference", "check_same_architecture", "rebuild_snapshot",
           "replicated_snapshot", "snapshot_record", "snapshot_tensors"]
