"""State that lets a pruned training run survive a crash: the callbacks' own checkpoint files, the RNG state a
pruning curve must leave untouched, finding the last complete checkpoint and rebuilding a shrunk model's shape
before `trainer.train(resume_from_checkpoint=...)`.

Each callback writes `prunetrain-<name>.json` (and `.safetensors` for tensors) into `checkpoint-N/` in `on_save`,
after the Trainer's own files, so a checkpoint that holds them is complete.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Iterable

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from prunetrain.engine.heads import LAYOUT_CONFIG_KEY, HeadLayout, all_sites, unwrap_model
from prunetrain.engine.peft_support import is_peft_wrapper
from prunetrain.engine.persist import apply_saved_masks, saved_masks_of, shrink_to_layout
from prunetrain.engine.remote_code import SPEC_KEY
from prunetrain.utils.door import checked
from prunetrain.utils.files import read_json

TENSORS_KEY = "_prunetrain_tensors"  # in a callback's JSON state: whether a .safetensors file belongs to it


def save_callback_state(checkpoint: Path, name: str, data: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Write one callback's JSON state (and tensors, if any) into a Trainer checkpoint directory.

    The tensors go first and the JSON last, each written to a temporary name and renamed, so a process killed
    part-way leaves either no JSON or a JSON whose tensors are all on disk: the JSON marks the state complete.
    """
    checkpoint.mkdir(parents=True, exist_ok=True)
    tensor_path = checkpoint / f"prunetrain-{name}.safetensors"
    if tensors:
        partial = tensor_path.with_name(tensor_path.name + ".partial")
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(partial))
        os.replace(partial, tensor_path)
    json_path = checkpoint / f"prunetrain-{name}.json"
    partial = json_path.with_name(json_path.name + ".partial")
    partial.write_text(json.dumps({**data, TENSORS_KEY: bool(tensors)}))
    os.replace(partial, json_path)


def load_callback_state(checkpoint: Path, name: str, owner: str) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """Read what `save_callback_state` wrote; a checkpoint without it cannot be resumed by callback `owner`."""
    path = checkpoint / f"prunetrain-{name}.json"
    if not path.is_file():
        raise ValueError(_missing_state(checkpoint, name, owner))
    data = read_json(path, "resume", allow_nan=True)  # a key given twice is refused; json.dumps wrote it (NaN ok)
    has_tensors = data.pop(TENSORS_KEY, None)
    tensors = checkpoint / f"prunetrain-{name}.safetensors"
    if has_tensors and not tensors.is_file():
        raise ValueError(f"resume: {str(checkpoint)!r} has {path.name} but not the {tensors.name} it was saved "
                         f"with, so {owner}'s pruning state cannot be restored exactly.")
    return data, (load_file(str(tensors)) if tensors.is_file() else None)


def _missing_state(checkpoint: Path, name: str, owner: str) -> str:
    """Why a checkpoint lacks `owner`'s JSON state: the run had no such callback, or — when the state's tensors or a
    half-written file are there — the checkpoint is incomplete (cut short while `owner` was saving)."""
    json_name = f"prunetrain-{name}.json"
    parts = [f"prunetrain-{name}.safetensors", f"prunetrain-{name}.safetensors.partial", json_name + ".partial"]
    present = [part for part in parts if (checkpoint / part).exists()]
    if present:
        return (f"resume: {str(checkpoint)!r} is incomplete: it holds {present[0]} but not {json_name}, which "
                f"{owner} writes last (the run was stopped while it saved its state); resume from the last complete "
                f"checkpoint (prunetrain.training.state.last_complete_checkpoint) or an earlier one.")
    others = sorted(p.name for p in checkpoint.glob("prunetrain-*.json"))
    if others:
        return (f"resume: {str(checkpoint)!r} has no {json_name}: either the run that wrote it had no {owner}, or "
                f"the checkpoint is incomplete ({', '.join(others)} were saved, then the run stopped before {owner}'s "
                f"state); resume with the callbacks of that run, or from an earlier complete checkpoint.")
    return (f"resume: {str(checkpoint)!r} has no {json_name}; it was not written by a run with {owner}, so its "
            f"pruning state cannot be restored.")


