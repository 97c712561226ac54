"""Does pruning during training pay? The study's parts, small: runs defined by a FLOP budget, the baselines as recipe
settings (the same architecture from scratch, random heads at initialisation, per-kind budgets), and `prunetrain
compare` aggregating seeds with a paired bootstrap between final models."""

from __future__ import annotations

import json

import pytest
import torch

import prunetrain as pt
from conftest import run_cli
from prunetrain.methods.significance import paired_bootstrap
from prunetrain.mt.evaluation.bleu_stats import bleu_from_stats
from prunetrain.mt.comparison.compare_arms import group_arms, mean_sd, value_at_flops
from prunetrain.mt.run.init_architecture import apply_initial_architecture
from prunetrain.mt.config.recipe import load_recipe

SMOKE = ["--smoke", "--set", "eval.test_limit=24", "--set", "eval.num_beams=1", "--set", "eval.bench=false",
         "--set", "pruning.curve_steps=[]", "--set", "train.max_steps=0", "--set", "train.max_flops=22000000000.0",
         "--set", "eval.test_flops=[0.3, 0.6]", "--set", "eval.test_steps=[]", "--set", "train.epochs=4"]
FULL = ["--set", "pruning.schedule_steps={}", "--set", "pruning.shrink_steps=[]"]


def test_recipe_settings_of_the_study_are_validated():
    recipe = load_recipe("wmt-small-deen", ["pruning.scope=kind",
                                            "pruning.kept_per_kind={encoder_self: 6, decoder_self: 12, cross: 18}"])
    # the schedule {400: 0.25, 600: 0.5, 800: 0.625, 1000: 0.75} reaches 1/3, 2/3, 5/6 and all of each final amount
    assert recipe.kind_amounts(0.25) == {"encoder_self": 14, "decoder_self": 12, "cross": 10}
    assert recipe.kind_amounts(0.75) == {"encoder_self": 42, "decoder_self": 36, "cross": 30}
    bad = [
        (["pruning.scope=kind", "pruning.kept_per_kind={encoder_self: 6, decoder_self: 12, cross: 17}"],
         r"^pruning.kept_per_kind: .* keeps 35 heads, but the schedule's last fraction 0.75 keeps 36 of 144\.$"),
        (["pruning.kept_per_kind={encoder_self: 6, decoder_self: 12, cross: 18}"],
         r"^pruning.kept_per_kind: ranks each kind within itself, so it needs pruning.scope=kind"),
        (["pruning.scope=kind", "pruning.kept_per_kind={encoder_self: 18, cross: 18}"],
         r"^pruning.kept_per_kind: .* does not name decoder_self"),
        (["pruning.scope=kind", "pruning.kept_per_kind={encoder_self: 2, decoder_self: 16, cross: 18}"],
         r"^pruning.kept_per_kind\[encoder_self\]: 2 is not allowed; a kind of 6 sites keeps between 6 and 48"),
        (["pruning.kept_per_kind={encoder: 6}"], r"^pruning.kept_per_kind: 'encoder' is not one of"),
        (["pruning.init_layout=x", "pruning.init_heads=36"], r"^pruning.init_heads: set either"),
        (["train.max_flops=-1.0"], r"^train.max_flops: -1.0 is not allowed"),
        (["train.max_flops=0", "train.cooldown=0", "eval.test_flops=[0.5]"], r"^eval.test_flops: \[0.5\] are shares of train.max_flops, which is 0"),
        (["train.max_flops=1000.0", "eval.test_flops=[0.5, 1.0]"], r"^eval.test_flops: 1.0 is not allowed"),
        (["train.max_flops=1000.0", "eval.test_flops=[0.5, 0.2]"], r"^eval.test_flops: \[0.5, 0.2\] is out of order"),
        (["train.max_flops=0", "eval.test_flops=[]", "train.cooldown=0.2"],
         r"^train.cooldown: 0.2 is a share of train.max_flops, which is 0; set a FLOP budget"),
        (["train.cooldown=1.5"], r"^train.cooldown: 1.5 is not allowed; expected a finite number in \[0, 1\]\.$"),
        (["train.cooldown=0.2", "train.scheduler=reduce_lr_on_plateau"],
         r"^train.scheduler: 'reduce_lr_on_plateau' is not allowed with train.cooldown"),
    ]
    for overrides, pattern in bad:
        with pytest.raises(ValueError, match=pattern):
            load_recipe("wmt-small-deen", overrides)


def _smoke_recipe(overrides=()):
    lines = [line for line in open(pt.__path__[0] + "/mt/recipes/wmt-small-deen.smoke") if "=" in line
             and not line.startswith("#")]
    return load_recipe("wmt-small-deen", [line.strip() for line in lines] + list(overrides))


def test_initial_architectures_are_fresh_small_models(tmp_path, m30k_tokenizer):
    from prunetrain.mt.run.runner import build_model

    recipe = _smoke_recipe()
    pruned = build_model(recipe, m30k_tokenizer)
    keep = {"model.encoder.layers.0.self_attn": [1, 3], "model.decoder.layers.1.encoder_attn": [0]}
    pt.shrink(pruned, pt.HeadMask.from_heads(pruned, {k: [h for h in range(4) if h not in v] for k, v in keep.items()}))
    pt.save_pruned(pruned, tmp_path / "pruned")
    # from a recorded layout: the seed's fresh full model, cut to those heads (a from-scratch initialisation)
    scratch = _smoke_recipe([f"pruning.init_layout={tmp_path}", "train.seed=5"])  # a run directory with pruned/
    model, fresh = build_model(scratch, m30k_tokenizer), build_model(scratch, m30k_tokenizer)
    info = apply_initial_architecture(scratch, model)
    assert pt.find_heads(model).to_dict() == pt.find_heads(pruned).to_dict()
    assert info["heads"] == 19 and info["from"].endswith("pruned/prunetrain_layout.json")
    q, q_fresh = model.model.encoder.layers[0].self_attn.q_proj, fresh.model.encoder.layers[0].self_attn.q_proj
    head_dim = q_fresh.weight.shape[0] // 4
    assert torch.equal(q.weight, torch.cat([q_fresh.weight[h * head_dim:(h + 1) * head_dim] for h in (1, 3)]))
    assert not torch.equal(q.weight, pruned.model.encoder.layers[0].self_attn.q_proj.weight)  # not the trained one
    # random heads at initialisation: the count, at least min_heads_per_layer per site, seeded
    randomly = _smoke_recipe(["pruning.init_heads=9", "train.seed=3"])
    a, b = build_model(randomly, m30k_tokenizer), build_model(randomly, m30k_tokenizer)
    apply_initial_architecture(randomly, a), apply_initial_architecture(randomly, b)
    assert pt.find_heads(a).total_heads == 9 and pt.find_heads(a).to_dict() == pt.find_heads(b).to_dict()
    assert min(site.num_heads for site in pt.find_heads(a)) >= 1
    assert apply_initial_architecture(_smoke_recipe(), build_model(_smoke_recipe(), m30k_tokenizer)) is None
    for overrides, pattern in ((["pruning.init_layout=" + str(tmp_path / "nowhere")], r"holds no prunetrain_layout"),
                               (["pruning.init_heads=25"], r"^pruning.init_heads: 25 is more than the model's 24")):
        with pytest.raises(ValueError, match=pattern):
            bad = _smoke_recipe(overrides)
            apply_initial_architecture(bad, build_model(bad, m30k_tokenizer))


def test_seeds_are_arms_summarised_as_mean_and_sd():
    runs = [{"recipe": {"train": {"seed": s}}} for s in (0, 1, 0)]
    assert list(group_arms(["a", "a", "b"], runs)) == ["a", "b"]
    with pytest.raises(ValueError, match=r"^names: arm 'a' has two runs with train.seed=0"):
        group_arms(["a", "b", "a"], runs)
    stat = mean_sd([30.0, 32.0, 34.0])
    assert (stat["mean"], stat["sd"], stat["n"]) == (32.0, 2.0, 3)
    assert mean_sd([1.0])["sd"] is None
    records = [{"flops": 10, "bleu": 1.0, "flops_target": None}, {"flops": 30, "bleu": 3.0, "flops_target": 25.0}]
    assert value_at_flops(records, 25.0) == 3.0  # evaluated where the run first reached the point
    assert value_at_flops(records, 20.0) == pytest.approx(2.0) and value_at_flops(records, 40.0) is None


