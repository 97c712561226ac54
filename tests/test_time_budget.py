"""A run defined by its training time (prunetrain.training.training_clock, MetricPointsCallback(train_time=...),
TrainTimeCooldownCallback, train.max_train_minutes), in real Trainer runs of a small Marian model on Multi30k.

Nothing here asserts how fast anything runs: the tests put known sleeps into the parts the clock must count (the
data collator, the importance pass of a pruning step) and into the parts it must leave out (metric points,
importance points that prune nothing, checkpoint writes), and check the clock's accounting against them."""

from __future__ import annotations

import json

import pytest
from fake_time import FakeTime, install
from test_training_flops import _marian, tiny_mt  # noqa: F401 (tiny_mt: the fixture)
from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

import prunetrain as pt
from prunetrain.mt.text.data import build_dataset, make_collator
from prunetrain.mt.config.recipe import load_recipe
from prunetrain.training.callbacks import HeadPruningCallback, restore_layout
from prunetrain.training.cooldown import FlopCooldownCallback, TrainTimeCooldownCallback, budget_cooldown, \
    cooldown_factor
from prunetrain.training.metric_points import MetricPointsCallback
from prunetrain.training.options import Importance, Schedule
from prunetrain.training.training_clock import TrainTime, measuring

COLLATE_SLEEP = 0.0625  # seconds per batch: data loading the clock must count
PRUNE_SLEEP = 0.375  # the importance pass of a pruning step: the method's work, counted
MEASURE_SLEEP = 0.25  # a metric point or an importance point that prunes nothing: left out
# (binary fractions: sums of them are exact in floating point, so the accounting is compared with ==)


FAKE = FakeTime()


@pytest.fixture(autouse=True)
def fake_time(monkeypatch):
    """The training clock and the metric-points callback read `FAKE` instead of the machine's clock."""
    return install(FAKE, monkeypatch.setattr)


class _SlowCollator:
    """The recipe's collator, `seconds` slower per batch."""

    def __init__(self, tokenizer, model, seconds: float):
        self.collate, self.seconds = make_collator(tokenizer, model), seconds

    def __call__(self, features):
        FAKE.sleep(self.seconds)
        return self.collate(features)


def _trainer(output_dir, tiny_mt, model, callbacks, *, collate_sleep=COLLATE_SLEEP, **settings):
    pairs, tokenizer = tiny_mt
    args = Seq2SeqTrainingArguments(**{
        "output_dir": str(output_dir), "num_train_epochs": 2, "per_device_train_batch_size": 16,
        "learning_rate": 2e-3, "save_strategy": "no", "report_to": [], "use_cpu": True, "logging_steps": 1,
        "seed": 0, "disable_tqdm": True, "warmup_steps": 3, "lr_scheduler_type": "inverse_sqrt", **settings})
    return Seq2SeqTrainer(model=model, args=args, train_dataset=build_dataset(pairs, tokenizer, max_length=24),
                          data_collator=_SlowCollator(tokenizer, model, collate_sleep), processing_class=tokenizer,
                          callbacks=callbacks)


def _sleeping_metric(seconds: float):
    def metric(model):
        FAKE.sleep(seconds)
        return 1.0
    return metric


def _sleeping_scorer(model, batches, **options):
    FAKE.sleep(PRUNE_SLEEP)
    return pt.random_scores(model, seed=0)


class _Watch(TrainerCallback):
    """Registered right after the clock: the clock's value after every step and the learning rates."""

    def __init__(self, clock):
        self.clock, self.rows = clock, []

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        scheduled = lr_scheduler.base_lrs[0] * lr_scheduler.lr_lambdas[0](lr_scheduler.last_epoch)
        inner = self.clock.clock
        self.rows.append({"step": state.global_step, "seconds": self.clock.train_seconds,
                          "step_seconds": self.clock.step_seconds, "scheduled": scheduled,
                          "measured": inner.measured_seconds, "io": inner.trainer_io_seconds,
                          "settled_at": inner.settled_at})


class _Rates(TrainerCallback):
    """Registered after the cooldown: the rate each step's end leaves for the next step."""

    def __init__(self, watch):
        self.watch = watch

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.watch.rows[-1]["applied"] = optimizer.param_groups[0]["lr"]


