"""The callbacks' option records (`prunetrain.training.options`) and `BenchConfig`'s: each checked once when built,
with a message naming the argument, the value and what is allowed; shared by the callbacks; the flat keyword form of
prunetrain 0.1 still accepted with one DeprecationWarning and building the same callback; a field that means nothing
to a callback refused; the project's own callers on the new form."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import prunetrain as pt
from prunetrain.bench import BenchCalls, BenchConfig, BenchReport, BenchTiming, BenchWorkload
from prunetrain.methods.constraints import ServingConstraints
from prunetrain.training.options import CurveSweep, GateTraining, Heads, Importance, Output, Schedule

ROOT = Path(__file__).resolve().parents[1]
RECORDS = (Schedule, Heads, Importance, Output, CurveSweep, GateTraining)
NEW_KEYWORDS = {  # what each callback's constructor takes besides its positional first argument
    "HeadPruningCallback": {"heads", "importance", "output", "mode"},
    "PruningCurveCallback": {"metric", "metric_key", "sweep", "heads", "importance", "output"},
    "HardConcreteCallback": {"target_heads", "heads", "freeze", "start_step", "finalize", "training", "output"},
    "pruning_curve": {"fractions", "ranking", "heads", "key", "metric_name"},
}


def _metric(model):
    return 0.0


def _deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("build, message", [
    (lambda: Schedule(at_epochs=[0]), r"^at_epochs: 0 is not valid"),
    (lambda: Schedule(at_steps=[20, 10]), r"^at_steps: \[20, 10\] is out of order"),
    (lambda: Schedule(prune={5: 1.5}), r"^prune\[5\]: 1.5 is not a fraction in \[0, 1\]"),
    (lambda: Schedule(prune="half"), r"^prune: 'half' is not a schedule"),
    (lambda: Schedule(prune_steps={4: 0.5, 8: 0.25}), r"^prune_steps\[8\]: 0.25 is less than the 0.5 pruned before"),
    (lambda: Schedule(prune={1: 0.5}, prune_steps={9: 1}), r"^prune/prune_steps: mixes fractions"),
    (lambda: Schedule(prune_steps={4: 0.25}, shrink_steps=[6]), r"^shrink_steps: 6 is not a step of prune_steps \[4\]"),
    (lambda: Heads(scope="row"), r"^scope: 'row' is not one of 'global', 'layer', 'kind'"),
    (lambda: Heads(kinds=["decoder"]), r"^kinds: 'decoder' is not an attention kind"),
    (lambda: Heads(min_heads_per_layer=-1), r"^min_heads_per_layer: -1 is not allowed; expected an integer >= 0"),
    (lambda: Heads(constraints="uniform"), r"^constraints: 'uniform' is not a ServingConstraints"),
    (lambda: Importance(num_batches=0), r"^num_batches: 0 is not allowed; expected an integer >= 1"),
    (lambda: Importance(step=0), r"^step: 0 would never prune"),
    (lambda: Importance(step=1.5), r"^step: 1.5 is not a fraction in \[0, 1\]"),
    (lambda: Importance(scorer="loudest"), r"^scorer: 'loudest'"),
    (lambda: Output(output_dir=3), r"^output_dir: 3 is not a path"),
    (lambda: CurveSweep(fractions=[0, 1.2]), r"^fractions: 1.2 is not a fraction in \[0, 1\]"),
    (lambda: CurveSweep(order="sorted"), r"^order: 'sorted' is not one of 'importance', 'random', 'both'"),
    (lambda: GateTraining(gate_lr=0), r"^gate_lr: 0 is not allowed; expected a finite number > 0"),
    (lambda: GateTraining(lagrangian_lr=float("nan")), r"^lagrangian_lr: nan is not allowed"),
])
def test_each_record_refuses_a_bad_value_when_built(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_records_are_frozen_and_read_once():
    steps = iter([3, 7])  # a one-shot iterable is read once, checked and kept
    schedule = Schedule(at_steps=steps)
    assert schedule.at_steps == (3, 7)
    for record in (schedule, Heads(), Importance(), Output(), CurveSweep(), GateTraining()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, dataclasses.fields(record)[0].name, None)
    assert Heads(kinds="cross").kinds == ("cross",) and CurveSweep(fractions=[0.5, 0]).fractions == (0.0, 0.5)


def test_every_record_is_in_the_top_level_namespace():
    assert all(getattr(pt, cls.__name__) is cls for cls in RECORDS)


def _same_callback(a, b, attributes):
    for name in attributes:
        assert getattr(a, name) == getattr(b, name), name
    assert (a.plan.epochs, a.plan.steps, a.record_end) == (b.plan.epochs, b.plan.steps, b.record_end)


def test_the_old_head_pruning_keywords_build_the_same_callback_with_one_warning():
    batches = [{"input_ids": torch.ones(1, 2, dtype=torch.long)}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = pt.HeadPruningCallback(
            Schedule(at_epochs=[1, 2.5], at_steps=[3], prune={2.5: 0.25}, prune_steps={9: 0.5}, shrink_steps=[9],
                     record_end=False),
            heads=Heads(scope="layer", kinds=["cross"], min_heads_per_layer=2),
            importance=Importance(scorer="ablation", batches=batches, num_batches=3, iterative=True, step=2),
            output=Output(output_dir="out", tensorboard=False))
        assert not _deprecations(caught)
        old = pt.HeadPruningCallback([1, 2.5], at_steps=[3], prune={2.5: 0.25}, prune_steps={9: 0.5},
                                     shrink_steps=[9], record_end=False, scope="layer", kinds=["cross"],
                                     min_heads_per_layer=2, scorer="ablation", batches=batches, num_batches=3,
                                     iterative=True, step=2, output_dir="out", tensorboard=False)
    assert _deprecations(caught) == [
        "HeadPruningCallback: the keyword arguments at_epochs, at_steps, prune, prune_steps, shrink_steps, record_end, "
        "scope, kinds, min_heads_per_layer, scorer, batches, num_batches, iterative, step, output_dir, tensorboard are "
        "deprecated and stop working in prunetrain 0.2; pass schedule=Schedule(...), heads=Heads(...), "
        "importance=Importance(...), output=Output(...) instead."]
    _same_callback(new, old, ["schedule", "heads", "importance", "output", "mode", "scope", "kinds", "step",
                              "iterative", "min_heads_per_layer", "batches", "num_batches", "scorer",
                              "scorer_options", "output_dir", "tensorboard", "_prune_epochs", "_prune_steps",
                              "_shrink_steps", "_last_epoch"])


def test_the_old_curve_keywords_build_the_same_callback_with_one_warning():
    batches = [{"input_ids": torch.ones(1, 2, dtype=torch.long)}]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = pt.PruningCurveCallback(
            Schedule(at_epochs=2, at_steps=[5]), metric=_metric, metric_key="bleu",
            sweep=CurveSweep(fractions=[0, 0.5], relative=False, order="both", random_seeds=[1, 2]),
            heads=Heads(scope="kind", kinds="encoder_self"),
            importance=Importance(batches=batches, num_batches=2, iterative=True), output=Output(tensorboard=False))
        assert not _deprecations(caught)
        old = pt.PruningCurveCallback(2, at_steps=[5], metric=_metric, metric_key="bleu", fractions=[0, 0.5],
                                      relative=False, order="both", random_seeds=[1, 2], scope="kind",
                                      kinds="encoder_self", importance_batches=batches, num_batches=2,
                                      iterative=True, tensorboard=False)
    assert len(_deprecations(caught)) == 1 and "importance_batches" in _deprecations(caught)[0]
    _same_callback(new, old, ["schedule", "sweep", "heads", "importance", "output", "fractions", "relative", "order",
                              "random_seeds", "scope", "kinds", "min_heads_per_layer", "importance_batches",
                              "num_batches", "iterative", "metric_key", "_last_epoch"])
    assert new.min_heads_per_layer == 0 and pt.HeadPruningCallback().min_heads_per_layer == 1  # each one's default


def test_the_old_gate_keywords_build_the_same_callback_with_one_warning():
    uniform = ServingConstraints(same_heads_per_kind=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = pt.HardConcreteCallback(0.1, heads=Heads(kinds=["encoder_self"], constraints=uniform), freeze="decoder",
                                      training=GateTraining(gate_lr=0.2, lagrangian_lr=0.01, init_log_alpha=1.0,
                                                            seed=3), output=Output(output_dir="g"))
        assert not _deprecations(caught)
        old = pt.HardConcreteCallback(0.1, kinds=["encoder_self"], constraints=uniform, freeze="decoder", gate_lr=0.2,
                                      lagrangian_lr=0.01, init_log_alpha=1.0, seed=3, output_dir="g")
    assert len(_deprecations(caught)) == 1
    for name in ("heads", "training", "output", "kinds", "constraints", "gate_lr", "lagrangian_lr", "init_log_alpha",
                 "seed", "output_dir", "freeze", "lam"):
        assert getattr(new, name) == getattr(old, name), name


def test_a_record_and_its_old_keywords_together_are_refused():
    with pytest.raises(ValueError, match=r"^schedule: give either schedule=Schedule\(\.\.\.\) or the deprecated "
                                         r"keyword arguments prune, not both"):
        pt.HeadPruningCallback(Schedule(), prune={1: 0.5})
    with pytest.raises(ValueError, match=r"^training: give either training=GateTraining\(\.\.\.\) or the "
                                         r"deprecated keyword arguments seed"):
        pt.HardConcreteCallback(0.1, training=GateTraining(), seed=1)
    with pytest.raises(TypeError, match=r"got multiple values for argument 'at_epochs'"):
        pt.PruningCurveCallback([1], at_epochs=[2], metric=_metric)


def test_a_record_of_the_wrong_type_and_an_unknown_keyword_are_refused():
    with pytest.raises(TypeError, match=r"^heads: \{'kinds': \['cross'\]\} is not allowed; pass heads=Heads\(\.\.\.\)"):
        pt.HeadPruningCallback(heads={"kinds": ["cross"]})
    with pytest.raises(TypeError, match=r"^output: Heads\(.*\) is not allowed; pass output=Output\(\.\.\.\)"):
        pt.HardConcreteCallback(0.1, output=Heads())
    with pytest.raises(TypeError, match=r"HeadPruningCallback\(\) got an unexpected keyword argument 'epochs'"):
        pt.HeadPruningCallback(epochs=[1])


def test_a_field_that_means_nothing_to_a_callback_is_refused():
    with pytest.raises(ValueError, match=r"^schedule: a PruningCurveCallback masks heads only for its curves"):
        pt.PruningCurveCallback(Schedule(prune={1: 0.5}), metric=_metric)
    with pytest.raises(ValueError, match=r"^constraints: .* is not taken by PruningCurveCallback"):
        pt.PruningCurveCallback(metric=_metric, heads=Heads(constraints=ServingConstraints()))
    with pytest.raises(ValueError, match=r"^step: 0.2 is not taken by PruningCurveCallback"):
        pt.PruningCurveCallback(metric=_metric, importance=Importance(step=0.2))
    with pytest.raises(ValueError, match=r"^iterative: has no meaning with order='random'"):
        pt.PruningCurveCallback(metric=_metric, sweep=CurveSweep(order="random"), importance=Importance(iterative=True))
    with pytest.raises(ValueError, match=r"^heads: HardConcreteCallback gates every head of `kinds`, so it takes no "
                                         r"scope \('layer'\) or min_heads_per_layer \(None\)"):
        pt.HardConcreteCallback(0.1, heads=Heads(scope="layer"))
    with pytest.raises(ValueError, match=r"^shrink_steps: \[4\] needs mode='mask'"):
        pt.HeadPruningCallback(Schedule(prune_steps={4: 0.5}, shrink_steps=[4]), mode="shrink")


def _calls(source: str, filename: str) -> list[tuple[str, int, set[str]]]:
    """(callee, line, keyword names) of every call of a callback or of `pruning_curve` in `source`."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in NEW_KEYWORDS:
                out.append((name, node.lineno, {k.arg for k in node.keywords if k.arg is not None}))
    return out