@pytest.mark.slow
def test_a_budget_defined_study_end_to_end(tmp_path, multi30k_dir):
    """Two seeds of the smoke schedule, one of the full model and one of the schedule's final architecture from
    scratch, all at one FLOP budget; `prunetrain compare` summarises the arms and tests seed by seed."""
    data = ["--data-dir", multi30k_dir]
    runs = {"gradual-0": SMOKE, "gradual-1": SMOKE + ["--set", "train.seed=1"], "full-0": SMOKE + FULL}
    for name, args in runs.items():
        done = run_cli("recipe", "wmt-small-deen", *args, *data, "--output", tmp_path / name)
        assert done.returncode == 0, done.stderr[-3000:]
    scratch = SMOKE + FULL + ["--set", f"pruning.init_layout={tmp_path / 'gradual-0'}"]
    done = run_cli("recipe", "wmt-small-deen", *scratch, *data, "--output", tmp_path / "scratch-0")
    assert done.returncode == 0, done.stderr[-3000:]
    results = {name: json.loads((tmp_path / name / "results.json").read_text()) for name in [*runs, "scratch-0"]}
    for name, r in results.items():
        assert r["max_flops"] == 22e9 <= r["train_flops"] and r["flop_budget_reached_at_step"] == r["steps"], name
        targets = [x["flops_target"] for x in r["bleu_over_training"] if x["kind"] == "flops"]
        assert targets == [0.3 * 22e9, 0.6 * 22e9], name
    # the smaller models take more steps for the same compute
    assert results["scratch-0"]["steps"] > results["gradual-0"]["steps"] > results["full-0"]["steps"]
    assert results["scratch-0"]["heads_kept"] == results["gradual-0"]["heads_kept"] == 12
    assert results["scratch-0"]["initial_architecture"]["per_site"] == {
        s["name"]: s["heads"] for s in json.loads((tmp_path / "gradual-0" / "pruned" / "prunetrain_layout.json")
                                                  .read_text())["sites"]}
    compared = run_cli("compare", *(tmp_path / n for n in ["gradual-0", "gradual-1", "full-0", "scratch-0"]),
                       "--names", "gradual,gradual,full,scratch", "--output", tmp_path / "cmp",
                       "--bootstrap-samples", "200")
    assert compared.returncode == 0, compared.stderr[-3000:]
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    gradual = data["arms"][0]
    assert gradual["arm"] == "gradual" and gradual["seeds"] == [0, 1]
    assert gradual["bleu"]["mean"] == pytest.approx((results["gradual-0"]["test_pruned"]["bleu"]
                                                     + results["gradual-1"]["test_pruned"]["bleu"]) / 2)
    assert {row["flops"] for row in data["equal_flops"]} == {0.3 * 22e9, 0.6 * 22e9}
    assert [(row["arm"], row["seed"]) for row in data["paired_tests"]] == [("full", 0), ("scratch", 0)]
    stats = {n: json.loads((tmp_path / n / "test_translations.json").read_text())["sentence_stats"]
             for n in ("gradual-0", "full-0")}
    assert data["paired_tests"][0]["p_value"] == paired_bootstrap(stats["gradual-0"], stats["full-0"],
                                                                  bleu_from_stats, samples=200)
    assert data["paired_tests"][0]["delta"] == pytest.approx(results["full-0"]["test_pruned"]["bleu"]
                                                             - results["gradual-0"]["test_pruned"]["bleu"])
    # every test set the runs scored, the tests across seeds on each, and the arm validation chooses
    splits = results["gradual-0"]["test_splits"]
    assert [t["split"] for t in data["test_sets"]] == splits and list(data["bootstrap_by_split"]) == splits
    assert [(r["split"], r["metric"], r["arm"], r["seeds"]) for r in data["seed_tests"]] == [
        (s, m, a, [0]) for s in splits for m in ("bleu", "chrf") for a in ("full", "scratch")]
    valid = {arm: [results[n]["final_scores"]["valid"]["bleu"] for n in names] for arm, names in
             [("gradual", ["gradual-0", "gradual-1"]), ("full", ["full-0"]), ("scratch", ["scratch-0"])]}
    assert data["selection"]["chosen"] == max(valid, key=lambda arm: sum(valid[arm]) / len(valid[arm]))
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    for heading in ("## Arms", "## Equal training FLOPs", "## Paired bootstrap", "## Paired tests across seeds",
                    "## Selection on validation", "### Validation BLEU at the same FLOP points"):
        assert heading in markdown
    # for selection runs: only what a choice may look at, the same choice, no test score anywhere in the output
    picked = run_cli("compare", *(tmp_path / n for n in ["gradual-0", "gradual-1", "full-0", "scratch-0"]),
                     "--names", "gradual,gradual,full,scratch", "--validation-only", "--output", tmp_path / "sel")
    assert picked.returncode == 0, picked.stderr[-3000:]
    chosen = json.loads((tmp_path / "sel" / "compare.json").read_text())
    assert json.loads(picked.stdout) == {"output": str(tmp_path / "sel"), **chosen}
    assert chosen["selection"] == data["selection"] and sorted(p.name for p in (tmp_path / "sel").iterdir()) == [
        ".prunetrain-output.json", "compare.json", "compare.md"]
    assert [a["valid_bleu"] for a in chosen["arms"]] == [a["valid_bleu"] for a in data["arms"]]
    assert [r["valid_bleu"] for r in chosen["valid_at_flops"]] == [r["valid_bleu"] for r in data["equal_flops"]]

    def keys(value):
        if isinstance(value, dict):
            return set(value) | {k for v in value.values() for k in keys(v)}
        return {k for v in value for k in keys(v)} if isinstance(value, list) else set()
    assert not {k for k in keys(chosen) if "test" in k or ("bleu" in k and not k.startswith("valid_"))
                or "chrf" in k and not k.startswith("valid_") or k in ("delta", "p_value")}, keys(chosen)
    assert "## Selection on validation" in (tmp_path / "sel" / "compare.md").read_text()


