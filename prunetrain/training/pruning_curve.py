"""`PruningCurveCallback`: at chosen points of training, the metric of the model with 0…90 % of its heads masked in
importance order (Michel et al. 2019 §6, Fig. 5), while training goes on untouched (masks, RNG state and train/eval
mode are exactly as before after each curve).

Points are epochs (fractional allowed) or global steps, each record labelled by the global step and the exact
fractional epoch (`prunetrain.training.scheduled`). With `relative=True` (the default, scope "global") the fractions
are of the heads still present, so after a training-time pruning step the curve still spans the model as it is
instead of staying flat up to the share already removed.
"""

from __future__ import annotations

from typing import Any

from prunetrain.engine.heads import find_heads, unwrap_model
from prunetrain.methods.curve import Curve, HeadScope, Metric, Ranking, pruning_curve
from prunetrain.methods.importance import random_scores
from prunetrain.methods.selection import select_heads
from prunetrain.training.base import check_epochs_fit, check_model_kinds, combined_attached, first_batches, local_share
from prunetrain.training.importance_sample import ImportanceSample
from prunetrain.training.options import CURVE_ORDERS, CurveSweep, Heads, Importance, Output, Schedule, resolve_options
from prunetrain.training.points import Plan, Point, file_label, label
from prunetrain.training.scheduled import ScheduledCallback
from prunetrain.training.state import RngState
from prunetrain.utils.door import checked
from prunetrain.utils.plots import curves_figure, save_figure
from prunetrain.utils.validate import ALL_BATCHES

ORDERS = CURVE_ORDERS