def test_the_projects_own_callers_use_the_new_form():
    """The library, the recipes, the CLI, the benchmarks and the README's examples pass no deprecated keyword."""
    sources = [(p, p.read_text(encoding="utf-8")) for folder in ("prunetrain", "benchmarks")
               for p in sorted((ROOT / folder).rglob("*.py"))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sources += [(ROOT / "README.md", b) for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S)]
    found = []
    for path, source in sources:
        for name, line, keywords in _calls(source, str(path)):
            old = sorted(keywords - NEW_KEYWORDS[name])
            if old:
                found.append(f"{path.relative_to(ROOT)}:{line} {name}({', '.join(old)}=...)")
    assert not found, "deprecated keyword form in the project's own code:\n" + "\n".join(found)
    assert _calls("HeadPruningCallback(at_epochs=[1])", "x") == [("HeadPruningCallback", 1, {"at_epochs"})]


def test_bench_config_groups_its_options_and_keeps_the_keywords():
    by_name = BenchConfig(batch_sizes=2, seq_lens=(5,), warmup=0, repeats=2, generate="greedy", flops=False)
    by_record = BenchConfig(workload=BenchWorkload(batch_sizes=2, seq_lens=(5,)),
                            calls=BenchCalls(generate="greedy"), timing=BenchTiming(warmup=0, repeats=2),
                            report=BenchReport(flops=False))
    assert by_name == by_record and by_name.repeats == 2 and by_name.batch_sizes == (2,)
    assert by_name.tasks == ["forward", "greedy"]
    assert list(by_name.to_dict()) == ["batch_sizes", "seq_lens", "tgt_len", "inputs", "dtype", "forward", "generate",
                                       "new_tokens", "warmup", "repeats", "order", "device", "threads", "label_a",
                                       "label_b", "flops", "memory", "seed"]
    json.dumps({k: v for k, v in by_name.to_dict().items() if k != "inputs"})  # the flat record journals hold
    replaced = BenchConfig.with_options(by_name, {"label_b": "half", "repeats": 3})
    assert (replaced.label_b, replaced.repeats, by_name.repeats) == ("half", 3, 2)
    with pytest.raises(ValueError, match=r"^timing: give either timing=BenchTiming\(\.\.\.\) or the options repeats"):
        BenchConfig(timing=BenchTiming(), repeats=3)
    with pytest.raises(ValueError, match=r"^calls: \{\} is not a BenchCalls"):
        BenchConfig(calls={})
    with pytest.raises(ValueError, match=r"^bogus: not an option of benchmark; the options are batch_sizes, "):
        BenchConfig(bogus=1)
    with pytest.raises(ValueError, match=r"^forward: False with generate=None leaves nothing to measure"):
        BenchCalls(forward=False)
    with pytest.raises(AttributeError, match="has no attribute 'warmups'"):
        by_name.warmups