def _study_script(tmp_path, script="payoff_study.sh", study="wmt-small-deen-study"):
    """scripts/SCRIPT (with scripts/keep_run.sh) in a scratch tree whose `.venv/bin/prunetrain` records its arguments
    and writes the files a finished run has (the script runs from its tree's root): run(args, env) -> (exit code,
    stderr, the recipe command's arguments or None, the kept directories of STUDY)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    for name in dict.fromkeys((script, "payoff_study.sh", "keep_run.sh", "study_args.sh", "study_runs.sh",
                               "same_run.py", "same_speed.py")):
        shutil.copy(Path(__file__).resolve().parents[1] / "scripts" / name, root / "scripts")
    fake = root / ".venv" / "bin" / "prunetrain"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > args.txt\nout=${@: -1}; [ "$out" = --resume ] && '
                    'out=${@: -2:1}\nmkdir -p "$out/pruned"\nfor f in results.json report.md test_translations.json '
                    'run_complete.json pruned/prunetrain_layout.json; do echo {} > "$out/$f"; done\n')
    fake.chmod(0o755)
    python = root / ".venv" / "bin" / "python"  # study_runs.sh checks the machine with it (this environment's Python)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)

    def run(args, env=None):
        (root / "args.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", f"scripts/{script}", *args], cwd=root, capture_output=True, text=True,
                              env={**os.environ, **(env or {})})
        recorded = (root / "args.txt").read_text().splitlines() if (root / "args.txt").is_file() else None
        kept = root / "recipes" / "results" / study
        return done.returncode, done.stderr, recorded, sorted(p.name for p in kept.iterdir()) if kept.is_dir() else []

    return run


def test_payoff_study_names_a_run_without_cooldown_as_such_and_refuses_extra_arguments(tmp_path):
    run = _study_script(tmp_path)
    for zero in ("0", "0.0", "0.00", ".0", "00"):
        code, err, args, kept = run(["off", "1"], {"COOLDOWN": zero})
        assert code == 0, err
        assert args[-2:] == ["--output", "checkpoints/study/off-s1"] and f"train.cooldown={zero}" in args, args
    code, err, args, kept = run(["off", "1"], {"COOLDOWN": "0.2"})
    assert code == 0 and args[-1] == "checkpoints/study/off-cooldown-s1" and "train.cooldown=0.2" in args, err
    assert kept == ["off-cooldown-s1", "off-s1"]
    # `early` is the recipe's default (chosen on validation), so it sets no schedule; the earlier default and
    # shrink-each carry theirs
    code, err, args, _ = run(["early", "1"])
    assert code == 0 and not any("pruning." in a for a in args), args
    assert "eval.print_test=false" in args, args  # a study run's log prints no test score
    recipe = load_recipe("wmt-small-deen")
    assert recipe.pruning.schedule_steps == {200: 0.25, 300: 0.5, 400: 0.625, 500: 0.75}
    assert recipe.pruning.shrink_steps == [300, 500]
    small_steps = "pruning.schedule_steps={300: 0.125, 400: 0.25, 500: 0.375, 600: 0.5, 700: 0.625, 800: 0.75}"
    code, err, args, _ = run(["small-steps", "1"])
    assert code == 0 and small_steps in args and "pruning.shrink_steps=[400, 600, 800]" in args, args
    code, err, args, _ = run(["shrink-each", "1"])
    assert code == 0 and small_steps in args, args
    assert [a for a in args if a.startswith("pruning.shrink_steps")][-1] == \
        "pruning.shrink_steps=[300, 400, 500, 600, 700, 800]", args
    code, err, args, _ = run(["off", "1"], {"RESUME": "1"})
    assert code == 0 and args[-2:] == ["checkpoints/study/off-s1", "--resume"], err
    code, err, args, _ = run(["off", "1"], {"MAX_MINUTES": "150"})  # a slower machine's guard
    assert code == 0 and "train.max_minutes=150" in args, err
    for argv, env, message in [
        (["off", "1", "extra"], {}, "usage: payoff_study.sh ARM SEED (got 3 arguments: off 1 extra)"),
        (["off"], {}, "usage: payoff_study.sh ARM SEED (got 1 arguments: off)"),
        (["off", "one"], {}, "SEED 'one' is not a non-negative integer"),
        (["off", "1"], {"COOLDOWN": "none"}, "COOLDOWN 'none' is not a share of the FLOP budget"),
        (["off", "1"], {"COOLDOWN": "-0.2"}, "COOLDOWN '-0.2' is not a share of the FLOP budget"),
        (["off", "1"], {"RESUME": "yes"}, "RESUME 'yes' is not 0 or 1"),
        (["off", "1"], {"REGENERATE": "yes"}, "REGENERATE 'yes' is not 0, 1 or lean"),
        (["off", "1"], {"MAX_MINUTES": "1.5"}, "MAX_MINUTES '1.5' is not a positive whole number of minutes"),
        (["sideways", "1"], {}, "unknown arm 'sideways'"),
    ]:
        code, err, args, _ = run(argv, env)
        assert (code, args) == (2, None), (argv, env, err)
        assert err.strip().startswith(f"payoff_study.sh: {message}") and len(err.strip().splitlines()) == 1, err


def test_payoff_study_runs_an_arm_for_a_training_time_budget_and_keeps_every_sets_translations(tmp_path):
    """TIME_MINUTES=M: the FLOP budget off, M minutes of training time, test points at the same shares, a guard
    above M, the run named for it, and a scratch arm reading the architecture of the same kind of run; the kept
    directory holds `final_translations/` when the run wrote it."""
    run = _study_script(tmp_path)
    fake = tmp_path / "tree" / ".venv" / "bin" / "prunetrain"
    fake.write_text(fake.read_text() + 'mkdir -p "$out/final_translations"; echo {} > "$out/final_translations/valid.json"\n')
    code, err, args, kept = run(["shrink-each", "100"], {"COOLDOWN": "0.2", "TIME_MINUTES": "15"})
    assert code == 0, err
    assert args[-1] == "checkpoints/study/shrink-each-cooldown-time15min-s100"
    for setting in ("pruning.shrink_steps=[300, 400, 500, 600, 700, 800]", "train.max_flops=0",
                    "train.max_train_minutes=15", "eval.test_flops=[]", "eval.test_times=[0.2, 0.4, 0.6, 0.8, 0.9]",
                    "train.max_minutes=75", "train.cooldown=0.2", "train.seed=100"):
        assert setting in args, (setting, args)
    assert kept == ["shrink-each-cooldown-time15min-s100"]
    keep = tmp_path / "tree" / "recipes" / "results" / "wmt-small-deen-study" / kept[0]
    assert (keep / "final_translations" / "valid.json").is_file()
    code, err, args, _ = run(["scratch", "0"], {"COOLDOWN": "0.2", "TIME_MINUTES": "15", "SCRATCH_FROM": "small-steps"})
    assert code == 0 and args[-1] == "checkpoints/study/scratch-of-small-steps-cooldown-time15min-s0", err
    assert ("pruning.init_layout=recipes/results/wmt-small-deen-study/small-steps-cooldown-time15min-s0/layout.json"
            in args), args
    code, err, args, kept = run(["off", "0"], {"COOLDOWN": "0.2", "TIME_MINUTES": "25", "PRECISION": "measure"})
    assert code == 0 and args[-1] == "checkpoints/study/off-cooldown-time25min-measure-s0", err
    assert "train.precision=measure" in args and "off-cooldown-time25min-measure-s0" in kept, args
    code, err, args, _ = run(["off", "0"], {"PRECISION": "auto"})
    assert code == 0 and args[-1] == "checkpoints/study/off-s0" and not any("precision" in a for a in args), args
    code, err, args, _ = run(["off", "0"], {"PRECISION": "fp16"})
    assert (code, args) == (2, None) and err.strip() == ("payoff_study.sh: PRECISION 'fp16' is not one of auto, "
                                                         "bf16, fp32, measure"), err
    for bad in ("0", "1.5", "x"):
        code, err, args, _ = run(["off", "1"], {"TIME_MINUTES": bad})
        assert (code, args) == (2, None) and err.startswith(f"payoff_study.sh: TIME_MINUTES '{bad}' is not"), err


# a stand-in for .venv/bin/prunetrain in a scratch tree: appends each command line to calls.txt; `recipe` writes the
# files a finished run has into its --output, `compare` makes its --output directory
RECORDING_PRUNETRAIN = (
    '#!/usr/bin/env bash\necho "$*" >> calls.txt\nif [ "$1" = recipe ]; then out=${@: -1}; [ "$out" = --resume ] && '
    'out=${@: -2:1}; mkdir -p "$out/pruned"; for f in results.json report.md test_translations.json run_complete.json '
    'pruned/prunetrain_layout.json; do echo {} > "$out/$f"; done; else mkdir -p "${@: -1}"; fi\n')


def test_selection_study_continues_from_what_is_kept_and_chooses_on_validation_only(tmp_path):
    """scripts/selection_study.sh: the seven selection arms (seed 100) one after the other; kept arms skipped, an
    interrupted run resumed, a finished but unkept one kept; a stop file stops it between runs; at the end
    `prunetrain compare --validation-only` over all seven."""
    import subprocess

    root = tmp_path / "tree"
    _study_script(tmp_path, "selection_study.sh")
    fake = root / ".venv" / "bin" / "prunetrain"
    fake.write_text(RECORDING_PRUNETRAIN)
    kept = root / "recipes" / "results" / "wmt-small-deen-study"
    for name in ("small-steps-cooldown-s100", "shrink-each-cooldown-s100"):
        (kept / name).mkdir(parents=True)
        (kept / name / "results.json").write_text("{}")
    study = root / "checkpoints" / "study"
    (study / "gradual-cooldown-s100" / "checkpoint-454").mkdir(parents=True)  # interrupted after a checkpoint
    (study / "late-cooldown-s100").mkdir(parents=True)  # stopped before its first checkpoint: started again
    finished = study / "early-cooldown-s100"
    (finished / "pruned").mkdir(parents=True)
    for f in ("results.json", "report.md", "test_translations.json", "run_complete.json",
              "pruned/prunetrain_layout.json"):
        (finished / f).write_text("{}")

    def run():
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/selection_study.sh"], cwd=root, capture_output=True, text=True)
        calls = (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").is_file() else []
        return done, calls

    (study / "STOP").touch()
    done, calls = run()
    assert done.returncode == 0 and calls == [], done.stderr
    assert "stopped before gradual-cooldown-s100" in done.stdout and not (study / "STOP").exists()
    done, calls = run()
    assert done.returncode == 0, done.stderr
    recipes = [c for c in calls if c.startswith("recipe ")]
    assert [c.split("--output ")[1] for c in recipes] == [
        "checkpoints/study/gradual-cooldown-s100 --resume", "checkpoints/study/late-cooldown-s100",
        "checkpoints/study/per-kind-cooldown-s100", "checkpoints/study/small-steps-s100"]
    assert all("train.seed=100" in c and "train.max_minutes=150" in c for c in recipes)
    assert "train.cooldown=0 " in recipes[-1] and all("train.cooldown=0.2 " in c for c in recipes[:-1])
    assert (kept / "early-cooldown-s100" / "results.json").is_file()  # finished before: kept, not run again
    names = ["small-steps-cooldown", "shrink-each-cooldown", "gradual-cooldown", "early-cooldown", "late-cooldown",
             "per-kind-cooldown", "small-steps"]
    assert calls[-1] == ("compare " + " ".join(f"recipes/results/wmt-small-deen-study/{n}-s100" for n in names)
                         + f" --names {','.join(names)} --validation-only --output checkpoints/study/selection-s100")
    done, calls = run()  # everything kept: only the comparison again, the older one moved aside
    assert done.returncode == 0 and len(calls) == 1 and calls[0].startswith("compare "), done.stderr
    assert len(list(study.glob("selection-s100-*"))) == 1


def test_proof_study_runs_five_seeds_of_three_arms_at_equal_flops_then_equal_time(tmp_path):
    """scripts/proof_study.sh: the chosen default, the full model and the default's architecture from scratch, seeds
    0–4, at equal FLOPs and then at equal wall-clock, in a study of its own (the payoff study's runs of the same names
    are neither skipped nor overwritten, the scratch arm reads the proof's own layouts); each question compared with
    the default first once its fifteen runs are kept; a bad DEFAULT is one line, exit 2, before anything runs."""
    import os
    import subprocess

    root = tmp_path / "tree"
    _study_script(tmp_path, "proof_study.sh")
    fake = root / ".venv" / "bin" / "prunetrain"
    fake.write_text(RECORDING_PRUNETRAIN)
    earlier = root / "recipes" / "results" / "wmt-small-deen-study" / "small-steps-cooldown-s0"
    earlier.mkdir(parents=True)
    (earlier / "results.json").write_text('{"earlier": true}')

    def run(env):
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/proof_study.sh"], cwd=root, capture_output=True, text=True,
                              env={**os.environ, **env})
        calls = (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").is_file() else []
        return done, calls

    for env, message in [({}, "DEFAULT '' is not one of the selection's arms"),
                         ({"DEFAULT": "off"}, "DEFAULT 'off' is not one of the selection's arms"),
                         ({"DEFAULT": "gradual", "TIME_MINUTES": "0"}, "TIME_MINUTES '0' is not a positive"),
                         ({"DEFAULT": "gradual", "PRECISION": "fp8"}, "PRECISION 'fp8' is not one of"),
                         ({"DEFAULT": "gradual", "QUESTIONS": "time time"}, "QUESTIONS 'time time' is not one of")]:
        done, calls = run(env)
        assert done.returncode == 2 and calls == [], (env, done.stderr)
        assert done.stderr.startswith(f"proof_study.sh: {message}") and done.stderr.count("\n") == 1, done.stderr
    (root / "checkpoints" / "proof").mkdir(parents=True)
    (root / "checkpoints" / "proof" / "STOP").touch()
    done, calls = run({"DEFAULT": "early"})
    assert done.returncode == 0 and calls == [] and "stopped before early-cooldown-s0" in done.stdout
    done, calls = run({"DEFAULT": "early"})
    assert done.returncode == 0, done.stderr
    flops = ["early-cooldown", "off-cooldown", "scratch-of-early-cooldown"]
    time = [name + "-time20min-measure" for name in flops]
    kept = "recipes/results/wmt-small-deen-proof"
    recipes = [c for c in calls if c.startswith("recipe ")]
    assert [c.split("--output ")[1] for c in recipes] == [
        f"checkpoints/proof/{name}-s{seed}" for names in (flops, time) for seed in range(5) for name in names]
    assert all("train.cooldown=0.2 " in c for c in recipes)
    assert all("train.max_train_minutes=20 " in c and "train.precision=measure " in c for c in recipes[15:])
    assert not any("max_train_minutes" in c or "train.precision" in c for c in recipes[:15])
    for seed in range(5):
        assert f"pruning.init_layout={kept}/early-cooldown-s{seed}/layout.json " in recipes[3 * seed + 2]
        assert f"pruning.init_layout={kept}/early-cooldown-time20min-measure-s{seed}/layout.json " in \
            recipes[15 + 3 * seed + 2]
    compares = [c for c in calls if c.startswith("compare ")]
    for compare, names, out in [(compares[0], flops, "equal-flops"), (compares[1], time, "equal-time")]:
        assert compare == ("compare " + " ".join(f"{kept}/{n}-s{seed}" for n in names for seed in range(5))
                           + " --names " + ",".join(n for n in names for _ in range(5))
                           + f" --output checkpoints/proof/{out}")
    assert calls.index(compares[0]) == 15 and calls.index(compares[1]) == 31
    assert (earlier / "results.json").read_text() == '{"earlier": true}'
    assert len(list((root / kept).iterdir())) == 30
    done, calls = run({"DEFAULT": "early"})  # everything kept: the two comparisons again, older ones aside
    assert done.returncode == 0 and [c.split()[0] for c in calls] == ["compare", "compare"], done.stderr
    assert len(list((root / "checkpoints" / "proof").glob("equal-*-*"))) == 2


def test_the_fast_models_proof_is_a_study_of_its_own(tmp_path):
    """proof_study.sh with a fast arm as DEFAULT (issue 64): the fast recipe for the arm and its scratch
    architecture, the main recipe with pruning off for the full model, in checkpoints/fast-proof/, kept apart in
    recipes/results/wmt-small-deen-fast-proof/; with QUESTIONS="time flops" the equal wall-clock runs and their
    comparison first (they must share the selection's machine type), then those at equal FLOPs; QUESTIONS=time
    runs only the first."""
    import os
    import subprocess

    root = tmp_path / "tree"
    _study_script(tmp_path, "proof_study.sh")
    (root / ".venv" / "bin" / "prunetrain").write_text(RECORDING_PRUNETRAIN)
    same_speed = _speed_reference(root)  # this machine's step measured as the reference's (same_speed's own test)

    def run(questions):
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/proof_study.sh"], cwd=root, capture_output=True, text=True,
                              env={**os.environ, "DEFAULT": "fast-h36-f50", "QUESTIONS": questions,
                                   "SPEED_MEASURED": str(same_speed)})
        assert done.returncode == 0, done.stderr
        calls = (root / "calls.txt").read_text().splitlines()
        return [c for c in calls if c.startswith("recipe ")], [c for c in calls if c.startswith("compare ")]

    flops = ["fast-h36-f50-cooldown", "off-cooldown", "scratch-of-fast-h36-f50-cooldown"]
    time = [name + "-time20min-measure" for name in flops]
    kept = "recipes/results/wmt-small-deen-fast-proof"
    recipes, compares = run("time")
    assert [c.split("--output ")[1] for c in recipes] == [
        f"checkpoints/fast-proof/{name}-s{seed}" for seed in range(5) for name in time]
    assert [c.split("--output ")[1] for c in compares] == ["checkpoints/fast-proof/equal-time"]
    recipes, compares = run("time flops")  # the equal-time runs are kept: only their comparison, then the FLOPs runs
    assert [c.split("--output ")[1] for c in recipes] == [
        f"checkpoints/fast-proof/{name}-s{seed}" for seed in range(5) for name in flops]
    for i, c in enumerate(recipes):
        assert c.startswith("recipe wmt-small-deen-fast " if i % 3 != 1 else "recipe wmt-small-deen "), c
    assert f"pruning.init_layout={kept}/fast-h36-f50-cooldown-s4/layout.json " in recipes[-1]
    assert [c.split("--output ")[1] for c in compares] == ["checkpoints/fast-proof/equal-time",
                                                          "checkpoints/fast-proof/equal-flops"]
    assert len(list((root / kept).iterdir())) == 30


def test_compress_study_runs_each_arm_from_the_seeds_full_model(tmp_path):
    """scripts/compress_study.sh: every arm starts from the payoff study's full model of its seed (or START), the
    scratch arm trains the distill arm's architecture from a fresh initialisation with that model as the teacher;
    bad arguments are one line, exit 2, before anything runs."""
    run = _study_script(tmp_path, "compress_study.sh", "wmt-small-deen-compress-study")
    start = tmp_path / "tree" / "checkpoints" / "proof" / "off-cooldown-s3"
    start.mkdir(parents=True)
    expected = {"distill": [], "plain": ["distill.alpha=0"],
                "at-once-distill": ["pruning.schedule_steps={30: 0.75}", "pruning.shrink_steps=[30]"],
                "at-once": ["pruning.schedule_steps={30: 0.75}", "distill.alpha=0"]}
    for arm, settings in expected.items():
        code, err, args, kept = run([arm, "3"])
        assert code == 0, err
        assert args[:2] == ["recipe", "wmt-small-deen-compress"] and args[-1] == f"checkpoints/compress/{arm}-s3"
        assert "model.init_from=checkpoints/proof/off-cooldown-s3" in args and "train.seed=3" in args, args
        assert "eval.print_test=false" in args, args  # a study run's log prints no test score
        assert all(setting in args for setting in settings), (arm, args)
        # the study's arms ran at 2e-4, the recipe's learning rate before validation chose 4e-4: pinned, once
        assert [a for a in args if a.startswith("train.learning_rate=")] == ["train.learning_rate=0.0002"], args
        assert (arm == "plain" or arm == "at-once") == ("distill.alpha=0" in args)
    code, err, args, kept = run(["scratch-distill", "3"], {"MAX_MINUTES": "90"})
    assert code == 0, err
    for setting in ("model.init_from=", "distill.teacher=checkpoints/proof/off-cooldown-s3", "train.max_minutes=90",
                    "pruning.init_layout=recipes/results/wmt-small-deen-compress-study/distill-s3/layout.json",
                    "pruning.schedule_steps={}", "train.learning_rate=0.0007"):
        assert setting in args, (setting, args)
    assert "train.learning_rate=0.0002" not in args  # one learning rate each: the from-scratch optimiser's
    code, err, args, kept = run(["tune-lr4e-4", "3"])
    assert code == 0, err
    assert [a for a in args if a.startswith("train.learning_rate=")] == ["train.learning_rate=0.0004"], args
    assert kept == ["at-once-distill-s3", "at-once-s3", "distill-s3", "plain-s3", "scratch-distill-s3",
                    "tune-lr4e-4-s3"]
    code, err, args, _ = run(["distill", "4"])
    assert (code, args) == (2, None) and err.startswith("compress_study.sh: START 'checkpoints/proof/off-cooldown-s4' "
                                                        "is not a directory; train the starting model first"), err
    code, err, args, _ = run(["distill", "4"], {"START": str(start)})
    assert code == 0 and f"model.init_from={start}" in args, err
    for argv, env, message in [(["sideways", "3"], {}, "unknown arm 'sideways'"),
                               (["distill"], {}, "usage: compress_study.sh ARM SEED (got 1 arguments: distill)"),
                               (["distill", "03"], {}, "SEED '03' is not a non-negative integer"),
                               (["distill", "3"], {"RESUME": "2"}, "RESUME '2' is not 0 or 1")]:
        code, err, args, _ = run(argv, env)
        assert (code, args) == (2, None) and err.strip() == err.strip().splitlines()[0], (argv, err)
        assert err.startswith(f"compress_study.sh: {message}"), err


def test_compress_study_sequence_level_arms(tmp_path):
    """The sequence-level distillation arms (issue 65): the recipe's learning rate (4e-4), the teacher's
    translations kept in one shared directory, each arm's targets, word-level term, beams and FFN schedule;
    LEARNING_RATE runs an arm at another rate under its own name; a bad one is one line, exit 2."""
    run = _study_script(tmp_path, "compress_study.sh", "wmt-small-deen-compress-study")
    (tmp_path / "tree" / "checkpoints" / "proof" / "off-cooldown-s1").mkdir(parents=True)
    shared = "distill.translations_dir=checkpoints/compress/teacher-translations"
    expected = {"seq": ["distill.targets=teacher", "distill.alpha=0", shared],
                "seq-word": ["distill.targets=teacher", shared],
                "both-word": ["distill.targets=both", shared],
                "seq-greedy": ["distill.targets=teacher", "distill.alpha=0", "distill.beams=1", shared],
                "seq-word-ffn50": ["distill.targets=teacher", shared,
                                   "pruning.ffn_schedule_steps={60: 0.25, 120: 0.5}"],
                "seq-word-ffn75": ["distill.targets=teacher", shared,
                                   "pruning.ffn_schedule_steps={60: 0.25, 120: 0.5, 180: 0.75}"]}
    for arm, settings in expected.items():
        code, err, args, kept = run([arm, "1"])
        assert code == 0, err
        assert all(setting in args for setting in settings), (arm, args)
        assert ("distill.alpha=0" in args) == (arm in ("seq", "seq-greedy")), args
        assert [a for a in args if a.startswith("train.learning_rate=")] == ["train.learning_rate=0.0004"], args
        assert args[-1] == f"checkpoints/compress/{arm}-s1" and f"{arm}-s1" in kept
    code, err, args, kept = run(["seq-word", "1"], {"LEARNING_RATE": "8e-4"})
    assert code == 0, err
    assert [a for a in args if a.startswith("train.learning_rate=")] == ["train.learning_rate=8e-4"], args
    assert args[-1] == "checkpoints/compress/seq-word-lr8e-4-s1" and "seq-word-lr8e-4-s1" in kept
    for bad in ("0", "-1e-4", "fast", "1e-4x"):
        code, err, args, _ = run(["seq", "1"], {"LEARNING_RATE": bad})
        assert (code, args) == (2, None), (bad, err)
        assert err == f"compress_study.sh: LEARNING_RATE '{bad}' is not a positive number (such as 2e-4)\n", err
    code, err, args, kept = run(["scratch", "1"], {"SCRATCH_FROM": "seq"})
    assert code == 0, err
    for setting in ("model.init_from=", "distill.teacher=checkpoints/proof/off-cooldown-s1", "distill.targets=teacher",
                    "distill.alpha=0", shared, "pruning.ffn_schedule_steps={}", "train.learning_rate=0.0007",
                    "pruning.init_layout=recipes/results/wmt-small-deen-compress-study/seq-s1/layout.json"):
        assert setting in args, (setting, args)
    assert args[-1] == "checkpoints/compress/scratch-of-seq-s1" and "scratch-of-seq-s1" in kept
    code, err, args, _ = run(["scratch", "1"])  # the default: seq-word's architecture, the word-level term on
    assert code == 0 and "distill.alpha=0" not in args and args[-1] == "checkpoints/compress/scratch-of-seq-word-s1"
    assert "distill.targets=teacher" in args and shared in args, args
    # word (at another learning rate): the references with the word-level term, its own architecture, the
    # from-scratch optimiser (never the arm's learning rate)
    code, err, args, _ = run(["scratch", "1"], {"SCRATCH_FROM": "word-lr8e-4"})
    assert code == 0 and args[-1] == "checkpoints/compress/scratch-of-word-lr8e-4-s1", err
    assert not any(a.startswith(("distill.targets=", "distill.alpha=", "distill.translations_dir=")) for a in args)
    assert "pruning.init_layout=recipes/results/wmt-small-deen-compress-study/word-lr8e-4-s1/layout.json" in args
    assert [a for a in args if a.startswith("train.learning_rate=")] == ["train.learning_rate=0.0007"], args
    for bad in ("distill", "word-lr", "seqword"):
        code, err, args, _ = run(["scratch", "1"], {"SCRATCH_FROM": bad})
        assert (code, args) == (2, None) and err.startswith(f"compress_study.sh: SCRATCH_FROM '{bad}' is not a kept "
                                                            "run of a sequence-level study arm"), (bad, err)
    from prunetrain.mt.config.recipe import load_recipe

    for arm, settings in expected.items():  # every arm is a valid recipe
        load_recipe("wmt-small-deen-compress", settings)


# RECORDING_PRUNETRAIN, and a recipe run also writes the full model's config and the final validation translation:
# the line in translation.txt (a run trained again translates as translation.txt says when it ends), or in lean.txt
# when there is one and the run has no benchmark (REGENERATE=lean)
TRANSLATING_PRUNETRAIN = RECORDING_PRUNETRAIN.replace(
    'pruned/prunetrain_layout.json; do echo {} > "$out/$f"; done;',
    'pruned/prunetrain_layout.json; do echo {} > "$out/$f"; done; mkdir -p "$out/full" "$out/final_translations"; '
    'echo {} > "$out/full/config.json"; said=translation.txt; [[ -f lean.txt && " $* " == *" eval.bench=false "* ]] '
    '&& said=lean.txt; printf \'{"hypotheses": ["%s"]}\' "$(cat $said)" > "$out/final_translations/valid.json";')


def test_seqkd_study_trains_each_seeds_start_then_its_arms_and_chooses_on_validation_only(tmp_path):
    """scripts/seqkd_study.sh: per seed (0, 1) the starting model (a study of its own) and the six sequence-level
    arms from it (study seqkd), then `compare --validation-only` over the twelve; a seed whose arms are all kept
    needs no starting model; a seed with arms left whose starting model is gone trains it again, first without the
    measurements (REGENERATE=lean), then with them, and goes on only when scripts/same_run.py finds it is the kept run
    (otherwise refused, exit 2, nothing kept or run after it)."""
    import shutil
    import subprocess
    from pathlib import Path

    root = tmp_path / "tree"
    _study_script(tmp_path, "seqkd_study.sh")
    shutil.copy(Path(__file__).resolve().parents[1] / "scripts" / "compress_study.sh", root / "scripts")
    (root / ".venv" / "bin" / "prunetrain").write_text(TRANSLATING_PRUNETRAIN)
    (root / "translation.txt").write_text("A dog runs.")

    def run():
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/seqkd_study.sh"], cwd=root, capture_output=True, text=True)
        calls = (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").is_file() else []
        return done, calls

    done, calls = run()
    assert done.returncode == 0, done.stderr
    arms = ["word", "seq", "seq-word", "both-word", "seq-greedy", "seq-word-ffn50"]
    recipes = [c for c in calls if c.startswith("recipe ")]
    assert [c.split("--output ")[1] for c in recipes] == [
        out for seed in (0, 1) for out in (f"checkpoints/compress-start/off-cooldown-s{seed}",
                                           *[f"checkpoints/seqkd/{arm}-s{seed}" for arm in arms])]
    for seed in (0, 1):
        start, *arm_runs = recipes[7 * seed: 7 * seed + 7]
        assert start.startswith("recipe wmt-small-deen ") and "train.cooldown=0.2 " in start
        assert "pruning.schedule_steps={}" in start and f"train.seed={seed} " in start
        for c in arm_runs:
            assert c.startswith("recipe wmt-small-deen-compress ") and "train.learning_rate=0.0004 " in c
            assert f"model.init_from=checkpoints/compress-start/off-cooldown-s{seed} " in c
        assert all("distill.translations_dir=checkpoints/seqkd/teacher-translations " in c for c in arm_runs[1:])
    names = ",".join(arm for arm in arms for _ in (0, 1))
    assert calls[-1] == ("compare " + " ".join(f"recipes/results/wmt-small-deen-seqkd/{arm}-s{seed}" for arm in arms
                                               for seed in (0, 1))
                         + f" --names {names} --validation-only --output checkpoints/seqkd/selection-s0-s1")
    start = root / "checkpoints" / "compress-start" / "off-cooldown-s0"
    kept_start = root / "recipes" / "results" / "wmt-small-deen-compress-start" / "off-cooldown-s0"
    marker = (kept_start / ".prunetrain-output.json").read_text()
    shutil.rmtree(root / "checkpoints")  # gone (not kept): no model needed while every arm of every seed is kept
    done, calls = run()
    assert done.returncode == 0 and [c.split()[0] for c in calls] == ["compare"], done.stderr
    lean = ("pruning.curve_steps=[] ", "eval.test_flops=[] ", "eval.test_times=[] ", "eval.bench=false ")
    outputs = lambda calls: [c.split("--output ")[1] for c in calls if c.startswith("recipe ")]  # noqa: E731
    shutil.rmtree(root / "recipes" / "results" / "wmt-small-deen-seqkd" / "seq-s0")  # an arm left: trained again
    done, calls = run()  # without the measurements, and it is the kept run: used
    assert done.returncode == 0, done.stderr
    assert outputs(calls) == ["checkpoints/compress-start/off-cooldown-s0", "checkpoints/seqkd/seq-s0"]
    assert all(setting in calls[0] for setting in lean) and "train.seed=0 " in calls[0], calls[0]
    assert "off-cooldown-s0 is the run kept in" in done.stdout and calls[-1].startswith("compare ")
    assert (kept_start / ".prunetrain-output.json").read_text() == marker  # checked, not kept again
    # without the measurements it is not the kept run: set aside, trained again with them, which is
    shutil.rmtree(root / "checkpoints")
    shutil.rmtree(root / "recipes" / "results" / "wmt-small-deen-seqkd" / "seq-s0")
    (root / "lean.txt").write_text("A cat runs.")
    done, calls = run()
    assert done.returncode == 0, done.stderr
    assert outputs(calls) == ["checkpoints/compress-start/off-cooldown-s0"] * 2 + ["checkpoints/seqkd/seq-s0"]
    assert all(s in calls[0] for s in lean) and not any(s in calls[1] for s in lean), calls[:2]
    names = sorted(p.name for p in (root / "checkpoints" / "compress-start").iterdir())
    assert len(names) == 2 and names[0] == "off-cooldown-s0" and names[1].startswith("off-cooldown-s0.lean-20"), names
    # trained again, it translates differently either way: not the model the kept arms started from, so no arm runs
    shutil.rmtree(root / "checkpoints")
    shutil.rmtree(root / "recipes" / "results" / "wmt-small-deen-seqkd" / "seq-s0")
    (root / "translation.txt").write_text("A cat runs.")
    done, calls = run()
    assert done.returncode == 2 and outputs(calls) == ["checkpoints/compress-start/off-cooldown-s0"] * 2, done.stderr
    *checks, last = done.stderr.splitlines()
    assert len(checks) == 2 and all(line.startswith("same_run.py: checkpoints/compress-start/off-cooldown-s0 is not "
                                                    "the run kept in ") and
                                    line.endswith("valid.json: 1 of 1 translations differ") for line in checks), checks
    assert last.startswith("seqkd_study.sh: checkpoints/compress-start/off-cooldown-s0, trained again, is not the "
                           "starting model kept in ") and "aside to run the seed again" in last, last
    assert not (root / "recipes" / "results" / "wmt-small-deen-seqkd" / "seq-s0").exists()
    # a present model that is not the kept one is refused too
    done, calls = run()
    assert done.returncode == 2 and calls == [], done.stderr
    first, last = done.stderr.splitlines()
    assert first.endswith("valid.json: 1 of 1 translations differ"), first
    assert last.startswith("seqkd_study.sh: checkpoints/compress-start/off-cooldown-s0 is not the starting model "
                           "kept in ") and "aside to run the seed again" in last, last


def test_seqkd_study_second_stage_and_five_seeds(tmp_path):
    """scripts/seqkd_study.sh rates ARM: ARM at 4e-4 (kept by the selection), 2e-4 and 8e-4 at seeds 0 and 1, then
    `compare --validation-only`; seeds ARM [RATE]: the chosen setting and its architecture from scratch at seeds 0-4,
    each seed's starting model trained first when it is not kept, then the comparison with the starting models (the
    test sets read). A bad stage, arm or rate is one line, exit 2, before anything runs."""
    import shutil
    import subprocess
    from pathlib import Path

    root = tmp_path / "tree"
    _study_script(tmp_path, "seqkd_study.sh")
    shutil.copy(Path(__file__).resolve().parents[1] / "scripts" / "compress_study.sh", root / "scripts")
    (root / ".venv" / "bin" / "prunetrain").write_text(TRANSLATING_PRUNETRAIN)
    (root / "translation.txt").write_text("A dog runs.")

    def run(*args):
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/seqkd_study.sh", *args], cwd=root, capture_output=True, text=True)
        calls = (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").is_file() else []
        return done, calls

    outputs = lambda calls: [c.split("--output ")[1] for c in calls if c.startswith("recipe ")]  # noqa: E731
    rate = lambda call: call.split("train.learning_rate=")[1].split()[0]  # noqa: E731
    done, calls = run("rates", "seq-word")
    assert done.returncode == 0, done.stderr
    assert outputs(calls) == [out for seed in (0, 1) for out in (
        f"checkpoints/compress-start/off-cooldown-s{seed}", f"checkpoints/seqkd/seq-word-s{seed}",
        f"checkpoints/seqkd/seq-word-lr2e-4-s{seed}", f"checkpoints/seqkd/seq-word-lr8e-4-s{seed}")]
    recipes = [c for c in calls if c.startswith("recipe ")]
    assert [rate(c) for c in recipes if "seqkd/" in c] == ["0.0004", "2e-4", "8e-4"] * 2
    names = ",".join(name for name in ("seq-word", "seq-word-lr2e-4", "seq-word-lr8e-4") for _ in (0, 1))
    assert calls[-1] == ("compare " + " ".join(f"recipes/results/wmt-small-deen-seqkd/{name}-s{seed}" for name in
                                               names.split(",")[::2] for seed in (0, 1))
                         + f" --names {names} --validation-only --output checkpoints/seqkd/rates-seq-word-s0-s1")
    done, calls = run("rates", "seq-word")  # all kept: only the comparison again (the older one moved aside)
    assert done.returncode == 0 and [c.split()[0] for c in calls] == ["compare"], done.stderr
    compared = sorted(p.name for p in (root / "checkpoints" / "seqkd").glob("rates-seq-word-s0-s1*"))
    assert len(compared) == 2 and compared[1].startswith("rates-seq-word-s0-s1-20"), compared
    (root / "checkpoints" / "seqkd" / "STOP").touch()
    done, calls = run("seeds", "seq-word", "8e-4")  # stops before its first run, the stop file removed
    assert done.returncode == 0 and calls == [] and "stopped before" in done.stdout, done.stderr
    assert not (root / "checkpoints" / "seqkd" / "STOP").exists()
    done, calls = run("seeds", "seq-word", "8e-4")
    assert done.returncode == 0, done.stderr
    expected = []
    for seed in range(5):
        if seed > 1:  # a new starting model (0 and 1 are kept and present: checked, not trained)
            expected.append(f"checkpoints/compress-start/off-cooldown-s{seed}")
        if seed > 1:
            expected.append(f"checkpoints/seqkd/seq-word-lr8e-4-s{seed}")
        expected.append(f"checkpoints/seqkd/scratch-of-seq-word-lr8e-4-s{seed}")
    assert outputs(calls) == expected
    recipes = [c for c in calls if c.startswith("recipe ")]
    assert all(rate(c) == "8e-4" for c in recipes if "--output checkpoints/seqkd/seq-word-lr8e-4" in c)
    assert all(rate(c) == "0.0007" and "pruning.init_layout=recipes/results/wmt-small-deen-seqkd/seq-word-lr8e-4-s"
               in c for c in recipes if "--output checkpoints/seqkd/scratch-of" in c)
    runs = [f"recipes/results/wmt-small-deen-seqkd/{name}-s{seed}" for name in ("seq-word-lr8e-4",
                                                                             "scratch-of-seq-word-lr8e-4")
            for seed in range(5)] + [f"recipes/results/wmt-small-deen-compress-start/off-cooldown-s{s}" for s in range(5)]
    names = ",".join(name for name in ("seq-word-lr8e-4", "scratch-of-seq-word-lr8e-4", "start") for _ in range(5))
    assert calls[-1] == f"compare {' '.join(runs)} --names {names} --output checkpoints/seqkd/final-seq-word-lr8e-4-s0-s4"
    assert "--validation-only" not in calls[-1]
    # either study's stop file stops the study before a run that is not kept (both are used up), a new starting
    # model included
    seqkd_stop, start_stop = (root / "checkpoints" / study / "STOP" for study in ("seqkd", "compress-start"))
    for name in ("seq-word-lr8e-4-s4", "scratch-of-seq-word-lr8e-4-s4"):
        shutil.rmtree(root / "recipes" / "results" / "wmt-small-deen-seqkd" / name)
        shutil.rmtree(root / "checkpoints" / "seqkd" / name)
    start_stop.touch()
    seqkd_stop.touch()
    done, calls = run("seeds", "seq-word", "8e-4")
    assert done.returncode == 0 and calls == [], done.stderr
    assert "stopped before seq-word-lr8e-4-s4" in done.stdout and not start_stop.exists() and not seqkd_stop.exists()
    shutil.rmtree(root / "recipes" / "results" / "wmt-small-deen-compress-start" / "off-cooldown-s4")
    shutil.rmtree(root / "checkpoints" / "compress-start" / "off-cooldown-s4")
    seqkd_stop.touch()
    done, calls = run("seeds", "seq-word", "8e-4")
    assert done.returncode == 0 and calls == [] and "stopped before off-cooldown-s4" in done.stdout, done.stderr
    assert not seqkd_stop.exists()
    done, calls = run("seeds", "seq-word", "8e-4")
    assert done.returncode == 0, done.stderr
    assert outputs(calls) == ["checkpoints/compress-start/off-cooldown-s4", "checkpoints/seqkd/seq-word-lr8e-4-s4",
                              "checkpoints/seqkd/scratch-of-seq-word-lr8e-4-s4"]
    for args, message in [(("rates",), "the second stage takes one ARM"),
                          (("rates", "distill"), "ARM 'distill' is not one of the study's arms"),
                          (("seeds", "word", "4e-4"), "RATE '4e-4' is not a rate of the second stage"),
                          (("seeds",), "the five seeds take ARM and maybe RATE"),
                          (("selection", "word"), "the selection takes no arguments"),
                          (("frontier",), "unknown stage 'frontier'")]:
        done, calls = run(*args)
        assert (done.returncode, calls) == (2, []), (args, done.stderr)
        assert done.stderr.startswith(f"seqkd_study.sh: {message}") and done.stderr.count("\n") == 1, done.stderr


def test_a_study_refuses_to_time_a_run_on_another_machine_than_its_kept_runs(tmp_path):
    """study_runs.sh: the kept timed runs' `results.json` `machine` must be this machine's (equal wall-clock means one
    machine); another is refused in one line, exit 2, before anything runs; the same machine goes on. A kept run of a
    FLOP budget (no `max_train_seconds`) made on another machine does not stop a timed run."""
    import subprocess

    from prunetrain.bench.environment import machine

    root = tmp_path / "tree"
    _study_script(tmp_path, "fast_study.sh")
    (root / ".venv" / "bin" / "prunetrain").write_text(RECORDING_PRUNETRAIN)
    kept = root / "recipes" / "results" / "wmt-small-deen-fast" / "fast-h36-f50-early-cooldown-time20min-measure-s100"
    kept.mkdir(parents=True)
    other = {**machine(), "cpu": "AMD EPYC 9999 (another machine)"}
    flop_budget = kept.parent / "off-cooldown-s100"
    flop_budget.mkdir()
    (flop_budget / "results.json").write_text(json.dumps({"machine": other, "max_train_seconds": None}))
    (kept / "results.json").write_text(json.dumps({"machine": other, "max_train_seconds": 1200.0}))
    done = subprocess.run(["bash", "scripts/fast_study.sh"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 2 and not (root / "calls.txt").exists(), done.stderr
    assert "ran on" in done.stderr and "a study's timed runs share one machine" in done.stderr
    assert str(kept.relative_to(root)) in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    (kept / "results.json").write_text(json.dumps({"machine": machine(), "max_train_seconds": 1200.0}))
    done = subprocess.run(["bash", "scripts/fast_study.sh"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len([c for c in (root / "calls.txt").read_text().splitlines() if c.startswith("recipe ")]) == 5


SPEED_REFERENCE = "benchmarks/results/recipe_step_profile_plain_records_epyc.json"  # proof_study.sh's for fast-proof


def _speed_profile(path, step_s: float, variant: str = "fused+fused"):
    """A `benchmarks/profile_recipe_step.py` result at `path` whose full model steps in `step_s` (bf16)."""
    rows = [{"precision": "bf16", "variant": variant, "arm": "144", "step_s": step_s},
            {"precision": "fp32", "variant": variant, "arm": "144", "step_s": 3 * step_s}]
    path.write_text(json.dumps({"command": "profile_recipe_step.py", "results": rows}))
    return path


def _full_model_step(path):
    """scripts/same_speed.py's own reading of a profile at `path`: the full model's bf16 step and its variant."""
    import sys
    from pathlib import Path

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    sys.path.insert(0, scripts)
    try:
        from same_speed import full_model_step
    finally:
        sys.path.remove(scripts)
    return full_model_step(path)


def _speed_reference(root, ratio: float = 1.0):
    """The fast proof's speed reference copied into the scratch tree `root`, and a measurement of this machine
    `ratio` times its full-model step (the path of the measurement)."""
    import shutil
    from pathlib import Path

    reference = root / SPEED_REFERENCE
    reference.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).resolve().parents[1] / SPEED_REFERENCE, reference)
    step, _ = _full_model_step(reference)
    return _speed_profile(root / f"measured-{ratio}.json", ratio * step)


def test_same_speed_compares_the_full_models_step_with_the_reference_machines(tmp_path):
    """scripts/same_speed.py: within [1/t, t] of the reference's full-model bf16 step is one line on stdout, exit 0;
    slower or faster beyond it one line on stderr saying which way and by how much, exit 2; a profile without the
    reference's variant, an unreadable file or a tolerance not above 1 exit 2 without a traceback. The fast proof's
    reference (benchmarks/README.md l5, made on the EPYC of its kept timed runs) holds the row it compares."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "same_speed.py"
    reference = _speed_profile(tmp_path / "reference.json", 0.300)

    def same_speed(measured, *options):
        return subprocess.run([sys.executable, str(script), str(reference), str(measured), *options],
                              capture_output=True, text=True)

    for step, code, words in [(0.300, 0, "same speed"), (0.370, 0, "1.23×, within 1.25×"),
                              (0.380, 2, "1.27× slower, beyond 1.25×"), (0.516, 2, "1.72× slower"),
                              (0.200, 2, "1.50× faster")]:
        done = same_speed(_speed_profile(tmp_path / f"m{step}.json", step))
        said = done.stdout if code == 0 else done.stderr
        assert done.returncode == code and words in said and said.count("\n") == 1, (step, done)
        assert f"{step:.3f} s against the reference's 0.300 s" in said, said
    done = same_speed(_speed_profile(tmp_path / "m.json", 0.380), "--tolerance", "1.3")
    assert done.returncode == 0, done.stderr
    for measured, options, words in [(_speed_profile(tmp_path / "v.json", 0.3, "model+adamw"), (),
                                      "holds no bf16 step of the 144-head model with variant fused+fused"),
                                     (tmp_path / "absent.json", (), "is not a readable profile_recipe_step.py"),
                                     (reference, ("--tolerance", "1"), "--tolerance 1.0 is not allowed")]:
        done = same_speed(measured, *options)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
    step, variant = _full_model_step(Path(__file__).resolve().parents[1] / SPEED_REFERENCE)
    assert variant == "fused+fused" and 0.1 < step < 1.0


def test_the_fast_proof_refuses_a_timed_run_on_a_machine_of_another_speed(tmp_path):
    """proof_study.sh for the fast proof: before its first timed run, this machine's full-model step against the
    EPYC of the kept timed runs (study_runs.sh same_speed; SPEED_MEASURED gives the measurement): 1.5× slower is one
    line, exit 2, before any run; SPEED_TOLERANCE widens the band; SPEED_REFERENCE= (empty) leaves it unchecked; a
    FLOP-budget question is never checked."""
    import os
    import subprocess

    root = tmp_path / "tree"
    _study_script(tmp_path, "proof_study.sh")
    (root / ".venv" / "bin" / "prunetrain").write_text(RECORDING_PRUNETRAIN)
    slower = _speed_reference(root, 1.5)

    def run(questions, **env):
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/proof_study.sh"], cwd=root, capture_output=True, text=True,
                              env={**os.environ, "DEFAULT": "fast-h36-f50", "QUESTIONS": questions,
                                   "SPEED_MEASURED": str(slower), **env})
        calls = (root / "calls.txt").read_text().splitlines() if (root / "calls.txt").is_file() else []
        return done, [c for c in calls if c.startswith("recipe ")]

    done, recipes = run("time")
    assert done.returncode == 2 and recipes == [], done.stderr
    assert done.stderr.startswith("same_speed.py: ") and "1.50× slower, beyond 1.25×" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and not (root / "checkpoints" / "fast-proof" / "equal-time").exists()
    done, recipes = run("flops")
    assert done.returncode == 0 and len(recipes) == 15, done.stderr
    done, recipes = run("time", SPEED_TOLERANCE="1.6")
    assert done.returncode == 0 and len(recipes) == 15 and "same speed" in done.stdout, done.stderr
    assert done.stdout.count("same_speed.py: ") == 1  # once per invocation, not before each run
    (root / "recipes" / "results" / "wmt-small-deen-fast-proof").rename(root / "kept-aside")
    (root / "checkpoints" / "fast-proof").rename(root / "runs-aside")
    done, recipes = run("time", SPEED_REFERENCE="")
    assert done.returncode == 0 and len(recipes) == 15 and "same_speed" not in done.stdout + done.stderr