class _SlowSave(TrainerCallback):
    """A checkpoint write `seconds` slower (its on_save runs inside the Trainer's save)."""

    def __init__(self, seconds: float):
        self.seconds, self.saves = seconds, 0

    def on_save(self, args, state, control, **kwargs):
        FAKE.sleep(self.seconds)
        self.saves += 1


class _BudgetAfterFirstStep(TrainerCallback):
    """The budget set once the first step is counted (however long that step took): its clock plus `more`."""

    def __init__(self, clock, more: float):
        self.clock, self.more, self.budget = clock, more, None

    def on_step_end(self, args, state, control, **kwargs):
        if self.budget is None:
            self.budget = self.clock.train_seconds + self.more
            self.clock.train_time = TrainTime(max_seconds=self.budget)


def test_the_time_budget_stops_training_and_the_cooldown_reaches_zero_there(tmp_path, tiny_mt):
    """Every step after the first costs the collator's sleep (the first batch, fetched before the first step, is not
    counted), so a budget of the first step plus 12 sleeps ends the 32-step run at step 13, the first step whose clock
    reaches it; the rate of every step is the schedule times c(x) of the clock's seconds, and c is 0 there."""
    share = 0.5
    clock = MetricPointsCallback(lambda m: 0.0, record_end=False, train_time=TrainTime(max_seconds=1e9))
    watch, later = _Watch(clock), _BudgetAfterFirstStep(clock, 12 * COLLATE_SLEEP)
    cooldown = budget_cooldown(clock, share)
    assert isinstance(cooldown, TrainTimeCooldownCallback)
    trainer = _trainer(tmp_path, tiny_mt, _marian(tiny_mt[1]),
                       [clock, later, watch, cooldown, _Rates(watch), clock.clock_end])
    trainer.train()
    seconds, budget = [row["seconds"] for row in watch.rows], later.budget
    step = trainer.state.global_step
    assert clock.budget_reached_at_step == step == 13  # from step 2 on, each step fetched a batch
    assert seconds == [s * COLLATE_SLEEP for s in range(13)] and budget == 12 * COLLATE_SLEEP
    assert clock.state_dict()["budget_reached_at_step"] == step
    factors = [cooldown_factor(x, budget, share) for x in seconds]
    for row, factor in zip(watch.rows, factors):
        assert row["applied"] == row["scheduled"] * factor, row
    assert all(b <= a for a, b in zip(factors, factors[1:]))
    assert factors[-1] == 0.0 and watch.rows[-1]["applied"] == 0.0


def test_measurements_and_checkpoint_writes_are_left_out_while_data_and_pruning_work_count(tmp_path, tiny_mt):
    """Metric points (sleeping 0.3 s), an importance point that prunes nothing and slow checkpoint writes are left
    out of the clock; the collator's sleep before every step after the first and the importance pass of the pruning
    step (sleeping 0.4 s) are counted."""
    steps, metric_steps = 8, [2, 5, 7]
    clock = MetricPointsCallback(_sleeping_metric(MEASURE_SLEEP), at_steps=metric_steps, record_end=False,
                                 train_time=TrainTime(at_seconds=[1e6]))  # a time point: the clock is in use
    watch = _Watch(clock)
    pruning = HeadPruningCallback(Schedule(at_epochs=[], at_steps=[3], prune_steps={6: 0.25}, record_end=False),
                                  importance=Importance(scorer=_sleeping_scorer))
    slow_save = _SlowSave(MEASURE_SLEEP)
    trainer = _trainer(tmp_path, tiny_mt, _marian(tiny_mt[1]), [clock, watch, pruning, slow_save, clock.clock_end],
                       max_steps=steps, save_strategy="steps", save_steps=3)
    trainer.train()
    assert [r["step"] for r in clock.records] == metric_steps and [e["step"] for e in pruning.events] == [6]
    assert slow_save.saves == 3  # steps 3, 6 and the last one
    inner = clock.clock
    # the importance-only point at step 3 fetches the importance batches (the slow collator: measurement too) and
    # scores them; the pruning step at 6 reuses those batches, so only its scoring counts (at step 7)
    fetch = pruning.num_batches * COLLATE_SLEEP
    assert inner.measured_seconds == len(metric_steps) * MEASURE_SLEEP + PRUNE_SLEEP + fetch
    assert inner.trainer_io_seconds == slow_save.saves * MEASURE_SLEEP
    assert clock.train_seconds == (steps - 1) * COLLATE_SLEEP + PRUNE_SLEEP
    # step by step: work done after step s's end is accounted at step s + 1 (the metric at 2 → 3, the importance
    # point at 3 → 4, the pruning at 6 → 7, the saves at 3 and 6 → 4 and 7)
    rows = {row["step"]: row for row in watch.rows}
    grew = {s: {key: rows[s][key] - rows[s - 1][key] for key in ("seconds", "measured", "io", "settled_at")}
            for s in range(2, steps + 1)}
    for s, delta in grew.items():
        assert delta["seconds"] == delta["settled_at"] - delta["measured"] - delta["io"]
        # every step after the first fetched its batch; the pruning step's importance pass counts at step 7
        assert delta["seconds"] == COLLATE_SLEEP + (PRUNE_SLEEP if s == 7 else 0.0), s
        assert delta["measured"] == {3: MEASURE_SLEEP, 4: PRUNE_SLEEP + fetch, 6: MEASURE_SLEEP,
                                     8: MEASURE_SLEEP}.get(s, 0.0), s
        assert delta["io"] == (MEASURE_SLEEP if s in (4, 7) else 0.0), s
    record = clock.records[1]
    assert record["train_seconds"] == rows[5]["seconds"] and record["step_seconds"] == rows[5]["step_seconds"]