@checked(own=("schedule", "metric", "metric_key", "sweep", "heads", "importance", "output"))
class PruningCurveCallback(ScheduledCallback):
    """The metric of the model with 0…90 % of its heads masked, at chosen epochs (Michel et al. 2019 §6).

    Example (BLEU of a translation model, with `bleu_metric` of the translation application `prunetrain.mt.evaluation.metrics`;
    any callable `model -> float | dict` works)::

        PruningCurveCallback(Schedule(at_epochs=[1, 2, 5]), metric=bleu_metric(tokenizer, dev_pairs), metric_key="bleu")

    Args:
        schedule: the curve points (`Schedule`: `at_epochs`, default epoch 1; `at_steps`; `record_end`). A schedule
            that prunes (`prune`, `prune_steps`, `shrink_steps`) is refused: pruning is `HeadPruningCallback`'s.
        metric: a callable `model -> float | dict` (e.g. `prunetrain.mt.evaluation.metrics.bleu_metric(...)`,
            `prunetrain.methods.curve.loss_metric(batches)` or `accuracy_metric(batches)`).
        metric_key: the entry to plot when the metric returns a dict (e.g. "bleu"); default "value".
        sweep: the points of each curve (`CurveSweep`: fractions, relative, order, random seeds). A fraction that
            `min_heads_per_layer` puts out of reach on the model as it is then is skipped and listed in the record
            (`skipped_fractions`).
        heads: which heads may be masked (`Heads`: scope, kinds, min_heads_per_layer (default 0); no constraints).
        importance: how heads are ranked (`Importance`: scorer, options, batches (under DDP each rank takes its
            share; default `num_batches` global batches of the Trainer's training set, the same whatever the
            world size and accumulation: `prunetrain.training.importance_sample`), `iterative`:
            re-estimate importance between fractions, slower, Michel §4; no `step`).
        output: where files go (`Output`: default `<output_dir>/prunetrain`, with TensorBoard).
        **deprecated: the former keyword form (`at_epochs`, `fractions`, `order`, `scope`, `importance_batches`,
            `output_dir`, ...: every field of the records above, and `at_epochs` as the first positional argument),
            still accepted with one DeprecationWarning until prunetrain 0.2.
    """

    name = "pruning-curve"
    OPTIONS = {"schedule": Schedule, "sweep": CurveSweep, "heads": Heads, "importance": Importance, "output": Output}

    def __init__(self, schedule: Schedule | None = None, *, metric: Metric, metric_key: str | None = None,
                 sweep: CurveSweep | None = None, heads: Heads | None = None, importance: Importance | None = None,
                 output: Output | None = None, **deprecated: Any):
        given = dict(schedule=schedule, sweep=sweep, heads=heads, importance=importance, output=output)
        if schedule is not None and not isinstance(schedule, Schedule):  # the former positional at_epochs
            if "at_epochs" in deprecated:
                raise TypeError("PruningCurveCallback() got multiple values for argument 'at_epochs'")
            given["schedule"], deprecated = None, {"at_epochs": schedule, **deprecated}
        options = resolve_options(type(self).__name__, given, self.OPTIONS, deprecated,
                                  renamed={"importance_batches": "batches"})
        self.schedule, self.sweep, self.heads, self.importance, self.output = (options[k] for k in self.OPTIONS)
        self.heads.refuse_neurons(type(self).__name__)
        super().__init__(self.output.output_dir, self.output.tensorboard)
        self._refuse_what_a_curve_does_not_take()
        selector, epochs = self.schedule.points()
        self._init_points(Plan(epochs, list(self.schedule.at_steps), selector), self.schedule.record_end)
        self._last_epoch = max([int(e) + (e % 1 > 0) for e in epochs], default=None)
        if not callable(metric):
            raise ValueError(f"metric: {metric!r} is not a callable model -> float | dict; build one with "
                             f"prunetrain.mt.evaluation.metrics.bleu_metric, prunetrain.methods.curve.loss_metric or "
                             f"accuracy_metric.")
        self.relative, self.fractions = bool(self.sweep.relative), list(self.sweep.fractions)
        self.order, self.random_seeds = self.sweep.order, list(self.sweep.random_seeds)
        self.kinds, self.scope, self.min_heads_per_layer = (self.heads.kind_list, self.heads.scope,
                                                            self.heads.kept_per_site(0))
        self.iterative, self.scorer, self.scorer_options = (self.importance.iterative, self.importance.scorer,
                                                            self.importance.options)
        self.importance_batches, self.num_batches = self.importance.batches, self.importance.num_batches
        self._sample: ImportanceSample | None = None  # the default importance batches (no `batches` given)
        if metric_key is not None and (not isinstance(metric_key, str) or not metric_key):
            raise ValueError(f"metric_key: {metric_key!r} is not allowed; expected the name (a non-empty string) of "
                             f"the entry to plot when the metric returns a dict, or None.")
        self.metric, self.metric_key = metric, metric_key or "value"
        self.curves: dict[int, dict] = {}  # global step -> {"step", "epoch", "label", "kind", "curves": {...}}

    def _refuse_what_a_curve_does_not_take(self) -> None:
        """Fields of the shared records that mean nothing to a curve are refused, never ignored."""
        if self.schedule.prunes:
            raise ValueError("schedule: a PruningCurveCallback masks heads only for its curves; prune, prune_steps "
                             "and shrink_steps belong to HeadPruningCallback's schedule.")
        if self.heads.constraints is not None:
            raise ValueError(f"constraints: {self.heads.constraints!r} is not taken by PruningCurveCallback (its "
                             f"curves mask in importance order); give constraints to HeadPruningCallback or "
                             f"HardConcreteCallback.")
        if self.importance.step is not None:
            raise ValueError(f"step: {self.importance.step!r} is not taken by PruningCurveCallback; an iterative "
                             f"curve re-estimates importance at each of its fractions (evenly spaced from 0).")
        if self.importance.iterative and self.sweep.order == "random":
            raise ValueError("iterative: has no meaning with order='random'.")

    def on_init_end(self, args, state, control, model=None, **kwargs):
        check_epochs_fit(args, self._last_epoch, "at_epochs")
        self.check_engine(model, args)
        if model is not None:
            layout = find_heads(unwrap_model(model))
            check_model_kinds(self.kinds, layout)
            self._check_fractions_fit(layout)

    def _check_fractions_fit(self, layout) -> None:
        """Refuse, before training starts, a largest fraction that `min_heads_per_layer` makes impossible (found
        mid-training it would end the run at the first curve epoch)."""
        largest = max(self.fractions, default=0.0)
        try:
            select_heads(random_scores(layout), largest, scope=self.scope, kinds=self.kinds,
                         min_heads_per_layer=self.min_heads_per_layer)
        except ValueError as err:
            raise ValueError(f"fractions: {largest} cannot be reached with min_heads_per_layer="
                             f"{self.min_heads_per_layer} on this model ({err}); lower the largest fraction or "
                             f"min_heads_per_layer.") from None

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._setup(args, state, model)
        self._restore(args, state)
        self._start_plan(args, state, train_dataloader)
        if self.importance_batches is None and train_dataloader is not None:
            self._sample = ImportanceSample(args, train_dataloader, self.num_batches, self.name)
            self._sample.check_engine(model)

    def on_train_end(self, args, state, control, **kwargs):
        self._finish_plan(state)
        super().on_train_end(args, state, control, **kwargs)

    def state_dict(self) -> dict:
        return {"curves": {str(k): v for k, v in self.curves.items()}, **self.points_state()}

    def load_state_dict(self, state: dict) -> None:
        self.curves = {int(k): v for k, v in state.get("curves", {}).items()}
        self.load_points_state(state)

    def is_measurement(self, point: Point, kind: str) -> bool:
        return True  # a curve sweep measures the model; training goes on as without it

    def act(self, point: Point, kind: str, state, model=None, train_dataloader=None, **kwargs):
        step, epoch = int(state.global_step), float(state.epoch or 0)
        rng = RngState.capture()
        try:
            curves, meta = self.compute_with_meta(model, train_dataloader)
        finally:
            rng.restore()
        entry = {"step": step, "epoch": epoch, "label": label(step, epoch), "kind": kind, **meta,
                 "curves": {name: self._relabel(curve.to_dict(), meta) for name, curve in curves.items()}}
        self.curves[step] = entry
        self._write_json(f"curve_{file_label(step, epoch)}.json", entry)
        self._write_json("curves.json", {str(k): v for k, v in sorted(self.curves.items())})
        if not entry["curves"]:
            self._log(f"{label(step, epoch)}: no curve fraction is within reach ({meta['skipped_fractions']})")
            return
        main = entry["curves"].get("importance") or next(iter(entry["curves"].values()))
        metric_name = main.get("metric", self.metric_key)
        for p in main["points"]:
            self._tb_scalar(f"prunetrain/curve_{metric_name}/pruned_{round(100 * p['fraction'])}pct", p["value"], step)
        seconds = sum(p["seconds"] for p in main["points"]) / max(1, len(main["points"]))
        self._log(f"{label(step, epoch)}: {metric_name} at " + ", ".join(
            f"{round(100 * p['fraction'])}%={p['value']:.2f}" for p in main["points"])
            + f" (fractions of the {meta['fractions_of']}; {seconds:.1f} s per point)"
            + (f"; out of reach: {meta['skipped_fractions']}" if meta["skipped_fractions"] else ""))
        if self._is_main:
            save_figure(self.figure(), self.out_dir / "curves.png")
            self._tb_figure("prunetrain/pruning_curves", self.figure(), step)

    @staticmethod
    def _relabel(curve: dict, meta: dict) -> dict:
        """Points carry the requested fraction (of the heads present, when relative) and the fraction of the
        original heads the selection used."""
        mapping = meta.get("to_original") or {}
        points = []
        for p in curve["points"]:
            for requested in mapping.get(repr(p["fraction"]), [p["fraction"]]):
                points.append(dict(p, fraction=requested, fraction_of_original=p["fraction"]))
        return dict(curve, points=sorted(points, key=lambda q: q["fraction"]))

    def _plan_fractions(self, model) -> dict:
        """The fractions handed to `pruning_curve` (of the original heads, `select_heads` convention), their
        requested fractions, and the ones out of reach on the model as it is."""
        layout = find_heads(unwrap_model(model))
        base = _heads_part(combined_attached(model))
        sites = [s for s in layout if self.kinds is None or s.kind in self.kinds]
        original = sum(s.original_num_heads for s in sites)
        alive = {s.name: (int((base[s.name] != 0).sum()) if base is not None else s.num_heads) for s in sites}
        present = sum(alive.values())
        prunable = sum(max(0, alive[s.name] - self.min_heads_per_layer) for s in sites)
        relative = self.relative and self.scope == "global"
        to_original: dict[str, list[float]] = {}
        skipped = []
        for fraction in self.fractions:
            if relative:
                target = (original - present) + int(fraction * present + 0.5 + 1e-9)
                if target - (original - present) > prunable:
                    skipped.append(fraction)
                    continue
                used = target / original if original else 0.0
            else:
                used = fraction
            to_original.setdefault(repr(float(used)), []).append(fraction)
        return {"fractions_of": "heads present" if relative else "original heads", "heads_present": present,
                "heads_original": original, "skipped_fractions": skipped, "to_original": to_original}

    def _batches(self, model, train_dataloader) -> list:
        if self.importance_batches is not None:
            return local_share(first_batches(self.importance_batches, ALL_BATCHES), model)
        if train_dataloader is None:
            raise ValueError("batches: no batches to compute importance from and no training dataloader; pass "
                             "importance=Importance(batches=...) to PruningCurveCallback.")
        if self._sample is not None and self._sample.dataloader is train_dataloader:  # global batches of the set
            return self._sample.batches()
        return first_batches(train_dataloader, self.num_batches)

    def compute(self, model, train_dataloader=None) -> dict[str, Curve]:
        """The curves for the model as it is now (no Trainer needed beyond the optional dataloader).

        Args:
            model: the model (attached masks count as already pruned).
            train_dataloader: the source of importance batches when `importance_batches` was not given.
        """
        return self.compute_with_meta(model, train_dataloader)[0]

    def compute_with_meta(self, model, train_dataloader=None) -> tuple[dict[str, Curve], dict]:
        """`compute`, and how the fractions were placed (`fractions_of`, heads present, skipped fractions)."""
        meta = self._plan_fractions(model)
        fractions = sorted(float(f) for f in meta["to_original"])
        if not fractions:
            return {}, meta
        heads = HeadScope(scope=self.scope, kinds=self.kinds, min_heads_per_layer=self.min_heads_per_layer,
                          base_mask=_heads_part(combined_attached(model)))
        common = dict(fractions=fractions, heads=heads, key=self.metric_key, metric_name=self.metric_key)
        curves: dict[str, Curve] = {}
        if self.order in ("importance", "both"):
            ranking = Ranking(batches=self._batches(model, train_dataloader), iterative=self.iterative,
                              scorer=self.scorer, scorer_options=self.scorer_options)
            curves["importance"] = pruning_curve(model, self.metric, ranking=ranking, **common)
        if self.order in ("random", "both"):
            for seed in self.random_seeds:
                curves[f"random_seed{seed}"] = pruning_curve(model, self.metric, ranking=Ranking("random", seed=seed),
                                                             **common)
        return curves, meta

    def figure(self):
        """One line per point (importance order; random-order curves are in the JSON only)."""
        series = {}
        for _, entry in sorted(self.curves.items()):
            if not entry["curves"]:
                continue
            data = entry["curves"].get("importance") or next(iter(entry["curves"].values()))
            series[entry["label"]] = ([p["fraction"] for p in data["points"]], [p["value"] for p in data["points"]])
        return curves_figure(series, ylabel=self.metric_key, title="metric vs share of the heads present pruned")


def _heads_part(mask):
    """The heads of a combined attached mask (None stays None): curves rank heads; an FFN mask attached by a
    pruning callback stays in effect on the model while they are taken."""
    return None if mask is None else mask.restricted(("heads",))


__all__ = ["PruningCurveCallback"]