def test_a_study_compares_the_cpu_generation_where_the_kept_record_names_it(tmp_path):
    """machine() names the CPU's x86 family, model and stepping (two CPUs sold under one name differ in speed);
    study_runs.sh compares what a kept timed run's record names: an older record without the generation, on this
    CPU, goes on; a record of another family is refused in one line, exit 2."""
    import subprocess
    from pathlib import Path

    from prunetrain.bench.environment import CPU_GENERATION, machine

    here = machine()
    assert set(CPU_GENERATION.values()) == {"cpu_family", "cpu_model_number", "cpu_stepping"} <= set(here)
    if Path("/proc/cpuinfo").is_file() and "cpu family" in Path("/proc/cpuinfo").read_text():
        assert here["cpu_family"] and here["cpu_model_number"], here
    root = tmp_path / "tree"
    _study_script(tmp_path, "fast_study.sh")
    (root / ".venv" / "bin" / "prunetrain").write_text(RECORDING_PRUNETRAIN)
    kept = root / "recipes" / "results" / "wmt-small-deen-fast" / "fast-h36-f50-early-cooldown-time20min-measure-s100"
    kept.mkdir(parents=True)
    older = {k: v for k, v in here.items() if k not in CPU_GENERATION.values()}
    for record, code in [({**here, "cpu_family": "another"}, 2), (older, 0)]:
        (kept / "results.json").write_text(json.dumps({"machine": record, "max_train_seconds": 1200.0}))
        (root / "calls.txt").unlink(missing_ok=True)
        done = subprocess.run(["bash", "scripts/fast_study.sh"], cwd=root, capture_output=True, text=True)
        assert done.returncode == code, done.stderr
        assert (root / "calls.txt").exists() == (code == 0)
        assert code == 0 or ("'cpu_family': 'another'" in done.stderr and done.stderr.count("\n") == 1)


