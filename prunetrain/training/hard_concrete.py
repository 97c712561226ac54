"""`HardConcreteCallback`: Hard-Concrete gates on attention heads (Voita et al. 2019 §6) trained beside the model
with the L0 penalty λ Σ (1 − P(g = 0)) or a Lagrangian head budget; at the end the gates become a HeadMask
(optionally `shrink`). Under grouped-query attention a gate closes a whole key/value group, so a head budget is met
exactly in whole groups (or refused before the first step when no set of groups holds it). FFN neurons are gated
beside the heads with a budget in multiply-adds (`target_flops`, CoFi's Lagrangian on the expected model size)."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from prunetrain.engine import peft_support
from prunetrain.engine.heads import NEURON_KINDS, find_sites, live_sites, supported_units, unit_of, unwrap_model
from prunetrain.engine.mask import HeadMask, release_saved_masks
from prunetrain.engine.remote_code import mark_pruned
from prunetrain.engine.shrink import shrink
from prunetrain.methods.constraints import apply_constraints
from prunetrain.methods.flop_budget import model_cost, original_cost
from prunetrain.methods.gates import HardConcreteGates, LagrangianBudget, gates_for
from prunetrain.training.base import PrunetrainCallback, check_model_kinds, when
from prunetrain.training.distributed import find_ddp, rebuild_ddp, world_size
from prunetrain.training.options import GateTraining, Heads, Output, resolve_options
from prunetrain.training.points import is_whole_epoch, label
from prunetrain.training.state import guard_weight_loading, load_optimizer_state, optimizer_state
from prunetrain.utils.device import device_of
from prunetrain.utils.door import NonNegativeInt, checked
from prunetrain.utils.plots import heatmap_figure
from prunetrain.utils.validate import check_choice, check_open_fraction, check_positive_float

FINALIZE = ("mask", "shrink", "none")
LOG_KEYS = ("gates/expected_l0", "gates/penalty", "gates/heads_open", "gates/neurons_open",
            "gates/expected_flops_share", "gates/lambda", "gates/lambda_1", "gates/lambda_2")
"""Keys this callback adds to the Trainer's logs (`gates/lambda` with `lam`, `gates/lambda_1/2` with a budget,
`gates/neurons_open` when FFN neurons are gated, `gates/expected_flops_share` — the expected share of the original
model's multiply-adds left — with `target_flops`)."""


