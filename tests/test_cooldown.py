"""The learning-rate cooldown over the last share of a FLOP budget (prunetrain.training.cooldown), in real Trainer runs
of a small Marian model on Multi30k with a mid-training shrink."""

from __future__ import annotations

import pytest
import torch
from test_training_flops import _marian, _pruning, tiny_mt  # noqa: F401 (tiny_mt: the fixture)
from test_training_flops import _trainer as _flops_trainer
from transformers import TrainerCallback

from prunetrain.training.callbacks import restore_layout
from prunetrain.training.cooldown import FlopCooldownCallback, cooldown_factor
from prunetrain.training.metric_points import MetricPointsCallback


def _trainer(output_dir, tiny_mt, model, callbacks, **settings):
    """test_training_flops' trainer with an inverse-sqrt schedule and the rate logged at every step."""
    return _flops_trainer(output_dir, tiny_mt, model, callbacks, **{
        "warmup_steps": 3, "lr_scheduler_type": "inverse_sqrt", "logging_steps": 1, **settings})


class _Rates(TrainerCallback):
    """After every step t (registered last): F_t, the rate the optimizer will use for step t + 1, the rate the
    scheduler reports, and the scheduler's own rate η_s(t + 1) computed from its base rate."""

    def __init__(self, clock):
        self.clock, self.rows = clock, []

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        scheduled = lr_scheduler.base_lrs[0] * lr_scheduler.lr_lambdas[0](lr_scheduler.last_epoch)
        self.rows.append({"step": state.global_step, "flops": self.clock.flops,
                          "applied": optimizer.param_groups[0]["lr"], "reported": lr_scheduler.get_last_lr()[0],
                          "scheduled": scheduled})


def _budget(tmp_path, tiny_mt) -> list[int]:
    """Cumulative FLOPs after every step of the run the tests use, without a budget."""
    clock = MetricPointsCallback(lambda m: 0.0, record_end=False)
    rates = _Rates(clock)
    _trainer(tmp_path / "free", tiny_mt, _marian(tiny_mt[1]), [clock, _pruning(), rates]).train()
    return [row["flops"] for row in rates.rows]


def test_the_rate_of_every_step_is_the_schedule_times_the_flop_cooldown(tmp_path, tiny_mt):
    """η(t + 1) = η_s(t + 1) · c(F_t) at every step, across a shrink: untouched until a (1 − share) part of the
    budget is spent, then strictly falling to near zero at the last step; the scheduler reports, and the Trainer
    logs, the rate each step trained with. Training before the cooldown starts is bit-identical to the run without it."""
    totals = _budget(tmp_path, tiny_mt)
    budget, share = (totals[13] + totals[14]) / 2, 0.5  # the budget is reached at step 15
    clock = MetricPointsCallback(lambda m: 0.0, record_end=False, max_flops=budget)
    rates = _Rates(clock)
    trainer = _trainer(tmp_path / "cool", tiny_mt, _marian(tiny_mt[1]),
                       [clock, _pruning(), FlopCooldownCallback(clock, share), rates])
    trainer.train()
    assert trainer.state.global_step == 15 and [row["flops"] for row in rates.rows] == totals[:15]
    factors = [cooldown_factor(row["flops"], budget, share) for row in rates.rows]
    for row, factor in zip(rates.rows, factors):
        assert row["applied"] == row["reported"] == row["scheduled"] * factor, row
    cooling = [f for f in factors if f < 1]
    assert 3 <= len(cooling) < 15 and all(b < a for a, b in zip(cooling, cooling[1:]))
    assert factors[-1] == 0.0 and 0 < factors[-2] < 0.2  # the last step's rate sets nothing: the budget is spent
    logged = {entry["step"]: entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry}
    # the Trainer logs at step t the rate step t trained with: the one set after step t − 1
    assert [logged[row["step"] + 1] for row in rates.rows[:-1]] == [row["applied"] for row in rates.rows[:-1]]

    plain_clock = MetricPointsCallback(lambda m: 0.0, record_end=False, max_flops=budget)
    plain = _trainer(tmp_path / "plain", tiny_mt, _marian(tiny_mt[1]), [plain_clock, _pruning()])
    plain.train()
    losses = [{e["step"]: e["loss"] for e in t.state.log_history if "loss" in e} for t in (trainer, plain)]
    first_cooled = next(row["step"] for row, f in zip(rates.rows, factors) if f < 1) + 1  # trains at a lower rate
    assert all(losses[0][s] == losses[1][s] for s in range(1, first_cooled + 1))  # its loss is taken before the step
    assert any(losses[0][s] != losses[1][s] for s in range(first_cooled + 1, 16))


