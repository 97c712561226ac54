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
the student's shapes, never the teacher's. The teacher runs under `torch.no_grad()` in eval mode on the same inputs,
replicated on every rank under DDP/FSDP2.

The teacher's compute is counted apart from the student's: its forward FLOPs on every training batch, priced from
the batch's shape by the same exact polynomial the training FLOP meter uses (`prunetrain.bench.step_flops`, fitted
on the frozen teacher, whose parameters need no gradients: forward only), summed over ranks at the end of training
(`teacher_flops`, `distillation.json`, TensorBoard `distill/teacher_flops`). A FLOP budget (`MetricPointsCallback(
max_flops=...)`, the recipes' `train.max_flops`) counts the student's forward and backward only, so a comparison at
equal student FLOPs shows the teacher's beside it.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from prunetrain.engine.heads import unwrap_model
from prunetrain.training.base import PrunetrainCallback
from prunetrain.utils.validate import check_bool

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


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy of `model` without the hooks others put on it (a FLOP meter's, a mask's: they would count or mask
    the copy's forwards as the student's), refused while head masks are attached (a copy would share their values)."""
    from prunetrain.engine.mask import attached_masks

    if attached_masks(model):
        raise ValueError("teacher: the student has head masks attached when training begins, so a copy of it would "
                         "not be the unpruned model; give the teacher model explicitly (teacher=...).")
    teacher = copy.deepcopy(model)
    for module in teacher.modules():
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


class DistillationCallback(PrunetrainCallback):
    """Distil from a frozen teacher while training (and pruning) the student: L = (1 − α)·CE + α·T²·KL (module doc).

    Args:
        teacher: the frozen teacher (moved to the student's device when training begins; its parameters get no
            gradients; under DDP/FSDP2 every rank holds a whole replica), or None: a frozen copy of the student
            taken when training begins (a run with such a teacher cannot resume: it is refused in one line).
        alpha: α in [0, 1], the weight of the soft term (0: plain training, bit-identical).
        temperature: T > 0.
        output_dir, tensorboard: as every prunetrain callback (`distill/kl`, `distill/cross_entropy` are logged).
    """

    name = "distillation"

    def __init__(self, teacher: nn.Module | None = None, alpha: float = 0.5, temperature: float = 2.0,
                 output_dir: str | None = None, tensorboard: bool = True):
        check_bool("tensorboard", tensorboard)
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
        self.snapshot = teacher is None
        self.last: dict[str, float] = {}
        # this process's teacher forward FLOPs (summed over ranks at the end of training); None: not countable
        self.teacher_flops: int | None = 0
        self._teacher_fit = None
        self._student: nn.Module | None = None
        self._task: str | None = None

    # -- Trainer events ------------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state, model)
        student = unwrap_model(model)
        self._task = _task_of(student)
        if self.snapshot and state.global_step > 0:
            raise ValueError("teacher: a run distilling from a copy of the student cannot resume from a checkpoint "
                             "(the copy was taken before its heads were pruned); give the teacher model "
                             "explicitly (teacher=...) to resume.")
        if self.snapshot:
            self.teacher = frozen_copy(student)
        elif self.teacher is student or any(p is q for p in self.teacher.parameters() for q in student.parameters()):
            raise ValueError("teacher: it shares parameters with the student being trained; give a separate (frozen) "
                             "model, or teacher=None for a copy of the student taken when training begins.")
        device = next(student.parameters()).device
        self.teacher.to(device).eval().requires_grad_(False)
        self._restore(args, state)
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
            outputs = original(*args, **kwargs)
            loss = getattr(outputs, "loss", None)
            if not student.training or loss is None or self.alpha == 0.0:
                return outputs
            with torch.no_grad():
                teacher_logits = self.teacher(*args, **kwargs).logits
            self._count_teacher(kwargs)
            kl, count = distillation_kl(outputs.logits, teacher_logits.to(outputs.logits.dtype),
                                        kwargs.get("labels"), self.temperature, self._task)
            items = kwargs.get("num_items_in_batch")
            soft = kl / (items if items is not None else max(count, 1))
            self.last = {"kl": float(soft.detach()), "cross_entropy": float(loss.detach())}
            outputs.loss = (1.0 - self.alpha) * loss + self.alpha * soft.to(loss.dtype)
            return outputs

        student.forward = forward
        self._student = student

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

    def state_dict(self) -> dict:
        return {"alpha": self.alpha, "temperature": self.temperature, "snapshot": self.snapshot,
                "teacher_flops": self.teacher_flops}

    def load_state_dict(self, state: dict) -> None:
        if (state.get("alpha"), state.get("temperature")) != (self.alpha, self.temperature):
            raise ValueError(f"alpha/temperature: the checkpoint was trained with alpha={state.get('alpha')} and "
                             f"temperature={state.get('temperature')}, not {self.alpha} and {self.temperature}.")
        self.teacher_flops = state.get("teacher_flops", 0)


__all__ = ["DistillationCallback", "TASKS", "distillation_kl", "frozen_copy"]