def test_without_its_end_callback_or_with_two_budgets_the_clock_refuses(tmp_path, tiny_mt):
    clock = MetricPointsCallback(lambda m: 0.0, train_time=TrainTime(max_seconds=60))
    trainer = _trainer(tmp_path, tiny_mt, _marian(tiny_mt[1]), [clock], max_steps=2)
    with pytest.raises(ValueError, match=r"^train_time: the training clock needs its end callback; register this "
                                         r"MetricPointsCallback's clock_end as the Trainer's last callback"):
        trainer.train()
    with pytest.raises(ValueError, match=r"^train_time: a budget of 60 training seconds and max_flops=1e\+09 were "
                                         r"both given; a run has one budget, FLOPs or training time\.$"):
        MetricPointsCallback(lambda m: 0.0, max_flops=1e9, train_time=TrainTime(max_seconds=60))
    for bad, message in (({"max_seconds": 0}, r"^train_time.max_seconds: 0 is not allowed"),
                         ({"max_seconds": float("inf")}, r"^train_time.max_seconds: inf is not allowed"),
                         ({"at_seconds": [5, 5]}, r"^train_time.at_seconds: \[5, 5\] is out of order"),
                         ({"at_seconds": [-1]}, r"^train_time.at_seconds: -1 is not allowed")):
        with pytest.raises(ValueError, match=message):
            TrainTime(**bad)
    with pytest.raises(ValueError, match=r"^train_time: 60 is not a TrainTime"):
        MetricPointsCallback(lambda m: 0.0, train_time=60)
    with pytest.raises(ValueError, match=r"^clock: the learning-rate cooldown follows a training-time budget; give "
                                         r"the MetricPointsCallback a max_train_seconds\.$"):
        TrainTimeCooldownCallback(MetricPointsCallback(lambda m: 0.0, max_flops=1e9), 0.2)
    with pytest.raises(ValueError, match=r"^share: 1.5 is not allowed; expected the part of the training-time "
                                         r"budget the cooldown spans"):
        TrainTimeCooldownCallback(MetricPointsCallback(lambda m: 0.0, train_time=TrainTime(max_seconds=9)), 1.5)
    assert type(budget_cooldown(MetricPointsCallback(lambda m: 0.0, max_flops=1e9), 0.2)) is FlopCooldownCallback


def test_measuring_brackets_nest_and_count_once():
    from prunetrain.training.training_clock import measured_seconds

    before = measured_seconds()
    with measuring():
        with measuring():
            FAKE.sleep(COLLATE_SLEEP)
        with measuring(False):  # inside the outer bracket: still tallied, once
            FAKE.sleep(COLLATE_SLEEP)
    inside = measured_seconds() - before
    assert inside == 2 * COLLATE_SLEEP
    with measuring(False):
        FAKE.sleep(COLLATE_SLEEP)
    assert measured_seconds() - before == inside  # outside any bracket nothing is tallied