def test_fast_study_runs_the_six_arms_fixed_before_it_and_chooses_on_validation_only(tmp_path):
    """scripts/fast_study.sh (recipes/wmt-small-deen-fast.md): the six fast arms at seed 100, 20 minutes of training
    each with the cooldown, through the fast recipe with each arm's schedule, then `compare --validation-only`."""
    import subprocess

    root = tmp_path / "tree"
    _study_script(tmp_path, "fast_study.sh")
    (root / ".venv" / "bin" / "prunetrain").write_text(RECORDING_PRUNETRAIN)
    done = subprocess.run(["bash", "scripts/fast_study.sh"], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = (root / "calls.txt").read_text().splitlines()
    recipes = [c for c in calls if c.startswith("recipe ")]
    arms = ["fast-h36-f50-early", "fast-h36-f75-early", "fast-f50-early", "fast-h36-f50", "fast-h36-f75", "fast-f50"]
    assert [c.split("--output ")[1] for c in recipes] == [
        f"checkpoints/fast/{a}-cooldown-time20min-measure-s100" for a in arms]
    assert all(c.startswith("recipe wmt-small-deen-fast ") for c in recipes), recipes
    for c in recipes:
        for setting in ("train.seed=100", "train.cooldown=0.2", "train.max_flops=0", "train.max_train_minutes=20",
                        "eval.print_test=false", "train.precision=measure"):
            assert setting in c, (setting, c)
    early, f75_early, f50_early, default, f75, f50 = recipes
    # every arm states its whole schedule: the recipe's default (chosen by this selection) changes none of them
    for c in recipes:
        assert all(f"pruning.{key}=" in c for key in ("schedule_steps", "ffn_schedule_steps", "shrink_steps")), c
    for c in (early, f75_early):
        assert "pruning.schedule_steps={100: 0.25, 200: 0.5, 300: 0.75}" in c
        assert "pruning.shrink_steps=[200, 300]" in c
    assert "pruning.ffn_schedule_steps={100: 0.25, 200: 0.5}" in early
    assert "pruning.ffn_schedule_steps={100: 0.25, 200: 0.5, 300: 0.75}" in f75_early
    assert "pruning.schedule_steps={}" in f50_early and "pruning.shrink_steps=[200]" in f50_early
    assert "pruning.ffn_schedule_steps={100: 0.25, 200: 0.5}" in f50_early
    assert "pruning.ffn_schedule_steps={200: 0.25, 300: 0.5}" in default
    for c in (default, f75):
        assert "pruning.schedule_steps={200: 0.25, 300: 0.5, 400: 0.625, 500: 0.75}" in c
        assert "pruning.shrink_steps=[300, 500]" in c
    assert "pruning.ffn_schedule_steps={200: 0.25, 300: 0.5, 400: 0.75}" in f75
    assert "pruning.schedule_steps={}" in f50 and "pruning.shrink_steps=[300]" in f50
    names = [f"{a}-cooldown-time20min-measure" for a in arms]
    assert calls[-1] == ("compare " + " ".join(f"recipes/results/wmt-small-deen-fast/{n}-s100" for n in names)
                         + f" --names {','.join(names)} --validation-only --output checkpoints/fast/selection-s100")
    # every arm's settings are a valid recipe (the schedule checks run on load)
    from prunetrain.mt.config.recipe import load_recipe

    for c in recipes:
        sets = c.split(" --set ")[1:]
        load_recipe("wmt-small-deen-fast", [s.split(" --output")[0] for s in sets])


def test_the_served_fast_arm_is_the_fast_default_in_the_hardwares_layout(tmp_path):
    """payoff_study.sh fast-h36-f50-served: fast-h36-f50's whole schedule through the fast recipe, with every FFN width a
    multiple of 64 and one head count per stack; its settings are a valid recipe."""
    from prunetrain.mt.config.recipe import load_recipe

    run = _study_script(tmp_path, study="wmt-small-deen-fast-served")
    code, err, args, kept = run(["fast-h36-f50-served", "3"], {"STUDY": "fast-served", "COOLDOWN": "0.2"})
    assert code == 0, err
    assert args[0] == "recipe" and args[1] == "wmt-small-deen-fast", args
    assert args[-2:] == ["--output", "checkpoints/fast-served/fast-h36-f50-served-cooldown-s3"]
    assert kept == ["fast-h36-f50-served-cooldown-s3"]
    for setting in ("pruning.schedule_steps={200: 0.25, 300: 0.5, 400: 0.625, 500: 0.75}",
                    "pruning.ffn_schedule_steps={200: 0.25, 300: 0.5}", "pruning.shrink_steps=[300, 500]",
                    "pruning.ffn_multiple_of=64", "pruning.same_heads_per_stack=true", "train.seed=3",
                    "train.cooldown=0.2", "eval.print_test=false"):
        assert setting in args, (setting, args)
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    recipe = load_recipe("wmt-small-deen-fast", sets)
    assert (recipe.pruning.ffn_multiple_of, recipe.pruning.same_heads_per_stack) == (64, True)


def test_same_run_compares_steps_flops_layout_and_every_kept_translation(tmp_path):
    """scripts/same_run.py: a run trained again is the kept run only when its steps, FLOPs, heads, parameters, final
    layout and the translations of every split the kept run has are equal; each difference is named (no score)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "same_run.py"
    run, kept = tmp_path / "run", tmp_path / "kept"
    results = {"steps": 1800, "train_flops": 1.78e14, "heads_kept": 144, "parameters_final": 13369344,
               "final_scores": {"valid": {"bleu": 37.3}}, "train_minutes": 61.0}
    for directory, layout in ((run / "full", "prunetrain_layout.json"), (kept, "layout.json")):
        (directory / layout).parent.mkdir(parents=True, exist_ok=True)
        (directory / layout).write_text(json.dumps({"heads": [8, 8]}))
    for directory in (run, kept):
        (directory / "final_translations").mkdir(parents=True)
        for split in ("valid", "test"):
            (directory / "final_translations" / f"{split}.json").write_text(
                json.dumps({"bleu": 30.0, "hypotheses": ["A dog runs.", "Two men."]}))
    (run / "results.json").write_text(json.dumps(results))
    (kept / "results.json").write_text(json.dumps({**results, "train_minutes": 65.0}))  # timings differ

    def check():
        done = subprocess.run([sys.executable, str(script), str(run), str(kept)], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    code, out = check()
    assert code == 0 and "(steps, FLOPs, layout and 2 splits' translations equal)" in out, out
    (run / "results.json").write_text(json.dumps({**results, "steps": 1799}))
    (run / "full" / "prunetrain_layout.json").write_text(json.dumps({"heads": [8, 7]}))
    (run / "final_translations" / "test.json").write_text(json.dumps({"hypotheses": ["A dog runs.", "Two man."]}))
    (run / "final_translations" / "valid.json").unlink()
    code, out = check()
    assert code == 2 and out.count("\n") == 1, out
    for part in ("results.json 'steps' is 1799, the kept run's is 1800", "the final layout differs",
                 "test.json: 1 of 2 translations differ", f"{run}/final_translations/valid.json is missing"):
        assert part in out, out
    assert "30.0" not in out and "37.3" not in out
    (kept / "results.json").unlink()
    code, out = check()
    assert code == 2 and out == f"same_run.py: KEEP_DIR '{kept}' holds no results.json\n", out