def optimizer_state(prefix: str, optimizer: torch.optim.Optimizer) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """A small optimizer's state as (JSON step counts, tensors), keyed `<prefix>.<param index>[.<field>]`."""
    steps, tensors = {}, {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if key == "step":
                steps[f"{prefix}.{index}"] = float(value)
            elif torch.is_tensor(value):
                tensors[f"{prefix}.{index}.{key}"] = value
    return steps, tensors


def load_optimizer_state(prefix: str, optimizer: torch.optim.Optimizer, steps: dict[str, float],
                         tensors: dict[str, torch.Tensor]) -> None:
    """Inverse of `optimizer_state`."""
    saved = optimizer.state_dict()
    restored: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith(prefix + "."):
            index, field = key[len(prefix) + 1:].split(".", 1)
            restored.setdefault(int(index), {})[field] = value
    for index in restored:
        restored[index]["step"] = torch.tensor(steps.get(f"{prefix}.{index}", 0.0))
    saved["state"] = restored
    optimizer.load_state_dict(saved)


class RngState:
    """Python, NumPy and torch (CPU and CUDA) RNG states, to leave training randomness untouched."""

    def __init__(self, states):
        self.states = states

    @classmethod
    def capture(cls) -> "RngState":
        import numpy as np

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return cls((random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda))

    def restore(self) -> None:
        import numpy as np

        py, np_state, cpu, cuda = self.states
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def checkpoint_step(checkpoint: str | Path) -> int | None:
    """The global step N of a Trainer's `checkpoint-N` directory (None for another name)."""
    step = Path(checkpoint).name.removeprefix("checkpoint-")
    return int(step) if step.isdigit() else None


@checked
def last_complete_checkpoint(output_dir: str | Path, callbacks: Iterable | None = None) -> str | None:
    """The newest `checkpoint-N` in `output_dir` that holds the Trainer's state and prunetrain's (written last, in
    `on_save`), so a checkpoint cut short by a crash is skipped; None if there is none.

    Args:
        output_dir: the Trainer's output directory.
        callbacks: the run's callbacks (any list; those that save prunetrain state count). A checkpoint must then
            hold the state of every one of them — a kill between two callbacks' `on_save` leaves it incomplete.
            Without it, the state of at least one prunetrain callback is required.
    """
    names = {c.name for c in callbacks or () if callable(getattr(c, "tensor_state", None))}
    candidates = []
    for path in Path(output_dir).glob("checkpoint-*"):
        step = checkpoint_step(path)
        saved = {p.name.removeprefix("prunetrain-").removesuffix(".json") for p in path.glob("prunetrain-*.json")}
        if step is not None and saved and names <= saved and (path / "trainer_state.json").is_file():
            candidates.append((step, path))
    return str(max(candidates)[1]) if candidates else None


@checked
def restore_layout(model: nn.Module, checkpoint: str | Path) -> HeadLayout:
    """Shrink a freshly built model to the head layout recorded in a checkpoint's `config.json`, and attach the
    masks saved with it (a checkpoint taken while a mask or gates were attached).

    Needed before `trainer.train(resume_from_checkpoint=...)` when the run pruned with `mode="shrink"`: the
    Trainer loads the checkpoint's (smaller) weights before any callback runs, so the model must already have the
    checkpoint's shape. A checkpoint of an unshrunk, unmasked model leaves the model as it is. The prunetrain
    callbacks of the resumed run take back the masks they had attached (their state holds them).

    Args:
        model: the freshly built model (or its DDP wrapper).
        checkpoint: a `checkpoint-N` directory written by the Trainer.

    Returns:
        The model's head layout afterwards.
    """
    config = Path(checkpoint) / "config.json"
    if not config.is_file() and (Path(checkpoint) / PEFT_ADAPTER_CONFIG).is_file():
        config = _peft_record(Path(checkpoint))  # a PeftModel's checkpoint: adapters only, and prunetrain's record
    if not config.is_file():
        raise ValueError(f"checkpoint: {str(checkpoint)!r} has no config.json; it is not a Trainer checkpoint.")
    data = read_json(config, "checkpoint")
    try:
        layout = shrink_to_layout(model, data.get(LAYOUT_CONFIG_KEY) or {})
    except ValueError as err:
        raise ValueError(f"checkpoint: {str(checkpoint)!r} does not fit this model ({err}).") from None
    net = unwrap_model(model)
    apply_saved_masks(net, saved_masks_of(data, net, f"checkpoint: {str(checkpoint)!r}"))
    return layout


PEFT_RECORD = "prunetrain_peft.json"
"""What a Trainer checkpoint of a peft model (adapter weights only, no config.json) records of the base model for
`restore_layout`: the head layout (`prunetrain_heads`) and the attached masks, as a pruned directory's config.json
records them."""
PEFT_ADAPTER_CONFIG = "adapter_config.json"


def save_peft_record(checkpoint: Path, model: nn.Module | None) -> None:
    """Write `PEFT_RECORD` into a Trainer checkpoint of a peft `model` (nothing for any other model: its
    config.json records the same). Written to a temporary name and renamed, before the callbacks' state."""
    while model is not None and not is_peft_wrapper(model) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module  # DDP / accelerate around the PeftModel
    if model is None or not is_peft_wrapper(model):
        return
    from prunetrain.engine.mask import saved_mask_record

    net = unwrap_model(model)
    record = {LAYOUT_CONFIG_KEY: dict(getattr(net.config, LAYOUT_CONFIG_KEY, None) or {}),
              SPEC_KEY: {"masks": saved_mask_record(net)}}
    checkpoint.mkdir(parents=True, exist_ok=True)
    partial = checkpoint / (PEFT_RECORD + ".partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, checkpoint / PEFT_RECORD)


def _peft_record(checkpoint: Path) -> Path:
    record = checkpoint / PEFT_RECORD
    if not record.is_file():
        raise ValueError(f"checkpoint: {str(checkpoint)!r} holds peft adapters only and no {PEFT_RECORD} (written by "
                         f"prunetrain's callbacks), so the head layout its adapters were saved with is unknown; "
                         f"resume from a checkpoint written by a run with a prunetrain callback.")
    return record


def guard_weight_loading(model: nn.Module) -> None:
    """Make `model.load_state_dict` of weights whose attention shapes differ from the model's fail with one line
    that says what to do, instead of torch's size-mismatch listing: the Trainer loads a checkpoint into the model it
    was given when resuming (a shrunk checkpoint into a freshly built full-size model) and at the end of training
    with `load_best_model_at_end` (a checkpoint from before a shrink into the shrunk model). Installed once per
    model by the pruning callbacks (a `load_state_dict` pre-hook that only reads shapes). On a peft `PeftModel` the
    wrapper is guarded too: the Trainer loads a checkpoint's adapters into it."""
    while not is_peft_wrapper(model) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    for net in {id(m): m for m in (unwrap_model(model), model if is_peft_wrapper(model) else None) if m}.values():
        if not vars(net).get("_prunetrain_load_guard", False):  # vars: a PeftModel forwards unknown attributes
            net.register_load_state_dict_pre_hook(_check_head_shapes)
            net._prunetrain_load_guard = True


def _check_head_shapes(module, state_dict, prefix, *args) -> None:
    if prefix:  # a load into a submodule of the model: not the Trainer's
        return
    modules = {id(m): name for name, m in module.named_modules()}
    for site in all_sites(module):
        for part in (site.module, site.out_proj):
            for name, tensor in [*part.named_parameters(recurse=True), *part.named_buffers(recurse=True)]:
                key = f"{modules[id(part)]}.{name}".lstrip(".")
                theirs = state_dict.get(key)
                if theirs is not None and tuple(theirs.shape) != tuple(tensor.shape):
                    raise ValueError(_shape_message(site.info, key, tuple(theirs.shape), tuple(tensor.shape)))


def _shape_message(site, key: str, theirs: tuple, own: tuple) -> str:
    shapes = f"tensor {key!r} of site {site.name!r} is {theirs} in them, {own} in the model"
    units, short = ("attention heads", "heads") if site.unit == "heads" else ("FFN neurons", "FFN neurons")
    if torch.Size(theirs).numel() < torch.Size(own).numel():
        return (f"model: the weights being loaded have fewer {units} than the model ({shapes}): they are "
                f"a checkpoint of a run that shrank its {short}; give the model their layout first with "
                f"prunetrain.restore_layout(model, checkpoint), or load it with prunetrain.load_pruned(checkpoint), "
                f"then resume with trainer.train(resume_from_checkpoint=checkpoint).")
    return (f"model: the weights being loaded have more {units} than the model ({shapes}): they were saved "
            f"before the model was shrunk, and a shrunk model cannot take {short} back (load_best_model_at_end does "
            f"this when the best checkpoint is from before a shrink); set load_best_model_at_end=False, or load that "
            f"checkpoint as a model of its own with prunetrain.load_pruned(checkpoint) or from_pretrained(checkpoint, "
            f"trust_remote_code=True).")


__all__ = ["RngState", "guard_weight_loading", "last_complete_checkpoint", "restore_layout"]