def test_a_run_resumed_inside_the_cooldown_ends_with_the_same_weights(tmp_path, tiny_mt):
    """Saved at step 12 (inside the cooldown, after the shrink) and resumed: the clock restores its FLOPs, the
    optimizer its scaled rates, and the rest of the run is the uninterrupted one, weight for weight."""
    totals = _budget(tmp_path, tiny_mt)
    budget, share = (totals[13] + totals[14]) / 2, 0.5

    def run(output_dir, resume=None):
        clock = MetricPointsCallback(lambda m: 0.0, record_end=False, max_flops=budget)
        model = _marian(tiny_mt[1])
        if resume:
            restore_layout(model, resume)  # the checkpoint is of the shrunk model
        trainer = _trainer(output_dir, tiny_mt, model, [clock, _pruning(), FlopCooldownCallback(clock, share)],
                           save_strategy="steps", save_steps=12)
        trainer.train(resume_from_checkpoint=resume)
        return model, trainer

    whole, _ = run(tmp_path / "whole")
    assert cooldown_factor(totals[11], budget, share) < 1  # step 12 is inside the cooldown
    run(tmp_path / "cut")  # the same run; resume it from its step-12 checkpoint
    resumed, trainer = run(tmp_path / "cut", resume=str(tmp_path / "cut" / "checkpoint-12"))
    assert trainer.state.global_step == 15
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_cooldown_without_a_budget_or_with_a_chained_schedule_is_refused(tmp_path, tiny_mt):
    with pytest.raises(ValueError, match=r"^clock: the learning-rate cooldown follows a FLOP budget"):
        FlopCooldownCallback(MetricPointsCallback(lambda m: 0.0), 0.2)
    clock = MetricPointsCallback(lambda m: 0.0, max_flops=1e9)
    for share in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"^share: "):
            FlopCooldownCallback(clock, share)
    model = _marian(tiny_mt[1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # StepLR multiplies the current rate: it would compound
    trainer = _trainer(tmp_path, tiny_mt, model, [clock, FlopCooldownCallback(clock, 0.2)],
                       optimizers=(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=5)))
    with pytest.raises(ValueError, match=r"^lr_scheduler: StepLR is not allowed with a FLOP cooldown"):
        trainer.train()


def test_the_recipe_cools_the_rate_down_to_the_end_of_its_flop_budget(tmp_path, multi30k_dir):
    """`prunetrain recipe ... --set train.cooldown=0.5` on the smoke budget: the learning rate TensorBoard holds falls
    step by step over the second half of the run to near zero; results and report say the run had a cooldown."""
    import json

    from conftest import run_cli
    from test_payoff_study import SMOKE

    from prunetrain.utils.plots import read_scalars

    out = tmp_path / "run"
    done = run_cli("recipe", "wmt-small-deen", *SMOKE, "--set", "train.cooldown=0.5", "--set", "train.logging_steps=1",
                   "--data-dir", multi30k_dir, "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["recipe"]["train"]["cooldown"] == 0.5 and results["flop_budget_reached_at_step"] == results["steps"]
    rates = [value for _, value in sorted(read_scalars(out / "runs")["train/learning_rate"])]
    assert len(rates) == results["steps"]
    tail = rates[-len(rates) // 4:]
    assert all(b < a for a, b in zip(tail, tail[1:])) and rates[-1] < 0.2 * max(rates)
    assert "the learning rate decays to zero over the last 50 % of the FLOPs" in (out / "report.md").read_text()
