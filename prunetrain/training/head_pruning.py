"""`HeadPruningCallback`: head importance (Michel et al. 2019) at chosen points of training, recorded as JSON and
TensorBoard heatmaps with the rank correlation between consecutive points (Michel §6: when do the important heads
settle?), and optional pruning on a schedule, by masking (`mode="mask"`) or physical removal (`mode="shrink"`, the
optimizer state sliced so training goes on faster; under DDP the reducer's buckets are rebuilt on every rank).

FFN neurons are pruned by the same callback (`Heads(units=...)`, or a scheduled amount that names neurons —
`{"heads": 0.75, "neurons": 0.5}` — or an FFN kind, or is a FLOP target `{"flops": share}`): importance of neurons comes from the same backward pass, the mask and the shrink are
the heads', and a FLOP target is met by the cheapest mix of heads and neurons (`prunetrain.methods.flop_budget`).

Points are epochs (fractional allowed: 0.5 is the middle of the first epoch) or global steps; every record carries
both the global step and the exact fractional epoch (`prunetrain.training.scheduled`).
"""

from __future__ import annotations

from typing import Any

from prunetrain.engine.heads import (NEURON_KINDS, UNITS, HeadLayout, all_sites, find_heads, find_sites,
                                     supported_units, unwrap_model)
from prunetrain.engine.peft_support import peft_shrink_refusal
from prunetrain.engine.mask import HeadMask, attached_masks, release_saved_masks
from prunetrain.engine.shrink import shrink
from prunetrain.methods.flop_budget import select_by_flops
from prunetrain.methods.importance import HeadScores, get_scorer, random_scores
from prunetrain.methods.importance.registry import UNIT_SCORERS
from prunetrain.methods.constraints import apply_constraints
from prunetrain.methods.selection import FLOPS_KEY, is_flop_target, iterative_prune, select_heads
from prunetrain.training.base import (check_epochs_fit, check_model_kinds, first_batches, importance_heatmap,
                                      kept_summary, local_share)
from prunetrain.training.distributed import find_ddp, rebuild_ddp
from prunetrain.utils.door import checked
from prunetrain.utils.plots import widths_figure
from prunetrain.training.importance_sample import ImportanceSample
from prunetrain.training.options import Heads, Importance, Output, Schedule, resolve_options
from prunetrain.training.points import Plan, Point, amount_decreases, file_label, label, resolve
from prunetrain.training.scheduled import ScheduledCallback
from prunetrain.training.state import guard_weight_loading
from prunetrain.utils.validate import ALL_BATCHES, check_amount, check_choice

MODES = ("mask", "shrink")