def test_a_resumed_run_continues_the_clock_where_its_checkpoint_left_it(tmp_path, tiny_mt):
    """Saved at step 4 and resumed: the clock starts from the checkpoint's value (the time up to the save, the
    pruning of step 4 included) and counts on; a time point already passed is not evaluated again."""
    def run(output_dir, resume=None):
        clock = MetricPointsCallback(lambda m: 1.0, record_end=False, train_time=TrainTime(at_seconds=[0.1, 1e6]))
        watch = _Watch(clock)
        model = _marian(tiny_mt[1])
        if resume:
            restore_layout(model, resume)
        pruning = HeadPruningCallback(Schedule(at_steps=[], prune_steps={4: 0.25}, record_end=False),
                                      importance=Importance(scorer=_sleeping_scorer), mode="shrink")
        trainer = _trainer(output_dir, tiny_mt, model, [clock, watch, pruning, clock.clock_end], max_steps=8,
                           save_strategy="steps", save_steps=4)
        trainer.train(resume_from_checkpoint=resume)
        return clock, watch, pruning

    whole, whole_watch, whole_pruning = run(tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "checkpoint-4" / "prunetrain-metric-points.json").read_text())
    at_save = saved["train_clock"]["seconds"]
    step4 = whole_watch.rows[3]["seconds"]
    # the pruning work after step 4's clock reading, before the write: fetching the importance batches and scoring
    assert at_save == step4 + whole_pruning.num_batches * COLLATE_SLEEP + PRUNE_SLEEP
    assert whole_watch.rows[4]["seconds"] == at_save + COLLATE_SLEEP  # the uninterrupted run counted it at step 5
    assert [r["train_seconds_target"] for r in whole.records] == [0.1]
    resumed, watch, _ = run(tmp_path / "run", resume=str(tmp_path / "run" / "checkpoint-4"))
    assert [row["step"] for row in watch.rows] == [5, 6, 7, 8]
    # counts on from the save; the batch fetched before the resumed session's first step is not counted
    assert watch.rows[0]["seconds"] == at_save
    assert resumed.records == whole.records  # restored, and the point at 0.1 s not evaluated again
    assert resumed.train_seconds == at_save + 3 * COLLATE_SLEEP == whole.train_seconds - COLLATE_SLEEP


def test_the_recipe_takes_a_training_time_budget(tmp_path):
    """`train.max_train_minutes` is the budget (with `train.max_flops: 0`); `train.cooldown` is then a share of it and
    `eval.test_times` are shares of it; the shipped recipe keeps its FLOP budget and meaning; bad values are refused
    with one line naming the field."""
    shipped = load_recipe("wmt-small-deen")
    assert shipped.train.max_train_minutes == 0 and shipped.train.max_flops > 0 and shipped.eval.test_times == []
    timed = load_recipe("wmt-small-deen", ["train.max_flops=0", "train.max_train_minutes=30", "eval.test_flops=[]",
                                           "eval.test_times=[0.25, 0.5]", "train.max_minutes=0"])
    assert timed.train.max_train_minutes == 30.0 and timed.train.cooldown == shipped.train.cooldown > 0
    assert timed.eval.test_times == [0.25, 0.5]
    refused = {
        ("train.max_train_minutes=30",): r"^train.max_train_minutes: 30.0 is a training-time budget, but "
                                         r"train.max_flops=1.78e\+14 is set too; a run has one budget",
        ("train.max_flops=0", "eval.test_flops=[]", "train.max_train_minutes=-1"): r"^train.max_train_minutes: ",
        ("train.max_flops=0", "eval.test_flops=[]", "train.max_train_minutes=.nan"): r"^train.max_train_minutes: ",
        ("train.max_flops=0", "train.max_train_minutes=30"): r"^eval.test_flops: .* are shares of train.max_flops, "
                                                             r"which is 0; .*eval.test_times",
        ("eval.test_times=[0.5]",): r"^eval.test_times: \[0.5\] are shares of train.max_train_minutes, which is 0",
        ("train.max_flops=0", "eval.test_flops=[]", "train.max_train_minutes=30", "eval.test_times=[0.5, 0.2]"):
            r"^eval.test_times: \[0.5, 0.2\] is out of order",
        ("train.max_flops=0", "eval.test_flops=[]", "train.max_train_minutes=30", "eval.test_times=[1.0]"):
            r"^eval.test_times: ",
        ("train.max_flops=0", "eval.test_flops=[]", "train.max_train_minutes=30", "train.max_minutes=20"):
            r"^train.max_minutes: 20.0 is not more than train.max_train_minutes=30.0",
        ("train.max_flops=0", "eval.test_flops=[]"): r"^train.cooldown: 0.2 is a share of train.max_flops, which is "
                                                     r"0; set a FLOP budget",
    }
    for overrides, message in refused.items():
        with pytest.raises(ValueError, match=message):
            load_recipe("wmt-small-deen", list(overrides))


