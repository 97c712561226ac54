"""Distillation from an unpruned teacher while the student is pruned (Hinton et al. 2015; as CoFi, APT and Minitron
do while they prune).

The student's training loss becomes

    L = (1 − α) · L_CE + α · T² · KL(p_T^teacher ‖ p_T^student),      p_T = softmax(z / T),

with the KL summed over the vocabulary (or the classes) and averaged over the positions the cross-entropy averages
over: the target tokens that are not padding (`labels != -100`) for sequence-to-sequence and causal language models
(the causal logits shifted by one, as the model's own loss is), the examples for classifiers. When the Trainer
passes `num_items_in_batch` (gradient accumulation normalised over the whole optimizer step), the KL sum is divided
by the same count, so both terms are normalised alike. T² keeps the gradient scale of the soft term independent of
T (Hinton et al.).

`DistillationCallback` adds this to any HF `Trainer` / `Seq2SeqTrainer` in one line: at `on_train_begin` it wraps the
student's `forward` (the module the Trainer, DDP or accelerate call), so the `loss` the Trainer back-propagates is
the combined one; evaluation (the model in eval mode) sees the plain cross-entropy. The teacher is a frozen model
given by the user, or — `teacher=None` — a frozen copy of the student taken when training begins (before any head is
pruned; without the hooks others put on the student, refused while masks are attached). Mid-training shrinks change
the student's shapes, never the teacher's. The teacher runs under `torch.no_grad()` in eval mode on the same
inputs, in the Trainer's mixed precision (bf16/fp16 autocast when `args.bf16`/`args.fp16`, whatever wrapper the
student's forward has), replicated on every rank under DDP/FSDP2.

The teacher's compute is counted apart from the student's: its forward FLOPs on every training batch, priced from
the batch's shape by the same exact polynomial the training FLOP meter uses (`prunetrain.bench.step_flops`, fitted
on the frozen teacher, whose parameters need no gradients: forward only), summed over ranks at the end of training
(`teacher_flops`, `distillation.json`, TensorBoard `distill/teacher_flops`). A FLOP budget (`MetricPointsCallback(
max_flops=...)`, the recipes' `train.max_flops`) counts the student's forward and backward only, so a comparison at
equal student FLOPs shows the teacher's beside it.

Hidden-state matching (CoFi, Xia et al. 2022), optional (`hidden_weight` β > 0) adds

    β · Σ_{l ∈ layers} MSE(h_s^l, h_t^l),      MSE(a, b) = Σ_{positions} ‖a − b‖² / (positions · d_model),

where h^l is the output of transformer block l (0-based; the embeddings are not matched) of the student and of the
teacher, layer l of one matched to layer l of the other (pruning heads removes no layer and keeps d_model), over the
positions that are not padding (the attention mask's for the encoder, a causal LM and a classifier; the target
tokens, `labels != -100`, for a decoder). A sequence-to-sequence model matches its encoder's and its decoder's
layers alike. Under gradient accumulation normalised over the whole step (`num_items_in_batch`), each batch's term is
weighted by its share of the step's counted positions, as the KL is.

Resuming: every Trainer checkpoint records the teacher's architecture (tensor names and shapes); a snapshot teacher's
weights are saved with it and restored on resume (`prunetrain.training.distillation_teacher`), so a resumed run equals
an uninterrupted one. A given teacher is not saved: give it again, and a teacher of another architecture is refused.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from prunetrain.bench.step_flops import measuring_step_flops
from prunetrain.engine.heads import unwrap_model
from prunetrain.engine.sharded import fsdp2_modules
from prunetrain.training.base import PrunetrainCallback
from prunetrain.training.distillation_teacher import architecture, check_same_architecture, rebuild_snapshot, \
    replicated_snapshot, snapshot_record, snapshot_tensors
from prunetrain.utils.door import NonNegativeFloat, checked
from prunetrain.utils.validate import check_ints

TASKS = ("seq2seq", "causal", "classes")


def distillation_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor | None,
                    temperature: float, task: str) -> tuple[torch.Tensor, int]:
    """T² · Σ_positions KL(p_T^teacher ‖ p_T^student) over the positions the cross-entropy counts, and their number.

    Args:
        student_logits, teacher_logits: `[B, T, V]` (seq2seq, causal) or `[B, C]` (classes), the same shape.
        labels: `[B, T]` token labels (-100: not counted) or `[B]` class labels (None: every example counts).
        temperature: T > 0.
        task: one of `TASKS`; "causal" compares logits at t with label t + 1.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"teacher: its logits have shape {tuple(teacher_logits.shape)}, the student's "
                         f"{tuple(student_logits.shape)}; the teacher must share the student's vocabulary/classes.")
    if task == "causal":
        student_logits, teacher_logits = student_logits[:, :-1], teacher_logits[:, :-1]
        labels = labels[:, 1:] if labels is not None else None
    vocab = student_logits.shape[-1]
    student = student_logits.reshape(-1, vocab).float()
    teacher = teacher_logits.reshape(-1, vocab).float()
    if labels is not None and task != "classes":
        keep = labels.reshape(-1) != -100
        student, teacher = student[keep], teacher[keep]
    log_p_student = F.log_softmax(student / temperature, dim=-1)
    log_p_teacher = F.log_softmax(teacher / temperature, dim=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum()
    return kl * temperature ** 2, student.shape[0]


def hidden_state_mse(student_outputs, teacher_outputs, inputs: dict, task: str,
                     layers: tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ_l MSE(h_s^l, h_t^l) over the chosen layers of each stack (module doc), a float32 scalar.

    Args:
        student_outputs, teacher_outputs: model outputs computed with `output_hidden_states=True`.
        inputs: the batch (its `attention_mask` and `labels` say which positions count).
        task: one of `TASKS`; "seq2seq" matches the encoder's and the decoder's hidden states.
        layers: 0-based block indices (each stack's), None: every block.
    """
    labels = inputs.get("labels")
    if task == "seq2seq":
        streams = [("encoder_hidden_states", inputs.get("attention_mask")),
                   ("decoder_hidden_states", labels != -100 if labels is not None else None)]
    else:
        streams = [("hidden_states", inputs.get("attention_mask"))]
    total = torch.zeros((), dtype=torch.float32)
    for key, mask in streams:
        student, teacher = getattr(student_outputs, key, None), getattr(teacher_outputs, key, None)
        if student is None or teacher is None:
            raise ValueError(f"hidden_weight: the model returns no {key} with output_hidden_states=True, so its "
                             f"hidden states cannot be matched; set hidden_weight=0.")
        blocks = len(student) - 1  # entry 0 is the embeddings' output
        for layer in range(blocks) if layers is None else layers:
            if layer >= blocks:
                raise ValueError(f"hidden_layers: layer {layer} is not allowed; the model's {key} come from "
                                 f"{blocks} blocks (0 to {blocks - 1}).")
            a, b = student[layer + 1].float(), teacher[layer + 1].float().to(student[layer + 1].device)
            if a.shape != b.shape:
                raise ValueError(f"hidden_weight: the student's {key}[{layer + 1}] has shape {tuple(a.shape)}, the "
                                 f"teacher's {tuple(b.shape)}; hidden states are matched only at equal widths.")
            squared = (a - b).pow(2).sum(-1)  # [batch, positions]
            if mask is not None:
                keep = mask.to(squared.device).bool()
                squared = squared[keep]
            total = total.to(squared.device) + squared.sum() / (max(squared.numel(), 1) * a.shape[-1])
    return total


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` without the hooks others put on it (a FLOP meter's, a mask's: they would count or mask
    the copy's forwards as the student's) and without a forward others replaced (accelerate's mixed-precision
    wrapper: the teacher's precision is the callback's, the same for a copy taken at the start and one restored on
    resume), refused while head masks are attached (a copy would share their values). Of a `fully_shard`-ed (FSDP2)
    model: a whole replica on every rank, its weights gathered (`replicated_snapshot`; a collective)."""
    from prunetrain.engine.mask import attached_masks

    if attached_masks(model):
        raise ValueError("teacher: the student has head masks attached when training begins, so a copy of it would "
                         "not be the unpruned model; give the teacher model explicitly (teacher=...).")
    if fsdp2_modules(model):  # a deep copy would hold the shards without FSDP's hooks: gathered whole instead
        return replicated_snapshot(model)
    teacher = copy.deepcopy(model)
    for module in teacher.modules():
        for wrapped in ("forward", "_original_forward"):  # accelerate's autocast forward: the callback sets precision
            module.__dict__.pop(wrapped, None)
        for hooks in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks"):
            getattr(module, hooks).clear()
        for kwargs_flags in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):
            getattr(module, kwargs_flags, {}).clear()
    return teacher


def _task_of(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    name = type(model).__name__
    if "ForCausalLM" in name or "LMHead" in name:
        return "causal"
    if "ForSequenceClassification" in name or "ForImageClassification" in name:
        return "classes"
    raise ValueError(f"model: distillation covers sequence-to-sequence and causal language models and classifiers; "
                     f"{name} is none of them.")


@checked(own=("teacher", "output_dir"))
class DistillationCallback(PrunetrainCallback):
    """Distil from a frozen teacher while training (and pruning) the student:
    L = (1 − α)·CE + α·T²·KL + β·Σ_l MSE(h_s^l, h_t^l) (module doc).

    Args:
        teacher: the frozen teacher (moved to the student's device when training begins; its parameters get no
            gradients; under DDP/FSDP2 every rank holds a whole replica), or None: a frozen copy of the student
            taken when training begins. A given teacher is not saved with the checkpoints: to resume, give it
            again (one of another architecture — tensor names or shapes — is refused); a copy is saved with every
            checkpoint and restored on resume.
        alpha: α in [0, 1], the weight of the soft term (0 with hidden_weight 0: plain training, bit-identical).
        temperature: T > 0.
        hidden_weight: β >= 0, the weight of hidden-state matching (0: off).
        hidden_layers: the 0-based blocks whose outputs are matched (in each stack of a sequence-to-sequence
            model), None: every block.
        output_dir, tensorboard: as every prunetrain callback (`distill/kl`, `distill/cross_entropy` and, with
            hidden-state matching, `distill/hidden` are logged).
    """

    name = "distillation"

    def __init__(self, teacher: nn.Module | None = None, alpha: float = 0.5, temperature: float = 2.0,
                 hidden_weight: NonNegativeFloat = 0.0, hidden_layers=None, output_dir: str | None = None,
                 tensorboard: bool = True):
        super().__init__(output_dir, tensorboard)
        if teacher is not None and not isinstance(teacher, nn.Module):
            raise ValueError(f"teacher: {teacher!r} is not a torch module; give the teacher model, or None to "
                             f"distil from a copy of the student taken when training begins.")
        for argument, value, low, high in (("alpha", alpha, 0.0, 1.0), ("temperature", temperature, 0.0, math.inf)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high or (argument == "temperature" and value <= 0):
                allowed = "a number in [0, 1]" if argument == "alpha" else "a finite number > 0"
                raise ValueError(f"{argument}: {value!r} is not allowed; expected {allowed}.")
        self.teacher, self.alpha, self.temperature = teacher, float(alpha), float(temperature)
        self.hidden_weight = float(hidden_weight)
        self.hidden_layers = None if hidden_layers is None else check_ints("hidden_layers", hidden_layers, minimum=0)
        if self.hidden_layers is not None and len(set(self.hidden_layers)) != len(self.hidden_layers):
            raise ValueError(f"hidden_layers: {list(hidden_layers)!r} names a layer twice; name each layer once.")
        self._recorded: dict = {}  # what the checkpoint being resumed recorded of its teacher
        self.snapshot = teacher is None
        self.last: dict[str, float] = {}
        # this process's teacher forward FLOPs (summed over ranks at the end of training); None: not countable
        self.teacher_flops: int | None = 0
        self._teacher_fit = None
        self._student: nn.Module | None = None
        self._task: str | None = None
        self._autocast: tuple[str, torch.dtype | None] = ("cpu", None)  # the teacher's (device type, half dtype)
        self._pending = None  # (teacher outputs, inputs) of a forward whose loss the Trainer computes (loss_func)

    # -- Trainer events ------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state, model)
        student = unwrap_model(model)
        self._task = _task_of(student)
        if self.snapshot:  # on resume, the copy taken when the run began comes back from the checkpoint
            self.teacher = frozen_copy(student) if state.global_step <= 0 else None
        elif self.teacher is student or any(p is q for p in self.teacher.parameters() for q in student.parameters()):
            raise ValueError("teacher: it shares parameters with the student being trained; give a separate (frozen) "
                             "model, or teacher=None for a copy of the student taken when training begins.")
        if self._restore(args, state):
            self._resume_teacher(student, Path(args.output_dir) / f"checkpoint-{state.global_step}")
        device = next(student.parameters()).device
        self.teacher.to(device).eval().requires_grad_(False)
        # the teacher runs in the Trainer's mixed precision (autocast), whatever wrapper the student's forward has
        half = torch.bfloat16 if getattr(args, "bf16", False) else torch.float16 if getattr(args, "fp16", False) \
            else None
        self._autocast = (device.type, half)
        if self._student is not student:
            self._wrap(student)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and self.last and "loss" in logs:
            values = {f"distill/{k}": v for k, v in self.last.items()}  # the last training step's two terms
            logs.update(values)  # the console and the callbacks after this one
            if state.log_history and state.log_history[-1].get("step") == state.global_step:
                state.log_history[-1].update(values)  # the Trainer appended this step's record just before on_log
            for key, value in self.last.items():
                self._tb_scalar(f"distill/{key}", value, state.global_step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        from prunetrain.training.compute import _sum_over_ranks

        self._unwrap()
        if self.teacher_flops is not None:
            self.teacher_flops = _sum_over_ranks(self.teacher_flops, self.teacher)
        self._write_json("distillation.json", {"alpha": self.alpha, "temperature": self.temperature,
                                               "teacher": "snapshot" if self.snapshot else "given",
                                               "teacher_forward_flops": self.teacher_flops})
        if self.teacher_flops is not None:
            self._tb_scalar("distill/teacher_flops", float(self.teacher_flops), state.global_step)
        super().on_train_end(args, state, control, **kwargs)

    # -- the combined loss ---------------------------------------------------------------------------------------
    def _wrap(self, student: nn.Module) -> None:
        self._unwrap()
        original = student.forward

        @functools.wraps(original)
        def forward(*args, **kwargs):
            if measuring_step_flops():  # a FLOP probe of the student (the training meter's fit): the student alone
                return original(*args, **kwargs)
            matching = self.hidden_weight > 0 and student.training
            outputs = original(*args, **({**kwargs, "output_hidden_states": True} if matching else kwargs))
            loss = getattr(outputs, "loss", None)
            if not student.training or (self.alpha == 0.0 and not matching):
                return outputs
            self._check_consumed()
            if loss is None and "labels" in kwargs:
                return outputs  # a model that computes no loss of its own: nothing to combine with
            device_type, half = self._autocast
            precision = torch.autocast(device_type, dtype=half) if half is not None else contextlib.nullcontext()
            with torch.no_grad(), precision:
                teacher_outputs = self.teacher(*args, **({**kwargs, "output_hidden_states": True} if matching
                                                         else kwargs))
            self._count_teacher(kwargs)
            if loss is None:  # the Trainer took the labels to compute the loss itself: `loss_func` combines it
                self._pending = (teacher_outputs, kwargs)
                return outputs
            outputs.loss = self._combined(loss, outputs, teacher_outputs, kwargs)
            return outputs

        student.forward = forward
        self._student = student

    def loss_func(self, base):
        """A `compute_loss_func` for a Trainer that computes the loss outside the model, where the model is called
        without labels: label smoothing (`label_smoothing_factor` > 0: give `base=LabelSmoother(epsilon=ε)`) or a
        loss of your own (e.g. normalised over every rank's tokens). `base(outputs, labels, num_items_in_batch=...)`
        is the cross-entropy term; the teacher's terms, prepared by the student's forward, are combined with it
        as the module doc says. Without it such a Trainer's first training step raises (distillation is never
        silently off)."""
        def compute(outputs, labels, num_items_in_batch=None):
            loss = base(outputs, labels, num_items_in_batch=num_items_in_batch)
            if self._pending is None:  # evaluation, or nothing distilled
                return loss
            (teacher_outputs, inputs), self._pending = self._pending, None
            return self._combined(loss, outputs, teacher_outputs,
                                  {**inputs, "labels": labels, "num_items_in_batch": num_items_in_batch})

        return compute

    def _check_consumed(self) -> None:
        if self._pending is not None:
            self._pending = None
            raise ValueError("DistillationCallback: the Trainer computed the loss outside the model (it takes the "
                             "labels for label_smoothing_factor > 0 or a compute_loss_func), so the distillation "
                             "terms were never added; give the Trainer compute_loss_func=callback.loss_func(base) "
                             "with base the loss it computes (e.g. LabelSmoother(epsilon=ε)).")

    def on_step_end(self, args, state, control, **kwargs):
        self._check_consumed()

    def _combined(self, loss: torch.Tensor, outputs, teacher_outputs, inputs: dict) -> torch.Tensor:
        """(1 − α)·CE + α·T²·KL (+ β·Σ_l MSE), each term normalised as the module doc says."""
        kl, count = distillation_kl(outputs.logits, teacher_outputs.logits.to(outputs.logits.dtype),
                                    inputs.get("labels"), self.temperature, self._task)
        items = inputs.get("num_items_in_batch")
        share = count / items if items is not None else 1.0  # this batch's share of the step's counted positions
        soft = kl / (items if items is not None else max(count, 1))
        self.last = {"kl": float(soft.detach()), "cross_entropy": float(loss.detach())}
        combined = (1.0 - self.alpha) * loss + self.alpha * soft.to(loss.dtype)
        if self.hidden_weight > 0:
            hidden = hidden_state_mse(outputs, teacher_outputs, inputs, self._task, self.hidden_layers) * share
            self.last["hidden"] = float(hidden.detach())
            combined = combined + self.hidden_weight * hidden.to(loss.dtype)
        return combined

    def _count_teacher(self, inputs: dict) -> None:
        from prunetrain.bench.step_flops import StepFlopModel, batch_shape

        if self.teacher_flops is None:
            return
        if self._teacher_fit is None:  # forward only: the frozen teacher's parameters take no gradients
            try:
                self._teacher_fit = StepFlopModel.fit(self.teacher, inputs)
            except ValueError as err:  # as the training FLOP meter: a model not countable from shapes is said so
                self._log(f"distillation: the teacher's FLOPs are not counted ({err})")
                self.teacher_flops = None
                return
        self.teacher_flops += self._teacher_fit(batch_shape(self.teacher, inputs))

    def _unwrap(self) -> None:
        if self._student is not None and "forward" in vars(self._student):
            del self._student.forward
        self._student = None

    # -- checkpoint state: the settings, the teacher's architecture and, for a snapshot teacher, its weights ---
    def _settings(self) -> dict:
        return {"alpha": self.alpha, "temperature": self.temperature, "hidden_weight": self.hidden_weight,
                "hidden_layers": list(self.hidden_layers) if self.hidden_layers is not None else None}

    def state_dict(self) -> dict:
        state = {**self._settings(), "snapshot": self.snapshot, "teacher_flops": self.teacher_flops}
        if self.teacher is not None:
            state["teacher_architecture"] = architecture(self.teacher)
            if self.snapshot:
                state["teacher_record"] = snapshot_record(self.teacher)
        return state

    def tensor_state(self) -> dict[str, torch.Tensor]:
        return snapshot_tensors(self.teacher) if self.snapshot and self.teacher is not None else {}

    def load_state_dict(self, state: dict) -> None:
        saved = {**self._settings(), "hidden_weight": 0.0, "hidden_layers": None,
                 **{k: state[k] for k in self._settings() if k in state}}
        for key, value in self._settings().items():
            if saved[key] != value:
                raise ValueError(f"{key}: the checkpoint was trained with {key}={saved[key]!r}, not {value!r}; "
                                 f"resume with the settings it was trained with.")
        self.teacher_flops = state.get("teacher_flops", 0)
        self._recorded = {"architecture": state.get("teacher_architecture"), "record": state.get("teacher_record")}

    def load_tensor_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self._recorded["tensors"] = tensors

    def _resume_teacher(self, student: nn.Module, checkpoint: Path) -> None:
        """The snapshot teacher rebuilt from the checkpoint, or the given one checked against its record."""
        recorded, self._recorded = self._recorded, {}
        if self.snapshot:
            self.teacher = rebuild_snapshot(student, recorded.get("record") or {}, recorded.get("tensors"),
                                            str(checkpoint))
        check_same_architecture(recorded.get("architecture"), self.teacher)


__all__ = ["DistillationCallback", "TASKS", "distillation_kl", "frozen_copy", "hidden_state_mse"]
