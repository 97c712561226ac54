"""Trainer callbacks: they decide *when*; the library functions (importance, selection, shrink, curve, gates) decide
*what*. No Trainer subclass is needed.

- `HeadPruningCallback`: head importance (Michel et al. 2019) at chosen epochs, recorded as JSON and TensorBoard
  heatmaps; optional pruning on a schedule, by masking (`mode="mask"`) or physical removal (`mode="shrink"`, the
  optimizer state sliced so training goes on faster).
- `PruningCurveCallback`: at chosen epochs, the metric (BLEU, loss, accuracy or a callable) of the model with
  0…90 % of its heads masked in importance order (Michel et al. 2019 §6); the training state is left untouched.
- `HardConcreteCallback`: Hard-Concrete gates (Voita et al. 2019 §6) with the L0 penalty λ Σ (1 − P(g = 0)) or a
  Lagrangian head budget; at the end the gates become a HeadMask (optionally `shrink`).

Every callback saves its state into each Trainer checkpoint (`prunetrain-<name>.json` / `.safetensors` in
`checkpoint-N/`) and restores it when training resumes from that checkpoint. Under DDP every rank computes the same
masks (importance is all-reduced, gate gradients are averaged) and only rank 0 writes files and logs.

Epochs are counted from 1: "epoch 3" is the end of the third training epoch.
"""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import TrainerCallback

from prunetrain.methods.curve import (DEFAULT_FRACTIONS, Curve, accuracy_metric, bleu_metric, check_fractions, loss_metric,
                              pruning_curve)
from prunetrain.methods.gates import HardConcreteGates, gates_for
from prunetrain.engine.heads import KINDS, HeadLayout, find_heads, unwrap_model
from prunetrain.methods.importance import HeadScores, get_scorer
from prunetrain.engine.mask import HeadMask, attached_masks
from prunetrain.utils.plots import TensorBoardLog, curves_figure, heatmap_figure, save_figure
from prunetrain.methods.selection import iterative_prune, select_heads
from prunetrain.engine.shrink import shrink

logger = logging.getLogger("prunetrain")

EpochSpec = "Sequence[int] | int | Callable[[int], bool]"
MODES = ("mask", "shrink")


# ---------------------------------------------------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------------------------------------------------
def _epoch_selector(spec, argument: str) -> tuple[Callable[[int], bool], int | None]:
    """`(selected(epoch), largest explicitly named epoch or None)` from a list of epochs, an int N ("every N
    epochs") or a predicate."""
    if callable(spec):
        return spec, None
    if isinstance(spec, bool) or (isinstance(spec, int) and spec < 1):
        raise ValueError(f"{argument}: {spec!r} is not valid; give a list of epochs (>= 1), an int N >= 1 for "
                         f"'every N epochs', or a function epoch -> bool.")
    if isinstance(spec, int):
        return (lambda epoch: epoch % spec == 0), None
    epochs = list(spec)
    bad = [e for e in epochs if isinstance(e, bool) or not isinstance(e, int) or e < 1]
    if bad or not epochs:
        raise ValueError(f"{argument}: {bad[0] if bad else epochs!r} is not valid; epochs are integers >= 1 "
                         f"(epoch 1 is the end of the first epoch).")
    chosen = set(epochs)
    return (lambda epoch: epoch in chosen), max(epochs)


def _check_amount(amount, argument: str) -> None:
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise ValueError(f"{argument}: {amount!r} is not an amount; use a fraction (float in [0, 1]) or a count "
                         f"(int >= 0) of heads.")
    if isinstance(amount, float) and not 0.0 <= amount <= 1.0:
        raise ValueError(f"{argument}: {amount!r} is not a fraction in [0, 1] (a float is a fraction of all heads, "
                         f"an int a count).")
    if isinstance(amount, int) and amount < 0:
        raise ValueError(f"{argument}: {amount!r} is negative; a count of heads is an int >= 0.")


def _check_kinds(kinds, argument: str = "kinds") -> list[str] | None:
    if kinds is None:
        return None
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"{argument}: {kind!r} is not an attention kind; allowed: {', '.join(KINDS)}.")
    return kinds