@checked(own=("schedule", "heads", "importance", "output"))
class HeadPruningCallback(ScheduledCallback):
    """Head importance at chosen points and, optionally, pruning on a schedule.

        HeadPruningCallback(Schedule(at_epochs=[1, 2, 5], prune={5: 0.2, 8: 0.4}))
        HeadPruningCallback(Schedule(at_epochs=[], prune_steps={450: 0.25, 700: 0.5}, shrink_steps=[700]),
                            heads=Heads(kinds=["encoder_self"]), importance=Importance(batches=dev_batches))

    Args:
        schedule: when (`Schedule`): importance points (`at_epochs`, default epoch 1; `at_steps`), the cumulative
            amounts pruned by each point (`prune`, `prune_steps`), the steps at which the masked heads are removed
            physically (`shrink_steps`) and the "end" point of a run cut short (`record_end`). Importance is also
            computed at every pruning point.
        heads: which units may go (`Heads`: scope, kinds, min_heads_per_layer (default 1: also the neurons every
            FFN keeps), serving constraints, units: heads and/or FFN neurons).
        importance: how heads are ranked (`Importance`: scorer, its options, batches, iterative pruning in steps of
            `step`, default 0.1, re-estimating importance in between: Michel §4).
        output: where files go (`Output`: default `<output_dir>/prunetrain`, with TensorBoard).
        mode: "mask" (zero the heads, keep the weights) or "shrink" (remove them physically with the optimizer
            state sliced; under DDP every rank shrinks the same heads and DDP's gradient buckets are rebuilt; under
            FSDP2 each affected parameter and its optimizer state are gathered, sliced and sharded again).
        **deprecated: the former keyword form (`at_epochs`, `prune`, `scope`, `batches`, `output_dir`, ... : every
            field of the records above, and `at_epochs` as the first positional argument), still accepted with one
            DeprecationWarning until prunetrain 0.2.
    """

    name = "head-pruning"
    OPTIONS = {"schedule": Schedule, "heads": Heads, "importance": Importance, "output": Output}

    def __init__(self, schedule: Schedule | None = None, *, heads: Heads | None = None,
                 importance: Importance | None = None, output: Output | None = None, mode: str = "mask",
                 **deprecated: Any):
        given = dict(schedule=schedule, heads=heads, importance=importance, output=output)
        if schedule is not None and not isinstance(schedule, Schedule):  # the former positional at_epochs
            if "at_epochs" in deprecated:
                raise TypeError("HeadPruningCallback() got multiple values for argument 'at_epochs'")
            given["schedule"], deprecated = None, {"at_epochs": schedule, **deprecated}
        options = resolve_options(type(self).__name__, given, self.OPTIONS, deprecated)
        self.schedule, self.heads, self.importance, self.output = (options[k] for k in self.OPTIONS)
        super().__init__(self.output.output_dir, self.output.tensorboard)
        check_choice("mode", mode, MODES)
        when = self.schedule
        if when.shrink_steps and mode != "mask":
            raise ValueError(f"shrink_steps: {list(when.shrink_steps)} needs mode='mask' (mode={mode!r} already "
                             f"shrinks at every pruning step).")
        self.constraints, self.kinds = self.heads.constraints, self.heads.kind_list
        self._prune_fn = when.prune_function()
        self._prune_epochs = when.prune_epochs()
        self._prune_steps = when.step_amounts()
        self._shrink_steps = list(when.shrink_steps)
        selector, epochs = when.points()
        self._last_epoch = max([int(e) + (e % 1 > 0) for e in epochs + list(self._prune_epochs)], default=None)
        self._init_points(self._plan(selector, epochs), when.record_end)
        self.mode, self.iterative, self.scope = mode, self.importance.iterative, self.heads.scope
        self.step = 0.1 if self.importance.step is None else self.importance.step
        self.min_heads_per_layer = self.heads.kept_per_site(1)
        self.batches, self.num_batches = self.importance.batches, self.importance.num_batches
        self.scorer, self.scorer_options = self.importance.scorer, self.importance.options
        amounts = [*self._prune_epochs.values(), *self._prune_steps.values()]
        self._flop_target = any(is_flop_target(a) for a in amounts)
        ffn_named = [k for a in amounts if isinstance(a, dict) for k in a if k in (*NEURON_KINDS, "neurons")] + \
            [k for k in self.kinds or () if k in NEURON_KINDS]
        if ffn_named and self.heads.units is not None and "neurons" not in self.heads.units:
            raise ValueError(f"units: {self.heads.units!r} leaves out the FFN neurons that {ffn_named[0]!r} names; "
                             f"add 'neurons' (or leave units=None).")
        self.units: tuple[str, ...] = self.heads.units or (UNITS if ffn_named else ("heads",))
        self._check_unit_options()
        self.mask: HeadMask | None = None
        self.history: dict[int, dict] = {}  # global step -> {"step", "epoch", "label", "kind", "scores", "alive"}
        self.stability: list[dict] = []  # Spearman ρ of importance between consecutive points
        self.events: list[dict] = []
        self._amount_at: dict[int, Any] = {}
        self._sample: ImportanceSample | None = None  # the default importance batches (no `batches` given)

    def _plan(self, selector, epochs: list[float]) -> Plan:
        """The importance points: `at_epochs`/`at_steps` and every pruning point (a whole-epoch selector fires
        where `at_epochs` selects the epoch or the `prune` function gives an amount)."""
        prune_fn, whole = self._prune_fn, None
        if selector is not None or prune_fn is not None:
            def whole(epoch: int) -> bool:
                return bool((selector is not None and selector(epoch))
                            or (prune_fn is not None and prune_fn(epoch) is not None))
        return Plan(sorted(set(epochs) | set(self._prune_epochs)),
                    sorted(set(self.schedule.at_steps) | set(self._prune_steps)), whole)

    def _check_unit_options(self) -> None:
        """Neurons need a scorer that scores them; a FLOP target is met in one selection (not iteratively)."""
        wants_neurons = "neurons" in self.units or (self._flop_target and self.heads.units is None)
        if wants_neurons and isinstance(self.scorer, str) and self.scorer not in UNIT_SCORERS:
            raise ValueError(f"scorer: {self.scorer!r} scores attention heads only, and this callback prunes FFN "
                             f"neurons too; use one of {', '.join(map(repr, UNIT_SCORERS))} (or a callable scorer "
                             f"that scores both).")
        if self._flop_target and self.iterative:
            raise ValueError(f"iterative: a FLOP target {{'{FLOPS_KEY}': share}} is met in one selection over every "
                             f"unit; set Importance(iterative=False).")
        if "units" in self.scorer_options:
            raise ValueError("scorer_options: 'units' is set by the callback from Heads(units=...); leave it out.")

    def _scorer_options(self) -> dict:
        """The scorer's options, with the units this callback prunes (and raw scores for a FLOP target, which
        compares heads with neurons by their loss per multiply-add: `prunetrain.methods.flop_budget`)."""
        options = dict(self.scorer_options)
        if isinstance(self.scorer, str) and self.scorer in UNIT_SCORERS and self.units != ("heads",):
            options["units"] = self.units
        if self._flop_target and self.scorer == "gradient":
            options.setdefault("normalize", None)
        return options

    # configuration checks that need the model and the training arguments
    def on_init_end(self, args, state, control, model=None, **kwargs):
        self.check_engine(model, args)
        check_epochs_fit(args, self._last_epoch, "at_epochs/prune")
        if model is not None:
            guard_weight_loading(model)  # a resume into a model of the wrong shape says what to do, in one line
            attached_masks(model)  # masks attached before peft wrapped the model move onto its LoRA layers
            if self._flop_target and self.heads.units is None:
                self.units = supported_units(model)  # a FLOP target: every unit the model has
            if self.mode == "shrink" or self._shrink_steps:  # a peft layer shrink cannot slice: refused now
                refusal = peft_shrink_refusal(model, [s for s in all_sites(model) if s.info.unit in self.units])
                if refusal:
                    raise ValueError(f"mode: HeadPruningCallback would shrink this PEFT model, but {refusal} Use "
                                     f"mode='mask' without shrink_steps.")
            layout = find_sites(model, self.units)
            check_model_kinds(self.kinds, layout)
            self._check_amounts_fit(layout, model)
            if self.mask is None:
                self.mask = HeadMask.ones(layout)

    def _select(self, scores: HeadScores, amount, model, base_mask: HeadMask | None) -> HeadMask:
        """The mask for a cumulative `amount`: a FLOP target priced on the model's weights, else `select_heads`."""
        if is_flop_target(amount):
            return select_by_flops(scores, amount[FLOPS_KEY], model, base_mask=base_mask,
                                   min_per_site=self.min_heads_per_layer)
        return select_heads(scores, amount, scope=self.scope, kinds=self.kinds,
                            min_heads_per_layer=self.min_heads_per_layer, base_mask=base_mask)

    def _check_amounts_fit(self, layout: HeadLayout, model) -> None:
        """Refuse, before training starts, an amount the model cannot give: more heads than in scope, or more than
        `min_heads_per_layer` leaves prunable."""
        in_scope = sum(s.num_heads for s in layout if self.kinds is None or s.kind in self.kinds)
        schedules = [("prune", self._prune_epochs), ("prune_steps", self._prune_steps)]
        for argument, table in schedules:
            for key, amount in table.items():
                if isinstance(amount, int) and amount > in_scope:
                    raise ValueError(f"{argument}[{key:g}]: {amount} heads is more than the {in_scope} heads in "
                                     f"scope.")
                try:
                    self._select(random_scores(layout), amount, model, None)
                except ValueError as err:
                    raise ValueError(f"{argument}[{key:g}]: {amount!r} cannot be reached with min_heads_per_layer="
                                     f"{self.min_heads_per_layer} on this model ({err}); lower the amount or "
                                     f"min_heads_per_layer.") from None

    def engine_requirements(self) -> list[tuple[str, tuple[str, ...]]]:
        needs = super().engine_requirements()
        if self.mode == "shrink":
            needs.append(("HeadPruningCallback(mode='shrink')", ("single", "ddp", "fsdp2")))
        elif self._shrink_steps:  # named as the user gave it: masks, then a shrink at these steps
            needs.append((f"HeadPruningCallback(Schedule(shrink_steps={sorted(self._shrink_steps)!r}))",
                          ("single", "ddp", "fsdp2")))
        return needs

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._setup(args, state, model)
        restored = self._restore(args, state)
        if restored and model is not None:
            release_saved_masks(model, self)  # the checkpoint's record of this callback's mask: restored below
        if restored and self.mask is not None and self.mask.num_kept_units < self.mask.num_units:
            if self.mode == "mask":
                self.mask.attach(model, owner=self)
        self._start_plan(args, state, train_dataloader)
        self._amount_at = self._place_amounts()
        if self.batches is None and train_dataloader is not None:
            self._sample = ImportanceSample(args, train_dataloader, self.num_batches, self.name)
            self._sample.check_engine(model)

    def _place_amounts(self) -> dict[int, Any]:
        """The prune schedule on steps; cumulative amounts of one type must not decrease in step order."""
        placed = {p.step: self._prune_epochs[p.given[1]]
                  for p in resolve(list(self._prune_epochs), [], self.plan.per_epoch)} if self._prune_epochs else {}
        for step, amount in self._prune_steps.items():
            if step in placed and placed[step] != amount:
                raise ValueError(f"prune_steps[{step}]: {amount!r} falls on the same step as prune's "
                                 f"{placed[step]!r}; give one amount per step.")
            placed[step] = amount
        previous = None
        total = self.mask.num_units if self.scope == "global" and self.mask is not None else None  # mixed amounts
        for step in sorted(placed):
            amount = placed[step]
            if previous is not None and amount_decreases(previous[1], amount, total):
                raise ValueError(f"prune/prune_steps: {amount!r} at step {step} is less than the {previous[1]!r} "
                                 f"pruned at step {previous[0]}; the schedule gives cumulative amounts in step order.")
            previous = (step, amount)
        return placed

    def state_dict(self) -> dict:
        return {"mask": self.mask.to_dict() if self.mask is not None else None,
                "layout": self.mask.layout.to_dict() if self.mask is not None else None,
                "history": {str(k): v for k, v in self.history.items()}, "events": self.events,
                "stability": self.stability, **self.points_state()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("mask") is not None:
            layout = HeadLayout.from_dict(state["layout"])
            if self.mask is not None and self.mask.attached:
                self.mask.detach()
            self.mask = HeadMask.from_dict(state["mask"], layout)
        self.history = {int(k): v for k, v in state.get("history", {}).items()}
        self.events = list(state.get("events", []))
        self.stability = list(state.get("stability", []))
        self.load_points_state(state)

    def _importance_batches(self, model, train_dataloader) -> list:
        if self.batches is not None:
            return local_share(first_batches(self.batches, ALL_BATCHES), model)
        if train_dataloader is None:
            raise ValueError("batches: no batches for importance and no training dataloader; pass "
                             "importance=Importance(batches=...) to HeadPruningCallback.")
        if self._sample is not None:  # global batches of the training set, whatever the world size and accumulation
            return self._sample.batches()
        return first_batches(train_dataloader, self.num_batches)

    def _amount(self, point: Point, kind: str):
        """The cumulative amount the schedule prunes at `point` (None: an importance point only)."""
        amount = None
        if kind == "scheduled":
            amount = self._amount_at.get(point.step)
            if amount is None and self._prune_fn is not None and point.given[0] == "epoch" and point.given[1] % 1 == 0:
                amount = self._prune_fn(int(point.given[1]))
                if amount is not None:
                    check_amount(f"prune({int(point.given[1])})", amount)
        return amount

    def is_measurement(self, point: Point, kind: str) -> bool:
        """An importance point that prunes and shrinks nothing only measures (the training clock leaves it out);
        importance at a pruning point, the pruning and a shrink are the method's work."""
        return self._amount(point, kind) is None and not (kind == "scheduled" and point.step in self._shrink_steps)

    def act(self, point: Point, kind: str, state, model=None, optimizer=None, train_dataloader=None, **kwargs):
        amount = self._amount(point, kind)
        if self.mask is None:
            self.mask = HeadMask.ones(model, units=self.units)
        batches = self._importance_batches(model, train_dataloader)
        scores = get_scorer(self.scorer, **self._scorer_options())(model, batches)
        self.record(state.global_step, float(state.epoch or 0), scores, kind)
        if amount is not None:
            self.apply_pruning(model, optimizer, state, amount, scores, batches)
        if kind == "scheduled" and point.step in self._shrink_steps:
            self.shrink_masked(model, optimizer, state)

    def record(self, step: int, epoch: float, scores: HeadScores, kind: str = "scheduled") -> None:
        """Keep the scores of the point at global `step` (fractional `epoch`): JSON file named by both, history,
        TensorBoard heatmap at the global step, and Spearman ρ against the previous point on the heads alive in
        both (identified by site and original head index)."""
        name = f"importance_{file_label(step, epoch)}.json"
        data = scores.to_dict()
        data["meta"] = dict(data.get("meta", {}), point={"step": step, "epoch": epoch, "label": label(step, epoch),
                                                         "kind": kind})
        alive = {"heads": {}, "neurons": {}}  # unit -> {"site:original index": score} of the units alive
        for site in scores.layout:
            keep = self.mask[site.name].tolist() if self.mask is not None and site.name in self.mask.layout else None
            for position, original in enumerate(site.heads):
                if keep is None or keep[position]:
                    alive[site.unit][f"{site.name}:{original}"] = float(scores.values[site.name][position])
        previous = max((s for s in self.history if s < step), default=None)
        self.history[step] = {"step": step, "epoch": epoch, "label": label(step, epoch), "kind": kind, "file": name,
                              "scores": data, "alive": alive["heads"], "alive_neurons": alive["neurons"]}
        self._write_json(name, data)
        if previous is not None:
            self._record_stability(self.history[previous], self.history[step])
        self._write_json("importance_points.json", [{k: v for k, v in h.items()
                                                     if k not in ("scores", "alive", "alive_neurons")}
                                                    for _, h in sorted(self.history.items())])
        heads = scores.restricted(("heads",))
        if self._is_main and self._tb is not None and len(heads.layout):
            self._tb_figure("prunetrain/importance", importance_heatmap(heads, f"head importance, "
                                                                               f"{label(step, epoch)}"), step)

    def _record_stability(self, before: dict, after: dict) -> None:
        """Spearman ρ of the scores of the heads alive at both points (and, apart, of the FFN neurons)."""
        from prunetrain.methods.studies import defined, spearman

        entry = {"from_step": before["step"], "from_epoch": before["epoch"], "to_step": after["step"],
                 "to_epoch": after["epoch"], "label": f"{before['label']} → {after['label']}"}
        for unit, key, suffix in (("heads", "alive", ""), ("neurons", "alive_neurons", "_neurons")):
            first, second = before.get(key) or {}, after.get(key) or {}
            common = sorted(set(first) & set(second))
            if unit == "neurons" and not common:
                continue
            rho = defined(spearman([first[h] for h in common], [second[h] for h in common])) \
                if len(common) >= 2 else None  # None also where one side's scores are all equal (every gate closed)
            entry.update({f"{unit}_compared": len(common), f"spearman{suffix}": rho})
            if rho is not None:
                self._tb_scalar(f"prunetrain/importance_spearman{suffix}_vs_previous", rho, after["step"])
                self._log(f"importance {entry['label']}: Spearman ρ {rho:.3f} over {len(common)} {unit}")
        self.stability.append(entry)
        self._write_json("importance_stability.json", self.stability)

    def apply_pruning(self, model, optimizer, state, amount, scores: HeadScores, batches: list) -> HeadMask:
        """Prune to the cumulative `amount` and apply it (mask or shrink); one log line per event."""
        step, epoch = int(state.global_step), float(state.epoch or 0)
        before, counts_before = self.mask.kept_per_kind(), _kept_counts(self.mask)
        if self.iterative:
            step_amount = self.step if type(self.step) is type(amount) else (
                float(self.step) if isinstance(amount, float) else max(1, int(self.step)))
            result = iterative_prune(model, batches, step=step_amount, target=amount, scorer=self.scorer,
                                     scorer_options=self._scorer_options(), scope=self.scope, kinds=self.kinds,
                                     min_heads_per_layer=self.min_heads_per_layer, base_mask=self.mask,
                                     units=self.units)
            new_mask = result.mask
        else:
            new_mask = self._select(scores, amount, model, self.mask)
        if self.constraints is not None:  # the amount moves to the nearest layout the constraints allow
            new_mask = apply_constraints(new_mask, scores, self.constraints)
        if self.mask.attached:
            self.mask.detach()
        if self.mode == "shrink":
            layout = self._shrink(model, new_mask, optimizer)
            self.mask = HeadMask.ones(layout)
        else:
            self.mask = new_mask
            self.mask.attach(model, owner=self)
        after, counts_after = self.mask.kept_per_kind(), _kept_counts(self.mask)
        event = {"step": step, "epoch": epoch, "label": label(step, epoch), "amount": amount, "mode": self.mode,
                 **_counts_event(counts_before, counts_after), "per_kind_before": before, "per_kind_after": after}
        self.events.append(event)
        self._write_json("pruning_events.json", self.events)
        self._log(f"{label(step, epoch)}: pruned {_counts_line(counts_before, counts_after)} "
                  f"({kept_summary(before, after)}) [{self.mode}]")
        self._tb_scalar("prunetrain/heads_alive", counts_after["heads"], step)
        for kind, count in after.items():
            self._tb_scalar(f"prunetrain/{'neurons' if kind in NEURON_KINDS else 'heads'}_alive/{kind}", count, step)
        self._tb_scalar("prunetrain/sparsity", 1 - counts_after["heads"] / max(1, sum(s.original_num_heads
                                                                                      for s in find_heads(model))),
                        step)
        if "neurons" in counts_after:
            self._tb_scalar("prunetrain/neurons_alive", counts_after["neurons"], step)
            ffn = [site for site in self.mask.layout if site.unit == "neurons"]
            self._tb_figure("prunetrain/ffn_widths", widths_figure(
                [f"{site.kind}:{site.layer}" for site in ffn], [int((self.mask[site.name] != 0).sum()) for site in ffn],
                [site.original_num_heads for site in ffn], f"FFN widths, {label(step, epoch)}"), step)
        return self.mask

    def shrink_masked(self, model, optimizer, state) -> None:
        """Remove the units masked so far physically (optimizer state sliced); training goes on with the smaller
        model and an all-ones mask on it. One log line and one event (`mode: "shrink"`)."""
        if self.mask is None or self.mask.num_kept_units == self.mask.num_units:
            return
        step, epoch = int(state.global_step), float(state.epoch or 0)
        if self.mask.attached:
            self.mask.detach()
        before = _present_per_kind(self.mask.layout)
        counts_before = {"heads": self.mask.num_heads, **({"neurons": self.mask.num_neurons}
                                                           if "neurons" in self.mask.layout.units else {})}
        layout = self._shrink(model, self.mask, optimizer)
        self.mask = HeadMask.ones(layout)
        counts_after = _kept_counts(self.mask)
        event = {"step": step, "epoch": epoch, "label": label(step, epoch), "amount": None, "mode": "shrink",
                 **_counts_event(counts_before, counts_after), "per_kind_before": before,
                 "per_kind_after": _present_per_kind(layout), "parameters_after": sum(
                     p.numel() for p in unwrap_model(model).parameters())}
        self.events.append(event)
        self._write_json("pruning_events.json", self.events)
        self._log(f"{label(step, epoch)}: shrink: {_counts_line(counts_before, counts_after)} present (the masked "
                  f"units removed, optimizer state sliced) [shrink]")

    @staticmethod
    def _shrink(model, mask: HeadMask, optimizer) -> HeadLayout:
        """Remove the masked heads in place (optimizer state sliced). Under DDP every rank computed the same mask
        (importance is all-reduced), shrinks the same heads, then rebuilds DDP's gradient buckets; under FSDP2
        `shrink` gathers, slices and re-shards each affected parameter and its optimizer state (a collective)."""
        net = unwrap_model(model)
        ddp = find_ddp(net)
        layout = shrink(net, mask, optimizer=optimizer)
        if ddp is not None:
            rebuild_ddp(ddp)
        return layout

    def on_train_end(self, args, state, control, **kwargs):
        self._finish_plan(state)
        if self.mask is not None:
            self._write_json("final_mask.json", self.mask.to_dict())
        super().on_train_end(args, state, control, **kwargs)


def _kept_counts(mask: HeadMask) -> dict[str, int]:
    """{"heads": kept heads, and "neurons": kept FFN neurons when the mask describes them}."""
    counts = {"heads": mask.num_kept}
    if "neurons" in mask.layout.units:
        counts["neurons"] = mask.num_kept_neurons
    return counts


def _present_per_kind(layout: HeadLayout) -> dict[str, int]:
    """{kind: units present} for every kind of the layout (attention kinds, then FFN kinds)."""
    return {**layout.heads_per_kind(), **layout.neurons_per_kind()}


def _counts_event(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """An event's counts: `heads_before`/`heads_after`, and `neurons_before`/`neurons_after` when pruned."""
    return {f"{unit}_{when}": counts[unit] for unit in before for when, counts in (("before", before),
                                                                                  ("after", after))}


def _counts_line(before: dict[str, int], after: dict[str, int]) -> str:
    """`heads 144 → 36` (and `, neurons 12288 → 6144` when neurons are pruned) for a log line."""
    return ", ".join(f"{unit} {before[unit]} → {after[unit]}" for unit in before)


__all__ = ["HeadPruningCallback"]
