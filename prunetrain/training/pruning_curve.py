"""`PruningCurveCallback`: at chosen epochs, the metric of the model with 0…90 % of its heads masked in importance
order (Michel et al. 2019 §6, Fig. 5), while training goes on untouched (masks, RNG state and train/eval mode are
exactly as before after each curve)."""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from prunetrain.engine.heads import find_heads, unwrap_model
from prunetrain.methods.curve import DEFAULT_FRACTIONS, Curve, Metric, pruning_curve
from prunetrain.methods.importance import get_scorer, random_scores
from prunetrain.methods.selection import SCOPES, select_heads
from prunetrain.training.base import (PrunetrainCallback, check_callback_kinds, check_epochs_fit, check_model_kinds,
                                      combined_attached, current_epoch, epoch_selector, first_batches, local_share)
from prunetrain.training.state import RngState
from prunetrain.utils.plots import curves_figure, save_figure
from prunetrain.utils.validate import ALL_BATCHES, check_choice, check_fractions, check_int

ORDERS = ("importance", "random", "both")


class PruningCurveCallback(PrunetrainCallback):
    """The metric of the model with 0…90 % of its heads masked, at chosen epochs (Michel et al. 2019 §6).

    Example (BLEU of a translation model, with `bleu_metric` of the translation application `prunetrain.mt.metrics`;
    any callable `model -> float | dict` works)::

        PruningCurveCallback(metric=bleu_metric(tokenizer, dev_pairs), metric_key="bleu")

    Args:
        at_epochs: a list of epochs, an int N (every N epochs) or a function epoch -> bool.
        metric: a callable `model -> float | dict` (e.g. `prunetrain.mt.metrics.bleu_metric(...)`,
            `prunetrain.methods.curve.loss_metric(batches)` or `accuracy_metric(batches)`).
        metric_key: the entry to plot when the metric returns a dict (e.g. "bleu"); default "value".
        fractions: shares of all heads to prune (default 0, 0.1, …, 0.9).
        order: "importance", "random" (seeded baseline, one curve per seed in `random_seeds`) or "both".
        random_seeds: seeds of the random-order curves.
        iterative: re-estimate importance between fractions (slower; Michel §4).
        scorer: the importance scorer ranking the heads ("gradient", "ablation", "confidence" or a callable).
        scorer_options: keyword options of the scorer.
        importance_batches: batches for importance (under DDP each rank takes its share); default the first
            `num_batches` batches of the Trainer's training dataloader.
        num_batches: see `importance_batches`.
        scope, kinds, min_heads_per_layer: passed to `select_heads`.
        output_dir: where files go (default `<output_dir>/prunetrain`).
        tensorboard: write TensorBoard scalars and figures.
    """

    name = "pruning-curve"

    def __init__(self, at_epochs=(1,), *, metric: Metric, metric_key: str | None = None,
                 fractions: Sequence[float] = DEFAULT_FRACTIONS, order: str = "importance",
                 random_seeds: Sequence[int] = (0,), iterative: bool = False, scorer: str | Callable = "gradient",
                 scorer_options: Mapping | None = None, importance_batches: Iterable | None = None,
                 num_batches: int = 8, scope: str = "global", kinds=None, min_heads_per_layer: int = 0,
                 output_dir: str | None = None, tensorboard: bool = True):
        super().__init__(output_dir, tensorboard)
        self._at, self._last_epoch = epoch_selector(at_epochs, "at_epochs")
        if not callable(metric):
            raise ValueError(f"metric: {metric!r} is not a callable model -> float | dict; build one with "
                             f"prunetrain.mt.metrics.bleu_metric, prunetrain.methods.curve.loss_metric or "
                             f"accuracy_metric.")
        self.fractions = check_fractions("fractions", fractions)
        check_choice("order", order, ORDERS)
        check_choice("scope", scope, SCOPES)
        self.kinds = check_callback_kinds(kinds)
        check_int("num_batches", num_batches)
        check_int("min_heads_per_layer", min_heads_per_layer, 0)
        if iterative and order == "random":
            raise ValueError("iterative: has no meaning with order='random'.")
        get_scorer(scorer, **dict(scorer_options or {}))  # validates the name and options now
        self.metric, self.metric_key = metric, metric_key or "value"
        self.order, self.random_seeds, self.iterative = order, list(random_seeds), iterative
        self.scorer, self.scorer_options = scorer, dict(scorer_options or {})
        self.importance_batches, self.num_batches = importance_batches, num_batches
        self.scope, self.min_heads_per_layer = scope, min_heads_per_layer
        self.curves: dict[int, dict[str, dict]] = {}

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

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state, model)
        self._restore(args, state)

    def state_dict(self) -> dict:
        return {"curves": {str(k): v for k, v in self.curves.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.curves = {int(k): v for k, v in state.get("curves", {}).items()}

    def on_epoch_end(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        epoch = current_epoch(state)
        if not self._at(epoch):
            return
        rng = RngState.capture()
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

    def _batches(self, model, train_dataloader) -> list:
        if self.importance_batches is not None:
            return local_share(first_batches(self.importance_batches, ALL_BATCHES), model)
        if train_dataloader is None:
            raise ValueError("importance_batches: no batches to compute importance from.")
        return first_batches(train_dataloader, self.num_batches)

    def compute(self, model, train_dataloader=None) -> dict[str, Curve]:
        """The curves for the model as it is now (no Trainer needed beyond the optional dataloader).

        Args:
            model: the model (attached masks count as already pruned).
            train_dataloader: the source of importance batches when `importance_batches` was not given.
        """
        common = dict(fractions=self.fractions, scope=self.scope, kinds=self.kinds,
                      min_heads_per_layer=self.min_heads_per_layer, base_mask=combined_attached(model),
                      key=self.metric_key, metric_name=self.metric_key)
        curves: dict[str, Curve] = {}
        if self.order in ("importance", "both"):
            curves["importance"] = pruning_curve(model, self.metric, batches=self._batches(model, train_dataloader),
                                                 iterative=self.iterative, scorer=self.scorer,
                                                 scorer_options=self.scorer_options, **common)
        if self.order in ("random", "both"):
            for seed in self.random_seeds:
                curves[f"random_seed{seed}"] = pruning_curve(model, self.metric, order="random", seed=seed, **common)
        return curves

    def figure(self):
        """One line per epoch (importance order; random-order curves are in the JSON only)."""
        series = {}
        for epoch, curves in sorted(self.curves.items()):
            data = curves.get("importance") or next(iter(curves.values()))
            series[f"epoch {epoch}"] = ([p["fraction"] for p in data["points"]], [p["value"] for p in data["points"]])
        return curves_figure(series, ylabel=self.metric_key, title="metric vs heads pruned, per epoch")


__all__ = ["PruningCurveCallback"]