def _check_choice(argument: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{argument}: {value!r} is not one of {', '.join(map(repr, allowed))}.")


def _check_positive_int(argument: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{argument}: {value!r} must be an integer >= {minimum}.")


def _training_epochs(args) -> int | None:
    return None if getattr(args, "max_steps", -1) and args.max_steps > 0 else math.ceil(args.num_train_epochs)


def _check_epochs_fit(args, last_epoch: int | None, argument: str) -> None:
    """Epochs named in the configuration must lie within training (known once the Trainer is built)."""
    total = _training_epochs(args)
    if total is not None and last_epoch is not None and last_epoch > total:
        raise ValueError(f"{argument}: epoch {last_epoch} is beyond training, which runs {total} epochs "
                         f"(num_train_epochs={args.num_train_epochs}).")


def _check_model_kinds(kinds, layout: HeadLayout) -> None:
    for kind in kinds or []:
        if kind not in layout.kinds:
            raise ValueError(f"kinds: this model has no {kind!r} attention; its kinds are {', '.join(layout.kinds)}.")


# ---------------------------------------------------------------------------------------------------------------------
# shared machinery
# ---------------------------------------------------------------------------------------------------------------------
class PrunetrainCallback(TrainerCallback):
    """Base: output directory, TensorBoard, rank-0 logging and checkpoint state. Subclasses set `name` and implement
    `state_dict()` / `load_state_dict()` (JSON-able) and optionally `tensor_state()` / `load_tensor_state()`."""

    name = "callback"

    def __init__(self, output_dir: str | None = None, tensorboard: bool = True):
        self.output_dir = output_dir
        self.tensorboard = tensorboard
        self._out: Path | None = None
        self._tb: TensorBoardLog | None = None
        self._is_main = True

    # files and logs -------------------------------------------------------------------------------------------------
    def _setup(self, args, state) -> None:
        self._out = Path(self.output_dir) if self.output_dir else Path(args.output_dir) / "prunetrain"
        self._is_main = state.is_world_process_zero
        if self._is_main:
            self._out.mkdir(parents=True, exist_ok=True)
            if self.tensorboard and self._tb is None:
                self._tb = TensorBoardLog(self._out / "tensorboard")

    @property
    def out_dir(self) -> Path:
        if self._out is None:
            raise RuntimeError(f"{type(self).__name__}: not set up yet (no training has started).")
        return self._out

    def _write_json(self, name: str, data) -> None:
        if self._is_main:
            path = self.out_dir / name
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(path)

    def _log(self, message: str) -> None:
        if self._is_main:
            logger.warning("prunetrain: %s", message)  # warning level: visible under the Trainer's default logging

    def _tb_scalar(self, tag: str, value: float, step: int) -> None:
        if self._is_main and self._tb is not None:
            self._tb.scalar(tag, value, step)

    def _tb_figure(self, tag: str, fig, step: int) -> None:
        if self._is_main and self._tb is not None:
            self._tb.figure(tag, fig, step)
        else:
            import matplotlib.pyplot as plt

            plt.close(fig)

    def _flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    # checkpoint state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def tensor_state(self) -> dict[str, torch.Tensor]:
        return {}

    def load_tensor_state(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / f"prunetrain-{self.name}.json").write_text(json.dumps(self.state_dict()))
        tensors = self.tensor_state()
        if tensors:
            save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                      str(checkpoint / f"prunetrain-{self.name}.safetensors"))

    def _restore(self, args, state) -> bool:
        """On resume (global_step > 0), load this callback's state from `checkpoint-<global_step>`."""
        if state.global_step <= 0:
            return False
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        path = checkpoint / f"prunetrain-{self.name}.json"
        if not path.is_file():
            raise ValueError(f"resume: {str(checkpoint)!r} has no {path.name}; it was not written by a run with "
                             f"{type(self).__name__}, so its pruning state cannot be restored.")
        self.load_state_dict(json.loads(path.read_text()))
        tensors = checkpoint / f"prunetrain-{self.name}.safetensors"
        if tensors.is_file():
            self.load_tensor_state(load_file(str(tensors)))
        self._log(f"{self.name}: restored pruning state from {checkpoint}")
        return True

    def on_train_end(self, args, state, control, **kwargs):
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _epoch(state) -> int:
    return int(round(state.epoch or 0))


def _when(state) -> str:
    """"epoch 3", or "step 120 (epoch 0.26)" when training ended part-way through an epoch (max_steps)."""
    epoch = float(state.epoch or 0)
    if abs(epoch - round(epoch)) < 1e-6 and round(epoch) > 0:
        return f"epoch {round(epoch)}"
    return f"step {state.global_step} (epoch {epoch:.2f})"


def _first_batches(source: Iterable, count: int) -> list[dict]:
    out = []
    for batch in source:
        out.append({k: v for k, v in batch.items()})
        if len(out) >= count:
            break
    return out


def _local_share(batches: list, rank_split: bool) -> list:
    """Under torch.distributed, each rank scores its share of an explicitly given list of batches."""
    if rank_split and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return batches[dist.get_rank():: dist.get_world_size()]
    return batches


def _combined_attached(model: nn.Module) -> HeadMask | None:
    """The product of every HeadMask attached to `model` (None if none)."""
    masks = attached_masks(unwrap_model(model))
    if not masks:
        return None
    combined = masks[0].copy()
    for other in masks[1:]:
        for name, values in other.items():
            combined[name] = combined[name] * values.detach()
    return combined


def _kept_summary(before: Mapping[str, int], after: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {before[k]}→{after.get(k, 0)}" for k in before)


def _importance_heatmap(scores: HeadScores, title: str):
    return heatmap_figure(scores.as_matrix(), [f"{s.kind}:{s.layer}" for s in scores.layout], title,
                          colorbar_label="importance")


# ---------------------------------------------------------------------------------------------------------------------
# HeadPruningCallback
# ---------------------------------------------------------------------------------------------------------------------
class HeadPruningCallback(PrunetrainCallback):
    """Head importance at chosen epochs and, optionally, pruning on a schedule.

    at_epochs:   when to compute (and record) importance: a list of epochs, an int N (every N epochs) or a
                 function epoch -> bool. Importance is also computed at every pruning epoch.
    prune:       None (only record), or the cumulative amount pruned by an epoch: a dict {epoch: amount} or a
                 function epoch -> amount | None. An amount is a fraction (float in [0, 1]) or a count (int) of all
                 heads (`select_heads` convention), e.g. {5: 0.2, 8: 0.4}.
    mode:        "mask" (zero the heads, keep the weights) or "shrink" (remove them physically with the optimizer
                 state sliced; not available under DDP, whose gradient buckets are fixed).
    iterative:   prune in steps of `step` (of all heads), re-estimating importance in between (Michel §4).
    scope, kinds, min_heads_per_layer: passed to `select_heads`.
    batches:     the batches importance is computed on (a list or DataLoader; under DDP each rank takes its share).
                 Default: the first `num_batches` batches of the Trainer's training dataloader at that moment.
    scorer:      "gradient" (Michel), "ablation", "confidence", "random" or a callable; `scorer_options` for it.
    """

    name = "head-pruning"

    def __init__(self, at_epochs=(1,), prune: Mapping[int, float | int] | Callable[[int], Any] | None = None, *,
                 mode: str = "mask", iterative: bool = False, step: float | int = 0.1, scope: str = "global",
                 kinds=None, min_heads_per_layer: int = 1, batches: Iterable | None = None, num_batches: int = 8,
                 scorer: str | Callable = "gradient", scorer_options: Mapping | None = None,
                 output_dir: str | None = None, tensorboard: bool = True):
        super().__init__(output_dir, tensorboard)
        self._at, self._last_epoch = _epoch_selector(at_epochs, "at_epochs")
        _check_choice("mode", mode, MODES)
        _check_choice("scope", scope, ("global", "layer", "kind"))
        self.kinds = _check_kinds(kinds)
        _check_positive_int("min_heads_per_layer", min_heads_per_layer, 0)
        _check_positive_int("num_batches", num_batches)
        _check_amount(step, "step")
        if step == 0:
            raise ValueError("step: 0 would never prune; give a fraction > 0 or a count >= 1.")
        self.schedule: Callable[[int], Any]
        if prune is None:
            self.schedule = lambda epoch: None
        elif callable(prune):
            self.schedule = prune
        elif isinstance(prune, Mapping):
            previous = None
            for epoch, amount in sorted(prune.items()):
                _epoch_selector([epoch], "prune (epoch)")
                _check_amount(amount, f"prune[{epoch}]")
                if previous is not None and type(previous) is type(amount) and amount < previous:
                    raise ValueError(f"prune[{epoch}]: {amount!r} is less than the {previous!r} pruned before; the "
                                     f"schedule gives cumulative amounts, and pruned heads do not come back.")
                previous = amount
                self._last_epoch = max(self._last_epoch or 0, epoch)
            table = dict(prune)
            self.schedule = table.get
        else:
            raise ValueError(f"prune: {prune!r} is not a schedule; give a dict {{epoch: amount}}, a function "
                             f"epoch -> amount or None.")
        self._prune_table = dict(prune) if isinstance(prune, Mapping) else None
        get_scorer(scorer, **dict(scorer_options or {}))  # validates the name and options now
        self.mode, self.iterative, self.step, self.scope = mode, iterative, step, scope
        self.min_heads_per_layer, self.num_batches = min_heads_per_layer, num_batches
        self.batches = batches
        self.scorer, self.scorer_options = scorer, dict(scorer_options or {})
        self.mask: HeadMask | None = None
        self.history: dict[int, dict] = {}
        self.events: list[dict] = []

    # configuration checks that need the model and the training arguments
    def on_init_end(self, args, state, control, model=None, **kwargs):
        _check_epochs_fit(args, self._last_epoch, "at_epochs/prune")
        if model is not None:
            layout = find_heads(model)
            _check_model_kinds(self.kinds, layout)
            in_scope = sum(s.num_heads for s in layout if self.kinds is None or s.kind in self.kinds)
            for epoch, amount in sorted((self._prune_table or {}).items()):
                if isinstance(amount, int) and amount > in_scope:
                    raise ValueError(f"prune[{epoch}]: {amount} heads is more than the {in_scope} heads in scope.")
            if self.mask is None:
                self.mask = HeadMask.ones(layout)
        if self.mode == "shrink" and getattr(args, "world_size", 1) > 1:
            raise ValueError("mode: 'shrink' cannot run under DDP (its gradient buckets have fixed sizes); use "
                             "mode='mask' and shrink the final model, or train on one process.")

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state)
        if self._restore(args, state) and self.mask is not None and self.mask.num_kept < self.mask.num_heads:
            if self.mode == "mask":
                self.mask.attach(model)

    def state_dict(self) -> dict:
        return {"mask": self.mask.to_dict() if self.mask is not None else None,
                "layout": self.mask.layout.to_dict() if self.mask is not None else None,
                "history": {str(k): v for k, v in self.history.items()}, "events": self.events}

    def load_state_dict(self, state: dict) -> None:
        if state.get("mask") is not None:
            layout = HeadLayout.from_dict(state["layout"])
            if self.mask is not None and self.mask.attached:
                self.mask.detach()
            self.mask = HeadMask.from_dict(state["mask"], layout)
        self.history = {int(k): v for k, v in state.get("history", {}).items()}
        self.events = list(state.get("events", []))

    def _importance_batches(self, train_dataloader) -> list:
        if self.batches is not None:
            return _local_share(_first_batches(self.batches, 10**9), rank_split=True)
        if train_dataloader is None:
            raise ValueError("batches: no batches for importance; pass batches=... to HeadPruningCallback.")
        return _first_batches(train_dataloader, self.num_batches)

    def on_epoch_end(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        epoch = _epoch(state)
        amount = self.schedule(epoch)
        if amount is not None:
            _check_amount(amount, f"prune({epoch})")
        if not self._at(epoch) and amount is None:
            return
        if self.mask is None:
            self.mask = HeadMask.ones(model)
        batches = self._importance_batches(train_dataloader)
        scorer = get_scorer(self.scorer, **self.scorer_options)
        scores = scorer(model, batches)
        self.record(epoch, scores, state.global_step)
        if amount is not None:
            self.apply_pruning(model, optimizer, epoch, amount, scores, batches)
        self._flush()

    def record(self, epoch: int, scores: HeadScores, step: int) -> None:
        """Keep the scores of `epoch` (JSON file, history, TensorBoard heatmap)."""
        self.history[epoch] = scores.to_dict()
        self._write_json(f"importance_epoch{epoch}.json", scores.to_dict())
        if self._is_main and self._tb is not None:
            self._tb_figure("prunetrain/importance", _importance_heatmap(scores, f"head importance, epoch {epoch}"),
                            epoch)

    def apply_pruning(self, model, optimizer, epoch: int, amount, scores: HeadScores, batches: list) -> HeadMask:
        """Prune to the cumulative `amount` and apply it (mask or shrink); one log line per event."""
        before = self.mask.kept_per_kind()
        options = dict(scope=self.scope, kinds=self.kinds, min_heads_per_layer=self.min_heads_per_layer,
                       base_mask=self.mask)
        if self.iterative:
            step = self.step if type(self.step) is type(amount) else (float(self.step) if isinstance(amount, float)
                                                                      else max(1, int(self.step)))
            result = iterative_prune(model, batches, step=step, target=amount, scorer=self.scorer,
                                     scorer_options=self.scorer_options, **options)
            new_mask = result.mask
        else:
            new_mask = select_heads(scores, amount, **options)
        total_before = self.mask.num_kept
        if self.mask.attached:
            self.mask.detach()
        if self.mode == "shrink":
            layout = shrink(model, new_mask, optimizer=optimizer)
            self.mask = HeadMask.ones(layout)
            after = layout.heads_per_kind()
            total_after = layout.total_heads
        else:
            self.mask = new_mask
            self.mask.attach(model)
            after = self.mask.kept_per_kind()
            total_after = self.mask.num_kept
        event = {"epoch": epoch, "amount": amount, "mode": self.mode, "heads_before": total_before,
                 "heads_after": total_after, "per_kind_before": before, "per_kind_after": after}
        self.events.append(event)
        self._write_json("pruning_events.json", self.events)
        self._log(f"epoch {epoch}: pruned heads {total_before} → {total_after} ({_kept_summary(before, after)}) "
                  f"[{self.mode}]")
        self._tb_scalar("prunetrain/heads_alive", total_after, epoch)
        for kind, count in after.items():
            self._tb_scalar(f"prunetrain/heads_alive/{kind}", count, epoch)
        self._tb_scalar("prunetrain/sparsity", 1 - total_after / max(1, sum(s.original_num_heads
                                                                             for s in find_heads(model))), epoch)
        return self.mask

    def on_train_end(self, args, state, control, **kwargs):
        if self.mask is not None:
            self._write_json("final_mask.json", self.mask.to_dict())
        super().on_train_end(args, state, control, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# PruningCurveCallback
# ---------------------------------------------------------------------------------------------------------------------
class PruningCurveCallback(PrunetrainCallback):
    """The metric of the model with 0…90 % of its heads masked, at chosen epochs (Michel et al. 2019 §6).

    metric:        "bleu" (needs `eval_pairs` [(source, reference)] and a tokenizer: `tokenizer` or the Trainer's
                   processing_class), "loss" or "accuracy" (need `eval_batches`), or a callable model -> float|dict
                   (with `metric_key` naming the dict entry).
    fractions:     shares of all heads to prune (default 0, 0.1, …, 0.9).
    order:         "importance", "random" (seeded baseline, one curve per seed in `random_seeds`) or "both".
    iterative:     re-estimate importance between fractions (slower; Michel §4).
    num_sentences: BLEU on the first `num_sentences` of `eval_pairs`; batched greedy (or `num_beams`) decoding,
                   `autocast_bf16` optional.
    importance_batches / num_batches: batches for importance (default: first `num_batches` training batches).
    The model's masks, RNG state and train/eval mode are exactly as before after each curve.
    """

    name = "pruning-curve"

    def __init__(self, at_epochs=(1,), *, fractions: Sequence[float] = DEFAULT_FRACTIONS, metric="bleu",
                 metric_key: str | None = None, eval_pairs: Sequence[tuple[str, str]] | None = None, tokenizer=None,
                 eval_batches: Iterable | None = None, num_sentences: int = 500, batch_size: int = 64,
                 num_beams: int = 1, autocast_bf16: bool = False, order: str = "importance",
                 random_seeds: Sequence[int] = (0,), iterative: bool = False, importance_batches=None,
                 num_batches: int = 8, scope: str = "global", kinds=None, min_heads_per_layer: int = 0,
                 output_dir: str | None = None, tensorboard: bool = True):
        super().__init__(output_dir, tensorboard)
        self._at, self._last_epoch = _epoch_selector(at_epochs, "at_epochs")
        self.fractions = check_fractions(fractions)
        _check_choice("order", order, ("importance", "random", "both"))
        _check_choice("scope", scope, ("global", "layer", "kind"))
        self.kinds = _check_kinds(kinds)
        for argument, value in (("num_sentences", num_sentences), ("batch_size", batch_size),
                                ("num_beams", num_beams), ("num_batches", num_batches)):
            _check_positive_int(argument, value)
        _check_positive_int("min_heads_per_layer", min_heads_per_layer, 0)
        if not callable(metric):
            _check_choice("metric", metric, ("bleu", "loss", "accuracy"))
            if metric == "bleu" and not eval_pairs:
                raise ValueError("eval_pairs: metric 'bleu' needs evaluation pairs [(source, reference), ...].")
            if metric in ("loss", "accuracy") and eval_batches is None:
                raise ValueError(f"eval_batches: metric {metric!r} needs evaluation batches with labels.")
        if iterative and order == "random":
            raise ValueError("iterative: has no meaning with order='random'.")
        self.metric, self.metric_key = metric, metric_key or (metric if isinstance(metric, str) else "value")
        self.eval_pairs = list(eval_pairs or [])[:num_sentences]
        self.tokenizer, self.eval_batches = tokenizer, eval_batches
        self.batch_size, self.num_beams, self.autocast_bf16 = batch_size, num_beams, autocast_bf16
        self.order, self.random_seeds, self.iterative = order, list(random_seeds), iterative
        self.importance_batches, self.num_batches = importance_batches, num_batches
        self.scope, self.min_heads_per_layer = scope, min_heads_per_layer
        self.curves: dict[int, dict[str, dict]] = {}

    def on_init_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        _check_epochs_fit(args, self._last_epoch, "at_epochs")
        if model is not None:
            net = unwrap_model(model)
            if self.metric == "bleu" and not (hasattr(net, "can_generate") and net.can_generate()):
                raise ValueError(f"metric: 'bleu' needs a model that can generate text; {type(net).__name__} "
                                 f"cannot (use metric='loss', 'accuracy' or a callable).")
            layout = find_heads(net)
            _check_model_kinds(self.kinds, layout)
            self._check_fractions_fit(layout)
        if self.metric == "bleu" and self.tokenizer is None:
            self.tokenizer = processing_class
            if self.tokenizer is None:
                raise ValueError("tokenizer: metric 'bleu' needs a tokenizer; pass tokenizer=... or give the Trainer "
                                 "a processing_class.")

    def _check_fractions_fit(self, layout) -> None:
        """Refuse, before training starts, a largest fraction that `min_heads_per_layer` makes impossible (found
        mid-training it would end the run at the first curve epoch)."""
        from prunetrain.methods.importance import random_scores

        largest = max(self.fractions, default=0.0)
        try:
            select_heads(random_scores(layout), largest, scope=self.scope, kinds=self.kinds,
                         min_heads_per_layer=self.min_heads_per_layer)
        except ValueError as err:
            raise ValueError(f"fractions: {largest} cannot be reached with min_heads_per_layer="
                             f"{self.min_heads_per_layer} on this model ({err}); lower the largest fraction or "
                             f"min_heads_per_layer.") from None

    def on_train_begin(self, args, state, control, **kwargs):
        self._setup(args, state)
        self._restore(args, state)

    def state_dict(self) -> dict:
        return {"curves": {str(k): v for k, v in self.curves.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.curves = {int(k): v for k, v in state.get("curves", {}).items()}

    def _metric(self) -> Callable:
        if callable(self.metric):
            return self.metric
        if self.metric == "bleu":
            return bleu_metric(self.tokenizer, self.eval_pairs, batch_size=self.batch_size, num_beams=self.num_beams,
                               autocast_bf16=self.autocast_bf16)
        batches = _first_batches(self.eval_batches, 10**9)
        return loss_metric(batches) if self.metric == "loss" else accuracy_metric(batches)

    def on_epoch_end(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        epoch = _epoch(state)
        if not self._at(epoch):
            return
        rng = _RngState.capture()
        try:
            curves = self.compute(model, train_dataloader)
        finally:
            rng.restore()
        self.curves[epoch] = {name: curve.to_dict() for name, curve in curves.items()}
        self._write_json(f"curve_epoch{epoch}.json", self.curves[epoch])
        self._write_json("curves.json", {str(k): v for k, v in sorted(self.curves.items())})
        main = curves.get("importance") or next(iter(curves.values()))
        for point in main.points:
            self._tb_scalar(f"prunetrain/curve_{main.metric}/pruned_{round(100 * point.fraction)}pct", point.value,
                            epoch)
        seconds = sum(p.seconds for p in main.points) / max(1, len(main.points))
        self._log(f"epoch {epoch}: {main.metric} at " + ", ".join(f"{round(100 * p.fraction)}%={p.value:.2f}"
                                                                   for p in main.points)
                  + f" ({seconds:.1f} s per point)")
        if self._is_main:
            save_figure(self.figure(), self.out_dir / "curves.png")
            self._tb_figure("prunetrain/pruning_curves", self.figure(), epoch)
        self._flush()

    def compute(self, model, train_dataloader=None) -> dict[str, Curve]:
        """The curves for the model as it is now (no Trainer needed beyond the optional dataloader)."""
        base = _combined_attached(model)
        metric = self._metric()
        common = dict(fractions=self.fractions, scope=self.scope, kinds=self.kinds,
                      min_heads_per_layer=self.min_heads_per_layer, base_mask=base, key=self.metric_key,
                      metric_name=self.metric_key)
        curves: dict[str, Curve] = {}
        if self.order in ("importance", "both"):
            source = self.importance_batches if self.importance_batches is not None else train_dataloader
            if source is None:
                raise ValueError("importance_batches: no batches to compute importance from.")
            batches = _first_batches(source, self.num_batches if self.importance_batches is None else 10**9)
            if self.importance_batches is not None:
                batches = _local_share(batches, rank_split=True)
            curves["importance"] = pruning_curve(model, metric, batches=batches, iterative=self.iterative, **common)
        if self.order in ("random", "both"):
            for seed in self.random_seeds:
                curves[f"random_seed{seed}"] = pruning_curve(model, metric, order="random", seed=seed, **common)
        return curves

    def figure(self):
        """One line per epoch (importance order; random-order curves dashed in the JSON only)."""
        series = {}
        for epoch, curves in sorted(self.curves.items()):
            data = curves.get("importance") or next(iter(curves.values()))
            series[f"epoch {epoch}"] = ([p["fraction"] for p in data["points"]], [p["value"] for p in data["points"]])
        return curves_figure(series, ylabel=self.metric_key, title="metric vs heads pruned, per epoch")


class _RngState:
    """Python, torch (CPU and CUDA) and NumPy RNG states, to leave training randomness untouched."""

    def __init__(self, states):
        self.states = states

    @classmethod
    def capture(cls) -> "_RngState":
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


# ---------------------------------------------------------------------------------------------------------------------
# HardConcreteCallback
# ---------------------------------------------------------------------------------------------------------------------
class _Lagrangian(nn.Module):
    """λ1 (E/N − t) + λ2 (E/N − t)² with multipliers trained by gradient ascent (Wang et al. 2020 style budget)."""

    def __init__(self):
        super().__init__()
        self.lambda_1 = nn.Parameter(torch.zeros(()))
        self.lambda_2 = nn.Parameter(torch.zeros(()))

    def forward(self, expected_fraction: torch.Tensor, target_fraction: float) -> torch.Tensor:
        gap = expected_fraction - target_fraction
        return self.lambda_1 * gap + self.lambda_2 * gap * gap


class HardConcreteCallback(PrunetrainCallback):
    """Hard-Concrete gates on attention heads (Voita et al. 2019 §6), trained beside the model.

    lam:          λ of the L0 penalty λ Σ_i (1 − P(g_i = 0)) (Voita eq. 6). Exactly one of `lam` and
                  `target_heads` is given.
    target_heads: a head budget: keep this many gated heads (int) or this share of them (float in (0, 1]),
                  reached with a Lagrangian on the expected L0 (multipliers trained by gradient ascent).
    kinds:        which attention kinds are gated (default all; Voita §6.2 gates "encoder_self" only).
    freeze:       None, "decoder" (Voita §6.2: the decoder is frozen while encoder heads are gated), "model"
                  (only the gates train — then the Trainer needs at least one trainable parameter, so prefer
                  "decoder" or a predicate) or a predicate name -> bool. Applied before the Trainer builds its
                  optimizer, so frozen weights are left out of it.
    gate_lr:      the gates' own learning rate (Adam, no weight decay); `lagrangian_lr` for the multipliers.
    finalize:     at the end of training the deterministic gates become a HeadMask: "mask" attaches it to the model,
                  "shrink" removes the heads, "none" only records it.

    How the penalty enters training without a Trainer subclass: the penalty does not depend on the data, so its
    gradient is added to the gate parameters at each optimizer step, after the data gradient (accumulated over
    the step's micro-batches and, under DDP, averaged over ranks) — exactly the gradient of
    L = L_xent + λ Σ (1 − P(g = 0)). The Trainer's logged loss is L_xent; the penalty is logged separately.
    """

    name = "hard-concrete"

    def __init__(self, lam: float | None = None, *, target_heads: int | float | None = None, kinds=None,
                 freeze: str | Callable[[str], bool] | None = None, gate_lr: float = 0.1,
                 lagrangian_lr: float = 0.05, init_log_alpha: float = 3.0, seed: int = 0, finalize: str = "mask",
                 output_dir: str | None = None, tensorboard: bool = True):
        super().__init__(output_dir, tensorboard)
        if (lam is None) == (target_heads is None):
            raise ValueError(f"lam, target_heads: give exactly one (a penalty weight λ or a head budget), got "
                             f"lam={lam!r}, target_heads={target_heads!r}.")
        if lam is not None and (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam)
                                or lam < 0):
            raise ValueError(f"lam: {lam!r} must be a finite number >= 0.")
        if target_heads is not None:
            if isinstance(target_heads, bool) or not isinstance(target_heads, (int, float)):
                raise ValueError(f"target_heads: {target_heads!r} must be a count (int >= 0) or a share of the "
                                 f"gated heads (float in (0, 1]).")
            if isinstance(target_heads, float) and not 0 < target_heads <= 1:
                raise ValueError(f"target_heads: {target_heads!r} is not a share in (0, 1] of the gated heads.")
            if isinstance(target_heads, int) and target_heads < 0:
                raise ValueError(f"target_heads: {target_heads!r} is negative.")
        for argument, value in (("gate_lr", gate_lr), ("lagrangian_lr", lagrangian_lr)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{argument}: {value!r} must be a finite number > 0.")
        if not (freeze is None or callable(freeze) or freeze in ("decoder", "model")):
            raise ValueError(f"freeze: {freeze!r} is not one of None, 'decoder', 'model' or a function name -> bool.")
        _check_choice("finalize", finalize, ("mask", "shrink", "none"))
        self.kinds = _check_kinds(kinds)
        self.lam, self.target_heads, self.freeze = lam, target_heads, freeze
        self.gate_lr, self.lagrangian_lr, self.init_log_alpha, self.seed = gate_lr, lagrangian_lr, init_log_alpha, seed
        self.finalize = finalize
        self.gates: HardConcreteGates | None = None
        self.lagrangian: _Lagrangian | None = None
        self._gate_optimizer: torch.optim.Optimizer | None = None
        self._lagrangian_optimizer: torch.optim.Optimizer | None = None
        self.history: list[dict] = []  # one record per epoch
        self.trace: list[dict] = []  # heads alive per kind at every logging step (Voita Fig. 9 within one run)
        self.final_mask: HeadMask | None = None
        self._last_penalty = 0.0

    @property
    def target_count(self) -> float | None:
        if self.target_heads is None or self.gates is None:
            return None
        total = sum(self.gates.layout[n].num_heads for n in self.gates.site_names)
        return float(self.target_heads) if isinstance(self.target_heads, int) else self.target_heads * total

    def on_init_end(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("model: HardConcreteCallback needs the Trainer's model.")
        net = unwrap_model(model)
        layout = find_heads(net)
        _check_model_kinds(self.kinds, layout)
        self.gates = gates_for(net, kinds=self.kinds, init_log_alpha=self.init_log_alpha, seed=self.seed)
        gated = sum(layout[n].num_heads for n in self.gates.site_names)
        if isinstance(self.target_heads, int) and self.target_heads > gated:
            raise ValueError(f"target_heads: {self.target_heads} is more than the {gated} gated heads.")
        self._freeze(net)
        self.gates.attach(net)
        self._gate_optimizer = torch.optim.Adam(self.gates.parameters(), lr=self.gate_lr, weight_decay=0.0)
        if self.target_heads is not None:
            self.lagrangian = _Lagrangian().to(next(net.parameters()).device)
            self._lagrangian_optimizer = torch.optim.Adam(self.lagrangian.parameters(), lr=self.lagrangian_lr,
                                                          maximize=True)

    def _freeze(self, net: nn.Module) -> None:
        if self.freeze is None:
            return
        if self.freeze == "decoder":
            if not getattr(net.config, "is_encoder_decoder", False):
                raise ValueError(f"freeze: 'decoder' needs an encoder-decoder model; {type(net).__name__} is not.")
            shared = {id(p) for p in net.get_input_embeddings().parameters()}  # tied embeddings stay trainable
            frozen = {id(p) for p in net.get_decoder().parameters()} - shared
        else:
            rule = (lambda name: True) if self.freeze == "model" else self.freeze
            frozen = {id(p) for name, p in net.named_parameters() if rule(name)}
        for param in net.parameters():
            if id(param) in frozen:
                param.requires_grad_(False)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state)
        self._restore(args, state)
        if self.gates is not None:
            device = next(unwrap_model(model).parameters()).device
            self.gates.to(device)

    def penalty(self) -> torch.Tensor:
        """The regulariser added to the loss: λ Σ (1 − P(g = 0)), or the Lagrangian budget term."""
        expected = self.gates.expected_l0()
        if self.lagrangian is None:
            return self.lam * expected
        total = sum(self.gates.layout[n].num_heads for n in self.gates.site_names)
        return self.lagrangian(expected / total, self.target_count / total)

    def on_optimizer_step(self, args, state, control, **kwargs):
        """Step the gates (and multipliers) once per optimizer step: data gradient averaged over ranks, plus the
        penalty's gradient."""
        params = list(self.gates.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for p in params:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= dist.get_world_size()
        penalty = self.penalty()
        penalty.backward()
        self._last_penalty = float(penalty.detach())
        self._gate_optimizer.step()
        self._gate_optimizer.zero_grad(set_to_none=True)
        if self._lagrangian_optimizer is not None:
            self._lagrangian_optimizer.step()
            self._lagrangian_optimizer.zero_grad(set_to_none=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.gates is None or not self._is_main:
            return
        with torch.no_grad():
            expected = float(self.gates.expected_l0())
            per_kind = self.gates.open_per_kind()
        self.trace.append({"step": state.global_step, "expected_l0": expected, "open_per_kind": per_kind,
                           "penalty": self._last_penalty})
        self._tb_scalar("prunetrain/expected_l0", expected, state.global_step)
        self._tb_scalar("prunetrain/l0_penalty", self._last_penalty, state.global_step)
        self._tb_scalar("prunetrain/heads_alive_by_step", sum(per_kind.values()), state.global_step)
        for kind, count in per_kind.items():
            self._tb_scalar(f"prunetrain/heads_alive_by_step/{kind}", count, state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        epoch = _epoch(state)
        with torch.no_grad():
            expected = float(self.gates.expected_l0())
            per_kind = self.gates.open_per_kind()
            per_site = {n: int(self.gates.deterministic(n).sum()) for n in self.gates.site_names}
            prob_open = self.gates.prob_open_matrix()
        record = {"epoch": epoch, "step": state.global_step, "expected_l0": expected, "open_per_kind": per_kind,
                  "open_per_site": per_site, "penalty": self._last_penalty,
                  "p_open": [[None if math.isnan(v) else v for v in row] for row in prob_open.tolist()]}
        if self.lagrangian is not None:
            record["lambda_1"] = float(self.lagrangian.lambda_1.detach())
            record["lambda_2"] = float(self.lagrangian.lambda_2.detach())
        self.history.append(record)
        self._write_json("gates_history.json", self.history)
        self._tb_scalar("prunetrain/heads_alive", sum(per_kind.values()), epoch)
        for kind, count in per_kind.items():
            self._tb_scalar(f"prunetrain/heads_alive/{kind}", count, epoch)
        if self._is_main and self._tb is not None:
            labels = [f"{self.gates.layout[n].kind}:{self.gates.layout[n].layer}" for n in self.gates.site_names]
            self._tb_figure("prunetrain/gate_p_open", heatmap_figure(prob_open, labels, f"P(gate open), epoch {epoch}",
                                                                     vmin=0, vmax=1, colorbar_label="1 − P(g=0)"),
                            epoch)
        self._log(f"{_when(state)}: gates open {sum(per_kind.values())} ({', '.join(f'{k} {v}' for k, v in per_kind.items())}),"
                  f" expected L0 {expected:.2f}")
        self._flush()

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._write_json("gates_trace.json", self.trace)
        if self.gates is not None and self.gates.attached:
            self.final_mask = self.gates.to_mask()
            self.gates.detach()
            net = unwrap_model(model)
            if self.finalize == "mask":
                self.final_mask.attach(net)
            elif self.finalize == "shrink":
                shrink(net, self.final_mask)
            self._write_json("final_mask.json", self.final_mask.to_dict())
            self._log(f"final gates: {self.final_mask.num_kept}/{self.final_mask.num_heads} heads kept "
                      f"({', '.join(f'{k} {v}' for k, v in self.final_mask.kept_per_kind().items())}) [{self.finalize}]")
        super().on_train_end(args, state, control, **kwargs)

    # resume ---------------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        groups = {"gates": self._gate_optimizer}
        if self._lagrangian_optimizer is not None:
            groups["lagrangian"] = self._lagrangian_optimizer
        steps = {}
        for prefix, optimizer in groups.items():
            for index, state in optimizer.state_dict()["state"].items():
                if "step" in state:
                    steps[f"{prefix}.{index}"] = float(state["step"])
        return {"history": self.history, "trace": self.trace, "optimizer_steps": steps}

    def tensor_state(self) -> dict[str, torch.Tensor]:
        tensors = {f"gates.{k}": v for k, v in self.gates.state_dict().items()}
        if self.lagrangian is not None:
            tensors.update({f"lagrangian.{k}": v for k, v in self.lagrangian.state_dict().items()})
        for prefix, optimizer in (("opt.gates", self._gate_optimizer), ("opt.lagrangian", self._lagrangian_optimizer)):
            if optimizer is None:
                continue
            for index, state in optimizer.state_dict()["state"].items():
                for key, value in state.items():
                    if torch.is_tensor(value) and key != "step":
                        tensors[f"{prefix}.{index}.{key}"] = value
        return tensors

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state.get("history", []))
        self.trace = list(state.get("trace", []))
        self._pending_steps = dict(state.get("optimizer_steps", {}))

    def load_tensor_state(self, tensors: dict[str, torch.Tensor]) -> None:
        self.gates.load_state_dict({k[len("gates."):]: v for k, v in tensors.items() if k.startswith("gates.")})
        if self.lagrangian is not None:
            self.lagrangian.load_state_dict({k[len("lagrangian."):]: v for k, v in tensors.items()
                                             if k.startswith("lagrangian.")})
        steps = getattr(self, "_pending_steps", {})
        for prefix, name, optimizer in (("opt.gates", "gates", self._gate_optimizer),
                                        ("opt.lagrangian", "lagrangian", self._lagrangian_optimizer)):
            if optimizer is None:
                continue
            saved = optimizer.state_dict()
            restored: dict[int, dict] = {}
            for key, value in tensors.items():
                if key.startswith(prefix + "."):
                    index, field = key[len(prefix) + 1:].split(".", 1)
                    restored.setdefault(int(index), {})[field] = value
            for index in restored:
                restored[index]["step"] = torch.tensor(steps.get(f"{name}.{index}", 0.0))
            saved["state"] = restored
            optimizer.load_state_dict(saved)


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest `checkpoint-N` in `output_dir` that holds prunetrain's state (written last, in `on_save`), so a
    checkpoint cut short by a crash is skipped; None if there is none."""
    candidates = []
    for path in Path(output_dir).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if step.isdigit() and any(path.glob("prunetrain-*.json")) and (path / "trainer_state.json").is_file():
            candidates.append((int(step), path))
    return str(max(candidates)[1]) if candidates else None


def restore_layout(model: nn.Module, checkpoint: str | Path) -> HeadLayout:
    """Shrink a freshly built model to the head layout recorded in a checkpoint's `config.json`.

    Needed before `trainer.train(resume_from_checkpoint=...)` when the run pruned with `mode="shrink"`: the
    Trainer loads the checkpoint's (smaller) weights before any callback runs, so the model must already have the
    checkpoint's shape. A checkpoint of an unshrunk model leaves the model as it is.
    """
    from prunetrain.engine.heads import LAYOUT_CONFIG_KEY

    config = Path(checkpoint) / "config.json"
    if not config.is_file():
        raise ValueError(f"checkpoint: {str(checkpoint)!r} has no config.json; it is not a Trainer checkpoint.")
    recorded = json.loads(config.read_text()).get(LAYOUT_CONFIG_KEY) or {}
    net = unwrap_model(model)
    layout = find_heads(net)
    remove = {}
    for name, kept in recorded.items():
        site = layout[name]
        missing = set(kept) - set(site.heads)
        if missing:
            raise ValueError(f"checkpoint: site {name!r} keeps heads {sorted(missing)} that the model no longer has.")
        remove[name] = [i for i, head in enumerate(site.heads) if head not in set(kept)]
    if remove:
        shrink(net, HeadMask.from_heads(net, remove))
    return find_heads(net)


__all__ = ["HardConcreteCallback", "HeadPruningCallback", "PruningCurveCallback", "PrunetrainCallback", "last_complete_checkpoint", "restore_layout"]