@pytest.mark.distributed
@pytest.mark.slow
def test_under_ddp_every_rank_sees_the_same_clock_and_stops_at_the_same_step(tmp_path, multi30k_dir):
    """torchrun, 2 ranks (gloo): rank 1 loads its data slower and rank 0 alone measures at every third step, yet the
    clock is the same on both ranks after every step (the minimum over ranks of each step's time), so both train with
    the same learning rates and the budget stops both at the same step, the rate cooled to 0 there."""
    from test_distributed import DIST, _result, _run, _torchrun

    _run(_torchrun(DIST / "time_budget.py", "--out", str(tmp_path), "--data", str(multi30k_dir)), tmp_path)
    ranks = [_result(tmp_path, rank) for rank in (0, 1)]
    assert ranks[0]["rows"] == ranks[1]["rows"] and ranks[0]["budget"] == ranks[1]["budget"]
    rows, budget = ranks[0]["rows"], ranks[0]["budget"]
    sleep = 0.0625  # the script's collator sleep on rank 0 (rank 1: twice that); every rank's clock is fake
    # each step after the first counts the smaller of the ranks' data times (rank 0's); rank 0's measurements count
    # nowhere. Each rank's epoch is 8 steps, and the dataloader reads one batch ahead: the epoch's last step fetched
    # nothing, the next epoch's first step fetched two batches
    fetched = [0, *([1] * 6), 0, 2, 1, 1, 1, 1]  # batches fetched during each of steps 1..13
    assert [row["seconds"] for row in rows] == [sum(fetched[:s + 1]) * sleep for s in range(13)]
    assert budget == 12 * sleep
    assert ranks[0]["stopped_at"] == ranks[1]["stopped_at"] == ranks[0]["global_step"] == rows[-1]["step"] == 13
    assert rows[-1]["lr"] == 0.0 and all(row["lr"] > 0.0 for row in rows[:-1])
    assert ranks[0]["measured"] == len([3, 6, 9, 12]) * 2 * sleep and ranks[1]["measured"] == 0.0


def test_the_recipe_runs_for_a_training_time_budget(tmp_path, multi30k_dir, monkeypatch, capsys):
    """`prunetrain recipe --smoke` defined by `train.max_train_minutes` (FLOP budget off), in this process with the
    fake time source and a collator that sleeps 1/16 s per batch: training stops at the first step whose clock reaches
    the budget (not at the epochs' end), test BLEU is taken at `eval.test_times` shares of it, and results.json
    records the clock and the budget, exactly."""
    import prunetrain.mt.text.data as data
    from hostile import run_main

    make_collator = data.make_collator

    def slow_collator(*args, **kwargs):
        collate = make_collator(*args, **kwargs)

        def collate_slowly(features):
            FAKE.sleep(COLLATE_SLEEP)
            return collate(features)
        return collate_slowly

    monkeypatch.setattr(data, "make_collator", slow_collator)
    out = tmp_path / "run"
    code, _, err = run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir,
                            "--output", out, "--set", "train.max_steps=0", "--set", "train.epochs=100",
                            "--set", "train.max_train_minutes=0.15", "--set", "train.cooldown=0.2",
                            "--set", "eval.test_times=[0.5]", "--set", "eval.test_steps=[]",
                            "--set", "pruning.importance_steps=[5]", "--set", "pruning.curve_steps=[]",
                            "--set", "eval.bench=false")
    assert code == 0, err[-3000:]
    results = json.loads((out / "results.json").read_text())
    # 9 s of training clock: every step after the first fetched one batch (1/16 s), so step 145 reaches it
    assert results["max_train_seconds"] == 9.0 and results["train_seconds"] == 9.0
    assert results["budget_reached_at_step"] == results["steps"] == 145
    assert results["flop_budget_reached_at_step"] is None
    (point,) = [r for r in results["bleu_over_training"] if r.get("train_seconds_target") is not None]
    assert point["train_seconds_target"] == 4.5 and point["train_seconds"] == 4.5 and point["step"] == 73
    assert "min of training time" in (out / "report.md").read_text()