@checked(own=("heads", "training", "output"))
class HardConcreteCallback(PrunetrainCallback):
    """Hard-Concrete gates on attention heads (Voita et al. 2019 §6), trained beside the model.

    How the penalty enters training without a Trainer subclass: the penalty does not depend on the data, so its
    gradient is added to the gate parameters at each optimizer step, after the data gradient (accumulated over
    the step's micro-batches and, under DDP or FSDP, averaged over ranks) — exactly the gradient of
    L = L_xent + λ Σ (1 − P(g = 0)) (Voita eq. 6). The Trainer's logged loss is L_xent; the penalty is logged
    separately.

    Example (Voita §6.2: encoder self-attention gated, decoder frozen; or a head budget)::

        HardConcreteCallback(lam=0.05, heads=Heads(kinds=["encoder_self"]), freeze="decoder")
        HardConcreteCallback(target_heads=24, training=GateTraining(gate_lr=0.05), start_step=600)
        HardConcreteCallback(target_flops=0.5, start_step=600)   # heads and FFN neurons: half the multiply-adds

    Args:
        lam: λ of the L0 penalty λ Σ_i (1 − P(g_i = 0)) (Voita eq. 6). Exactly one of `lam`, `target_heads` and
            `target_flops` is given.
        target_heads: a head budget: keep this many gated heads (int) or this share of them (float in (0, 1]),
            reached with a Lagrangian on the expected L0 (`LagrangianBudget`).
        target_flops: a budget in multiply-adds: remove this share (float in (0, 1)) of the model's per-token weight
            multiply-adds (`prunetrain.methods.flop_budget`; equal to its linear layers' weight parameters), with
            gates on heads and FFN neurons (every unit the model has, unless `Heads(units=...)` says which), reached
            with a Lagrangian on the expected share left (CoFi, Xia et al. 2022, eq. 5); the final mask removes at
            least the share, over it by less than one gate's cost.
        heads: which units are gated (`Heads`: `kinds`, default all, Voita §6.2 gates "encoder_self" only; `units`:
            heads, or FFN neurons too with `target_flops`) and the `constraints` the final mask is made to satisfy
            (units ranked by log α), e.g. `ServingConstraints(same_heads_per_kind=True)` for a uniform layout. Gates
            decide per unit, so `scope` stays "global" and `min_heads_per_layer` unset.
        freeze: None, "decoder" (Voita §6.2: the decoder is frozen while encoder heads are gated), "model"
            (only the gates train — then the Trainer needs at least one trainable parameter, so prefer
            "decoder" or a predicate) or a predicate name -> bool. Applied before the Trainer builds its optimizer,
            so frozen weights are left out of it; undone (each parameter's `requires_grad` restored) at train end.
        start_step: the global step after which the gates join training (0: from the start). Before it the model
            trains as it is; gates started on an untrained model close heads before any head has learnt anything
            (measured: a 36-of-144 budget from step 0 left the wmt-small-deen model at ~1 BLEU).
        finalize: at the end of training the gates become a HeadMask (the deterministic gates log α > 0; with
            `target_heads`, exactly the budgeted number of gated heads with the largest log α, in whole key/value
            groups under grouped-query attention: a budget no set of groups holds, and a "shrink" the model's
            adapter refuses, are refused when the Trainer is built): "mask" attaches it to the
            model, "shrink" removes the heads (also under DDP and FSDP2, where every rank removes the same heads:
            the gate gradients are averaged over ranks), "none" only records it.
        training: how the gates train (`GateTraining`: gate_lr, lagrangian_lr, init_log_alpha, seed).
        output: where files go (`Output`: default `<output_dir>/prunetrain`, with TensorBoard).
        **deprecated: the former keyword form (`kinds`, `constraints`, `gate_lr`, `lagrangian_lr`,
            `init_log_alpha`, `seed`, `output_dir`, `tensorboard`), still accepted with one DeprecationWarning until
            prunetrain 0.2.

    Logs: at every Trainer logging step the expected L0, the penalty and λ (λ1, λ2 of the Lagrangian with a budget)
    and the heads whose gate is open join the Trainer's logs (`LOG_KEYS`): the console, `trainer.state.log_history`
    and every callback after this one. The Trainer calls the reporters of `report_to` before the callbacks given to
    it, so a reporter that should record them goes after this callback (`callbacks=[gates, TensorBoardCallback()]`,
    `report_to=[]`); prunetrain's own TensorBoard log (`<output_dir>/prunetrain/tensorboard`) has them too.
    """

    name = "hard-concrete"

    OPTIONS = {"heads": Heads, "training": GateTraining, "output": Output}

    def __init__(self, lam: float | None = None, *, target_heads: int | float | None = None,
                 target_flops: float | None = None, heads: Heads | None = None,
                 freeze: str | Callable[[str], bool] | None = None, start_step: NonNegativeInt = 0,
                 finalize: str = "mask",
                 training: GateTraining | None = None, output: Output | None = None, **deprecated: Any):
        options = resolve_options(type(self).__name__, dict(heads=heads, training=training, output=output),
                                  self.OPTIONS, deprecated)
        self.heads, self.training, self.output = (options[k] for k in self.OPTIONS)
        super().__init__(self.output.output_dir, self.output.tensorboard)
        if self.heads.scope != "global" or self.heads.min_heads_per_layer is not None:
            raise ValueError(f"heads: HardConcreteCallback gates every head of `kinds`, so it takes no scope "
                             f"({self.heads.scope!r}) or min_heads_per_layer ({self.heads.min_heads_per_layer!r}); "
                             f"leave them unset.")
        self.constraints = self.heads.constraints
        if sum(x is not None for x in (lam, target_heads, target_flops)) != 1:
            raise ValueError(f"lam, target_heads, target_flops: give exactly one (a penalty weight λ, a head budget "
                             f"or a share of multiply-adds), got lam={lam!r}, target_heads={target_heads!r}, "
                             f"target_flops={target_flops!r}.")
        if target_flops is not None:
            check_open_fraction("target_flops", target_flops)
        ffn_kinds = [k for k in self.heads.kinds or () if k in NEURON_KINDS]
        if target_flops is None and (ffn_kinds or (self.heads.units is not None and "neurons" in self.heads.units)):
            what = f"kinds {ffn_kinds!r}" if ffn_kinds else f"units={self.heads.units!r}"
            raise ValueError(f"heads: {what} gates FFN neurons, which `lam` and `target_heads` (counted in heads) "
                             f"cannot weigh against heads; give the budget as target_flops (a share of the "
                             f"multiply-adds).")
        if ffn_kinds and self.heads.units is not None and "neurons" not in self.heads.units:
            raise ValueError(f"units: {self.heads.units!r} leaves out the FFN neurons that kind {ffn_kinds[0]!r} "
                             f"names; add 'neurons' (or leave units=None).")
        if lam is not None:
            check_positive_float("lam", lam, allow_zero=True)
        if target_heads is not None:
            if isinstance(target_heads, bool) or not isinstance(target_heads, (int, float)):
                raise ValueError(f"target_heads: {target_heads!r} must be a count (int >= 0) or a share of the "
                                 f"gated heads (float in (0, 1]).")
            if isinstance(target_heads, float) and not 0 < target_heads <= 1:
                raise ValueError(f"target_heads: {target_heads!r} is not a share in (0, 1] of the gated heads.")
            if isinstance(target_heads, int) and target_heads < 0:
                raise ValueError(f"target_heads: {target_heads!r} is negative.")
        if not (freeze is None or callable(freeze) or freeze in ("decoder", "model")):
            raise ValueError(f"freeze: {freeze!r} is not one of None, 'decoder', 'model' or a function name -> bool.")
        check_choice("finalize", finalize, FINALIZE)
        self.start_step = start_step
        self.kinds = self.heads.kind_list
        self.lam, self.target_heads, self.target_flops, self.freeze = lam, target_heads, target_flops, freeze
        self.units: tuple[str, ...] | None = self.heads.units  # None until the model is known: see on_init_end
        self._original_cost = self._fixed_cost = 0.0  # with target_flops: multiply-adds in all, and never gated
        t = self.training
        self.gate_lr, self.lagrangian_lr, self.init_log_alpha, self.seed = (t.gate_lr, t.lagrangian_lr,
                                                                            t.init_log_alpha, t.seed)
        self.finalize = finalize
        self.gates: HardConcreteGates | None = None
        self.lagrangian: LagrangianBudget | None = None
        self._gate_optimizer: torch.optim.Optimizer | None = None
        self._lagrangian_optimizer: torch.optim.Optimizer | None = None
        self._frozen: list[nn.Parameter] = []  # parameters this callback froze (and unfreezes at train end)
        self._pending_steps: dict[str, float] = {}
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

    @property
    def budget(self) -> int | None:
        """The number of gated heads the final mask keeps with `target_heads` (None without a budget)."""
        return None if self.target_count is None else int(round(self.target_count))

    def _refuse_what_cannot_be_exact(self, net: nn.Module) -> None:
        """Before the first step: a budget no set of whole key/value groups holds, and a final shrink that the
        model's adapter refuses for a gated site (the run would end in an error after all its steps)."""
        if self.budget is not None:
            self.gates.check_budget(self.budget, argument="target_heads")
        if self.target_flops is not None:
            reachable = 1 - self._fixed_cost / self._original_cost
            if self.target_flops > reachable + 1e-12:
                raise ValueError(f"target_flops: {self.target_flops!r} of the model's multiply-adds cannot be removed: "
                                 f"the gated units ({', '.join(self.units)} of kinds {', '.join(self.gates.kinds)}) "
                                 f"carry {reachable:.4f} of them.")
        if self.finalize == "shrink":
            for site in live_sites(net, self.units):
                reason = site.info.name in self.gates.site_names and (site.adapter.shrink_refusal(site)
                                                                      or peft_support.shrink_refusal(site))
                if reason:
                    raise ValueError(f"finalize: 'shrink' is refused for site {site.info.name!r}: {reason} Use "
                                     f"finalize='mask' (the gates' mask stays attached).")

    def on_init_end(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("model: HardConcreteCallback needs the Trainer's model.")
        self.check_engine(model, args)
        net = unwrap_model(model)
        if self.units is None:  # a budget in multiply-adds gates every unit the model has; the others, heads
            self.units = supported_units(net) if self.target_flops is not None else ("heads",)
        check_model_kinds(self.kinds, find_sites(net, self.units))
        self.gates = gates_for(net, kinds=self.kinds, units=self.units, init_log_alpha=self.init_log_alpha,
                               seed=self.seed)
        self.gates.owner = self.name  # saves record the gates as this callback's (taken back on resume)
        guard_weight_loading(net)
        if self.target_flops is not None:
            self._original_cost = original_cost(net, self.gates.layout)
            self._fixed_cost = model_cost(net) - sum(self.gates.unit_costs[n] * self.gates.layout[n].num_heads
                                                     for n in self.gates.site_names)
        gated = self.gates.gated_count("heads")
        if isinstance(self.target_heads, int) and self.target_heads > gated:
            raise ValueError(f"target_heads: {self.target_heads} is more than the {gated} gated heads.")
        self._refuse_what_cannot_be_exact(net)
        self.freeze_parameters(net)
        if self.start_step == 0:
            self.gates.attach(net)
        self._gate_optimizer = torch.optim.Adam(self.gates.parameters(), lr=self.gate_lr, weight_decay=0.0)
        if self.target_heads is not None or self.target_flops is not None:
            self.lagrangian = LagrangianBudget().to(device_of(net))
            self._lagrangian_optimizer = torch.optim.Adam(self.lagrangian.parameters(), lr=self.lagrangian_lr,
                                                          maximize=True)

    # freeze / unfreeze (symmetric) ----------------------------------------------------------------------------------
    def freeze_parameters(self, net: nn.Module) -> list[nn.Parameter]:
        """Freeze the parameters `freeze` names (only those that were trainable); `unfreeze_parameters` undoes it."""
        if self.freeze is None:
            return []
        if self.freeze == "decoder":
            if not getattr(net.config, "is_encoder_decoder", False):
                raise ValueError(f"freeze: 'decoder' needs an encoder-decoder model; {type(net).__name__} is not.")
            shared = {id(p) for p in net.get_input_embeddings().parameters()}  # tied embeddings stay trainable
            chosen = {id(p) for p in net.get_decoder().parameters()} - shared
        else:
            rule = (lambda name: True) if self.freeze == "model" else self.freeze
            chosen = {id(p) for name, p in net.named_parameters() if rule(name)}
        for param in net.parameters():
            if id(param) in chosen and param.requires_grad:
                param.requires_grad_(False)
                self._frozen.append(param)
        return self._frozen

    def unfreeze_parameters(self) -> None:
        """Make trainable again exactly the parameters `freeze_parameters` froze."""
        for param in self._frozen:
            param.requires_grad_(True)
        self._frozen = []

    def engine_requirements(self) -> list[tuple[str, tuple[str, ...]]]:
        needs = super().engine_requirements()
        if self.finalize == "shrink":
            needs.append(("HardConcreteCallback(finalize='shrink')", ("single", "ddp", "fsdp2")))
        return needs

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args, state, model)
        if self._restore(args, state) and model is not None:
            release_saved_masks(model, self)  # the checkpoint's record of the gates: restored with this state
        if self.gates is not None:
            self.gates.to(device_of(unwrap_model(model)))
            if not self.gates.attached and state.global_step >= self.start_step:  # resumed after the start
                self.gates.attach(unwrap_model(model))

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.gates is not None and not self.gates.attached and state.global_step >= self.start_step:
            self.gates.attach(unwrap_model(model))
            self._log(f"step {state.global_step}: Hard-Concrete gates join training")

    def expected_share_left(self) -> torch.Tensor:
        """The expected share of the original model's per-token multiply-adds left: (never-gated multiply-adds +
        Σ_i c_i (1 − P(g_i = 0))) / original multiply-adds (CoFi's expected model size over the full one)."""
        return (self._fixed_cost + self.gates.expected_cost()) / self._original_cost

    def penalty(self) -> torch.Tensor:
        """The regulariser added to the loss: λ Σ (1 − P(g = 0)), or the Lagrangian budget term (heads, or with
        `target_flops` the expected share of multiply-adds left against 1 − target_flops)."""
        if self.target_flops is not None:
            return self.lagrangian(self.expected_share_left(), 1.0 - self.target_flops)
        expected = self.gates.expected_l0()
        if self.lagrangian is None:
            return self.lam * expected
        total = self.gates.gated_count("heads")
        return self.lagrangian(expected / total, self.target_count / total)

    def on_optimizer_step(self, args, state, control, **kwargs):
        """Step the gates (and multipliers) once per optimizer step: data gradient averaged over ranks, plus the
        penalty's gradient."""
        if not self.gates.attached:  # before start_step
            return
        params = list(self.gates.parameters())
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        world = world_size()
        if world > 1:
            for p in params:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
        penalty = self.penalty()
        penalty.backward()
        self._last_penalty = float(penalty.detach())
        self._gate_optimizer.step()
        self._gate_optimizer.zero_grad(set_to_none=True)
        if self._lagrangian_optimizer is not None:
            self._lagrangian_optimizer.step()
            self._lagrangian_optimizer.zero_grad(set_to_none=True)

    def log_values(self, expected: float, per_kind: dict[str, int]) -> dict[str, float]:
        """What joins the Trainer's logs (`LOG_KEYS`): expected L0, penalty, λ (or λ1, λ2), heads (and neurons)
        open, the expected share of multiply-adds left."""
        values = {"gates/expected_l0": expected, "gates/penalty": self._last_penalty,
                  "gates/heads_open": sum(v for k, v in per_kind.items() if k not in NEURON_KINDS)}
        if "neurons" in self.gates.gated_units:
            values["gates/neurons_open"] = sum(v for k, v in per_kind.items() if k in NEURON_KINDS)
        if self.target_flops is not None:
            with torch.no_grad():
                values["gates/expected_flops_share"] = float(self.expected_share_left())
        if self.lagrangian is None:
            values["gates/lambda"] = float(self.lam)
        else:
            values["gates/lambda_1"] = float(self.lagrangian.lambda_1.detach())
            values["gates/lambda_2"] = float(self.lagrangian.lambda_2.detach())
        return values

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.gates is None or not self.gates.attached:
            return
        with torch.no_grad():
            expected = float(self.gates.expected_l0())
            per_kind = self.gates.open_per_kind()
        values = self.log_values(expected, per_kind)
        if logs is not None:  # the console and the callbacks after this one
            logs.update(values)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(values)  # the Trainer appended this step's record just before on_log
        if not self._is_main:
            return
        self.trace.append({"step": state.global_step, "expected_l0": expected, "open_per_kind": per_kind,
                           "penalty": self._last_penalty})
        self._tb_scalar("prunetrain/expected_l0", expected, state.global_step)
        self._tb_scalar("prunetrain/l0_penalty", self._last_penalty, state.global_step)
        self._tb_scalar("prunetrain/heads_alive_by_step", values["gates/heads_open"], state.global_step)
        if "gates/neurons_open" in values:
            self._tb_scalar("prunetrain/neurons_alive_by_step", values["gates/neurons_open"], state.global_step)
        if "gates/expected_flops_share" in values:
            self._tb_scalar("prunetrain/expected_flops_share", values["gates/expected_flops_share"], state.global_step)
        for kind, count in per_kind.items():
            self._tb_scalar(f"prunetrain/{unit_of(kind)}_alive_by_step/{kind}", count, state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.gates.attached:  # before start_step
            return
        epoch, step = float(state.epoch or 0), int(state.global_step)  # exact: a cut run ends part-way (not rounded)
        with torch.no_grad():
            expected = float(self.gates.expected_l0())
            per_kind = self.gates.open_per_kind()
            per_site = {n: self.gates.open_heads(n) for n in self.gates.site_names}
            prob_open = self.gates.prob_open_matrix("heads")
            prob_open_neurons = self.gates.prob_open_matrix("neurons")
        record = {"epoch": epoch, "step": step, "label": label(step, epoch), "whole_epoch": is_whole_epoch(state),
                  "expected_l0": expected, "open_per_kind": per_kind,
                  "open_per_site": per_site, "penalty": self._last_penalty,
                  "p_open": _rows(prob_open)}
        if "neurons" in self.gates.gated_units:
            record["p_open_neurons"] = _rows(prob_open_neurons)
        if self.target_flops is not None:
            with torch.no_grad():
                record["expected_flops_share"] = float(self.expected_share_left())
        if self.lagrangian is not None:
            record["lambda_1"] = float(self.lagrangian.lambda_1.detach())
            record["lambda_2"] = float(self.lagrangian.lambda_2.detach())
        self.history.append(record)
        self._write_json("gates_history.json", self.history)
        for word in ("heads", "neurons"):
            if any(unit_of(k) == word for k in per_kind):
                alive = sum(v for k, v in per_kind.items() if unit_of(k) == word)
                self._tb_scalar(f"prunetrain/{word}_alive", alive, step)
        for kind, count in per_kind.items():
            self._tb_scalar(f"prunetrain/{unit_of(kind)}_alive/{kind}", count, step)
        if self._is_main and self._tb is not None:
            for unit, matrix, tag in (("heads", prob_open, "gate_p_open"),
                                      ("neurons", prob_open_neurons, "gate_p_open_neurons")):
                names = self.gates.sites_of(unit)
                if names:
                    labels = [f"{self.gates.layout[n].kind}:{self.gates.layout[n].layer}" for n in names]
                    title = f"P(gate open){', FFN neurons' if unit == 'neurons' else ''}, {label(step, epoch)}"
                    self._tb_figure(f"prunetrain/{tag}", heatmap_figure(
                        matrix, labels, title, vmin=0, vmax=1, colorbar_label="1 − P(g=0)",
                        xlabel="neuron" if unit == "neurons" else "head"), step)
        self._log(f"{when(state)}: gates open {sum(per_kind.values())} "
                  f"({', '.join(f'{k} {v}' for k, v in per_kind.items())}), expected L0 {expected:.2f}"
                  + (f", expected multiply-adds left {record['expected_flops_share']:.3f}"
                     if self.target_flops is not None else ""))
        self._flush()

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._write_json("gates_trace.json", self.trace)
        self.unfreeze_parameters()
        if self.gates is not None and self.gates.attached:
            self.final_mask = (self.gates.to_flop_mask(unwrap_model(model), self.target_flops)
                               if self.target_flops is not None else self.gates.to_mask(keep=self.budget))
            if self.constraints is not None:
                ranks = {s.name: torch.zeros(s.num_heads) for s in self.gates.layout}  # ungated sites: kept whole
                ranks.update({n: self.gates.head_log_alpha(n).detach().cpu() for n in self.gates.site_names})
                self.final_mask = apply_constraints(self.final_mask, ranks, self.constraints)
            self._write_json("final_mask.json", self.final_mask.to_dict())  # kept even if the shrink below fails
            self._apply_final_mask(unwrap_model(model))
            neurons = (f", {self.final_mask.num_kept_neurons}/{self.final_mask.num_neurons} neurons"
                       if "neurons" in self.final_mask.layout.units else "")
            kept = ", ".join(f"{k} {v}" for k, v in self.final_mask.kept_per_kind().items())
            self._log(f"final gates: {self.final_mask.num_kept}/{self.final_mask.num_heads} heads{neurons} kept "
                      f"({kept}) [{self.finalize}]")
        super().on_train_end(args, state, control, **kwargs)

    def _apply_final_mask(self, net: nn.Module) -> None:
        """Turn the gates into `final_mask` on `net` ("mask": attached; "shrink": heads removed), transactionally: the
        gates stay attached until the shrink has succeeded, so a shrink that fails leaves the trained gates on the
        model and in this callback (`gates`, `final_mask`), nothing lost. Under DDP every rank holds the same gates
        (averaged gradients), so the same heads go, and DDP's buckets are rebuilt. A compiled model recompiles at
        its next call: the shapes its guards check have changed."""
        if self.finalize == "shrink":
            ddp = find_ddp(net)
            shrink(net, self.final_mask)  # the gates' hooks stay until here: shrink only reads and slices weights
            self.gates.detach()
            mark_pruned(net)  # the save record again, now without the gates' hooks (a plain pruned model saves alone)
            if ddp is not None:
                rebuild_ddp(ddp)
            return
        self.gates.detach()
        if self.finalize == "mask":
            self.final_mask.attach(net)

    # resume ---------------------------------------------------------------------------------------------------------
    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        groups = {"gates": self._gate_optimizer}
        if self._lagrangian_optimizer is not None:
            groups["lagrangian"] = self._lagrangian_optimizer
        return groups

    def state_dict(self) -> dict:
        steps = {}
        for prefix, optimizer in self._optimizers().items():
            steps.update(optimizer_state(prefix, optimizer)[0])
        return {"history": self.history, "trace": self.trace, "optimizer_steps": steps}

    def tensor_state(self) -> dict[str, torch.Tensor]:
        tensors = {f"gates.{k}": v for k, v in self.gates.state_dict().items()}
        if self.lagrangian is not None:
            tensors.update({f"lagrangian.{k}": v for k, v in self.lagrangian.state_dict().items()})
        for prefix, optimizer in self._optimizers().items():
            tensors.update({f"opt.{k}": v for k, v in optimizer_state(prefix, optimizer)[1].items()})
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
        optimizer_tensors = {k[len("opt."):]: v for k, v in tensors.items() if k.startswith("opt.")}
        for prefix, optimizer in self._optimizers().items():
            load_optimizer_state(prefix, optimizer, self._pending_steps, optimizer_tensors)


def _rows(matrix: torch.Tensor) -> list[list[float | None]]:
    """A matrix as JSON rows (NaN as null)."""
    return [[None if math.isnan(v) else v for v in row] for row in matrix.tolist()]


__all__ = ["HardConcreteCallback"]
