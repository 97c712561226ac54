"""Recipes, run records, amounts and masks that cannot be silently wrong (issue 25).

- Recipe YAML read strictly: duplicate keys and schedule steps, empty files, lists and scalars, text that is not
  UTF-8 and alias bombs are one line (the bomb never expanded); `1e-3` is a number.
- What `recipe --show` accepts, the run accepts: a 32-bit seed, an attention backend that runs here, sentences within
  the model's positions, memory estimated before a model is built, pruning points the run reaches.
- Run records that cannot lie: `--data-dir` is recorded as `data.dir`; `data_record.json` holds what was read; a
  resume with other data or of a finished run is refused.
- Amounts and masks: the count 1 beside fractions, cumulative amounts of mixed kinds that go back, bool or nested
  keep values, a soft mask folded twice by two commands, two pruning callbacks on one model.
- Exports never carry a pickle along, a failed copy is one line, and results with NaN are never written as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

import prunetrain as pt
from hostile import assert_one_line, run_main, save_tiny_translation_model, tree, write_small_data


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("recipe-input") / "model", multi30k_dir)


def recipe_file(tmp_path: Path, data: bytes | str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# recipe YAML
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, pattern", [
    ("", r"recipe: '.*r.yaml' is empty; a recipe is a mapping of sections"),
    ("# only a comment\n", r"is empty; a recipe is a mapping of sections"),
    ("- train\n- model\n", r"recipe: '.*r.yaml' holds a YAML list, not a mapping of recipe sections"),
    ("42\n", r"holds a YAML int, not a mapping of recipe sections"),
    (b"name: caf\xe9\n", r"recipe: '.*r.yaml' is not valid UTF-8 \(byte offset 9\)"),
    ("train:\n  epochs: 3\n  epochs: 4\n", r"holds the key 'epochs' twice \(line 2 and 3\); each key may appear once"),
    ("train:\n  epochs: 3\ntrain:\n  seed: 1\n", r"holds the key 'train' twice"),
    ("pruning:\n  schedule_steps: {400: 0.25, 400: 0.5}\n", r"holds the key 400 twice \(line 2\)"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n",
     r"holds an alias \(\*a\) — recipes use no anchors or aliases; write the value out at line 2"),
])
def test_a_recipe_file_yaml_cannot_silently_change_is_refused(monkeypatch, capsys, tmp_path, text, pattern):
    code, out, err = result = run_main(monkeypatch, capsys, "recipe", recipe_file(tmp_path, text), "--show")
    assert_one_line(result, pattern)
    assert len(err) < 400 and "x, x" not in err  # the alias bomb is never expanded into the message


def test_yaml_12_numbers_are_numbers(monkeypatch, capsys, tmp_path):
    path = recipe_file(tmp_path, "name: small\ntrain:\n  learning_rate: 5e-4\n  weight_decay: 1E-2\n")
    code, out, err = run_main(monkeypatch, capsys, "recipe", path, "--set", "train.max_grad_norm=2e0", "--show")
    assert code == 0, err
    assert "learning_rate: 0.0005" in out and "weight_decay: 0.01" in out and "max_grad_norm: 2.0" in out
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set",
                             "pruning.schedule_steps={400: 0.25, 400: 0.5}", "--show"),
                    r"--set pruning.schedule_steps is not a valid recipe: it holds the key 400 twice")


def test_a_string_value_keeps_what_was_typed(monkeypatch, capsys, tmp_path):
    weird = tmp_path / "data #1: de-en"
    weird.mkdir()
    code, out, err = run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", f"data.dir={weird}",
                              "--set", "description=a: b # c", "--show")
    assert code == 0, err
    assert f"dir: '{weird}'" in out and "description: 'a: b # c'" in out


# ---------------------------------------------------------------------------------------------------------------------
# what --show accepts, the run accepts
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, pattern", [
    ("train.seed=4294967296", r"train.seed: 4294967296 is not allowed; expected an integer in \[0, 4294967295\]"),
    ("model.attn_implementation=flash_attention_2",
     r"model.attn_implementation: 'flash_attention_2' needs the flash-attn package and a CUDA GPU"),
    ("data.max_length=513", r"data.max_length: 513 is more than the model's 512 positions"),
    ("model.layers=1000000000", r"model.layers: the model would have about 1.84e\+15 parameters and need at least "
                                r".* GiB for weights, gradients and Adam state, more than the .* GiB here"),
    ("train.learning_rate=" + "9" * 400, r"train.learning_rate: 999.* is too large for a number"),
])
def test_show_refuses_what_the_run_would_refuse(monkeypatch, capsys, tmp_path, override, pattern):
    if "flash" in override:
        from transformers.utils import is_flash_attn_2_available

        if is_flash_attn_2_available():
            pytest.skip("flash-attn runs on this machine")  # pragma: no cover
    start = time.perf_counter()
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", override, "--show"), pattern)
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", override, "--output",
                             tmp_path / "run"), pattern)
    assert not (tmp_path / "run").exists()
    assert time.perf_counter() - start < 120  # the billion layers are estimated, never built


def test_a_schedule_the_run_never_reaches_is_refused_by_show_and_run(monkeypatch, capsys, tmp_path, multi30k_dir):
    args = ["recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--set", "train.max_steps=4",
            "--set", "pruning.schedule_steps={}", "--set", "pruning.shrink_steps=[]", "--set", "eval.test_steps=[]",
            "--set", "pruning.schedule={1: 0.5}"]
    pattern = (r"pruning.schedule: epoch 1 \(step \d+\) is never reached: the run ends at step 4 \(\d+ training pairs, "
               r"\d+ steps per epoch, train.max_steps=4\)")
    assert_one_line(run_main(monkeypatch, capsys, *args, "--show"), pattern)
    assert_one_line(run_main(monkeypatch, capsys, *args, "--output", tmp_path / "run"), pattern)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------------------------------
# run records
# ---------------------------------------------------------------------------------------------------------------------
def test_data_dir_is_recorded_as_data_dir(monkeypatch, capsys, tmp_path, multi30k_dir):
    code, out, err = run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--data-dir", multi30k_dir, "--show")
    assert code == 0 and f"dir: {multi30k_dir}" in out, err
    other = tmp_path / "other"
    other.mkdir()
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", f"data.dir={other}",
                             "--data-dir", multi30k_dir, "--show"),
                    r"--data-dir: '.*multi30k' differs from the recipe's data.dir '.*other'; give the data directory "
                    r"once")


def test_a_resume_checks_the_data_it_trains_on(tmp_path, multi30k_dir):
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_dir import prepare_output_dir
    from prunetrain.mt.run.run_record import DATA_RECORD, data_record, with_data_dir

    recipe = with_data_dir(load_recipe("wmt-small-deen", ["data.train_limit=50"]), multi30k_dir)
    pairs = [read_parallel(multi30k_dir, split, limit=50) for split in ("train", "valid", "test")]
    out = tmp_path / "run"
    prepare_output_dir(out, recipe, resume=False, overwrite=False, data=data_record(recipe, pairs))
    stored = json.loads((out / DATA_RECORD).read_text())
    assert stored["dir"] == str(multi30k_dir.resolve()) and stored["splits"]["train"]["pairs"] == 50
    (out / "checkpoint-5").mkdir()
    before = tree(out)
    prepare_output_dir(out, recipe, resume=True, overwrite=False, data=data_record(recipe, pairs))  # same data
    changed = [pairs[0][:49] + [("Ein anderer Satz.", "Another sentence.")], pairs[1], pairs[2]]
    with pytest.raises(ValueError, match=r"--resume: the train data read now \(.*multi30k\) differs from what the run "
                                         r"in '.*run' started with \(the same number of pairs but other text, "
                                         r"recorded in data_record.json\)"):
        prepare_output_dir(out, recipe, resume=True, overwrite=False, data=data_record(recipe, changed))
    with pytest.raises(ValueError, match=r"the valid data .* \(50 pairs then, 49 now"):
        prepare_output_dir(out, recipe, resume=True, overwrite=False,
                           data=data_record(recipe, [pairs[0], pairs[1][:49], pairs[2]]))
    more = {"test_2017_flickr": read_parallel(multi30k_dir, "test_2017_flickr", limit=50)}  # a set added since
    with pytest.raises(ValueError, match=r"the test_2017_flickr data .* \(not read when the run started, recorded"):
        prepare_output_dir(out, recipe, resume=True, overwrite=False, data=data_record(recipe, [*pairs, more]))
    assert tree(out) == before  # the record is never rewritten


def test_resume_of_a_finished_run_is_refused_and_changes_nothing(tmp_path):
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_dir import mark_complete, prepare_output_dir

    recipe = load_recipe("wmt-small-deen")
    out = tmp_path / "run"
    prepare_output_dir(out, recipe, resume=False, overwrite=False)
    (out / "results.json").write_text(json.dumps({"train_minutes": 1.998}))
    mark_complete(out)
    before = tree(out)
    with pytest.raises(ValueError, match=r"--resume: '.*run' holds a finished run \(run_complete.json\); there is "
                                         r"nothing to resume and its results stay as written"):
        prepare_output_dir(out, recipe, resume=True, overwrite=False)
    assert tree(out) == before


@pytest.mark.slow
def test_a_finished_run_records_what_it_read_and_refuses_resume(smoke_recipe_run, tmp_path, multi30k_dir):
    from conftest import run_cli
    from prunetrain.mt.text.data import read_parallel
    from prunetrain.mt.run.run_record import data_record
    from prunetrain.mt.config.recipe import recipe_from_dict
    import yaml

    out, result = smoke_recipe_run
    assert result.returncode == 0, result.stderr[-3000:]
    recipe = recipe_from_dict(yaml.safe_load((out / "recipe.yaml").read_text()))
    assert recipe.data.dir == str(multi30k_dir)  # --data-dir, recorded
    assert json.loads((out / "results.json").read_text())["recipe"]["data"]["dir"] == str(multi30k_dir)
    limit = recipe.data.train_limit or None
    read = [read_parallel(multi30k_dir, "train", limit=limit), read_parallel(multi30k_dir, "valid"),
            read_parallel(multi30k_dir, recipe.data.test_split),
            {name: read_parallel(multi30k_dir, name) for name in recipe.eval.more_test_splits}]
    assert json.loads((out / "data_record.json").read_text()) == data_record(recipe, read)
    copy = Path(shutil.copytree(out, tmp_path / "finished"))
    before = tree(copy)
    resumed = run_cli("recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--output", copy, "--resume")
    assert resumed.returncode == 2 and len(resumed.stderr.strip().splitlines()) == 1, resumed.stderr[-2000:]
    assert "--resume: '" in resumed.stderr and "holds a finished run (run_complete.json); there is nothing to " \
                                                "resume" in resumed.stderr
    assert tree(copy) == before  # results.json, report.md, bench.json untouched


@pytest.mark.slow
def test_a_resumed_run_records_where_it_resumed_and_its_minutes_say_so(smoke_recipe_run, tmp_path, multi30k_dir):
    """An interrupted run (its last checkpoint and results gone) resumed with --resume ends at the same step; its
    wall minutes count only the resumed part, which results.json, the report and `prunetrain compare` say (the
    arm's whole-run minutes leave it out)."""
    from conftest import run_cli

    out, result = smoke_recipe_run
    assert result.returncode == 0, result.stderr[-3000:]
    first = json.loads((out / "results.json").read_text())
    assert first["resumed_from_step"] is None
    cut = Path(shutil.copytree(out, tmp_path / "cut"))
    steps = sorted(int(p.name.rsplit("-", 1)[1]) for p in cut.glob("checkpoint-*"))
    assert len(steps) >= 2, steps
    shutil.rmtree(cut / f"checkpoint-{steps[-1]}")
    for name in ("run_complete.json", "results.json", "report.md"):
        (cut / name).unlink()
    resumed = run_cli("recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--output", cut, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = json.loads((cut / "results.json").read_text())
    assert again["resumed_from_step"] == steps[-2] and again["steps"] == first["steps"]
    assert again["heads_kept"] == first["heads_kept"]
    # the training clock came through the resume: the same evaluation points, before and after it
    assert [r["step"] for r in again["bleu_over_training"]] == [r["step"] for r in first["bleu_over_training"]]
    assert f"resumed from the checkpoint at step {steps[-2]}: these minutes count only the resumed part" in \
        (cut / "report.md").read_text()
    compared = run_cli("compare", out, cut, "--names", "whole,resumed", "--output", tmp_path / "cmp",
                       "--bootstrap-samples", "50")
    assert compared.returncode == 0, compared.stderr[-3000:]
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    whole, part = data["arms"]
    assert whole["total_minutes"]["n"] == 1 and part["total_minutes"]["n"] == 0
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "(0 of 1 runs; resumed runs left out)" in markdown
    assert f"(resumed part, from step {steps[-2]})" in markdown


# ---------------------------------------------------------------------------------------------------------------------
# amounts and masks
# ---------------------------------------------------------------------------------------------------------------------
def test_the_count_1_beside_fractions_is_refused():
    from prunetrain import HeadPruningCallback

    with pytest.raises(ValueError, match=r"prune_steps \{2: 0.5, 4: 1\}: mixes fractions \(floats\) with the count 1, "
                                         r"which is one head, not all of them; write 1.0 for all heads"):
        HeadPruningCallback(at_epochs=[], prune_steps={2: 0.5, 4: 1})
    with pytest.raises(ValueError, match=r"prune/prune_steps: mixes fractions"):
        HeadPruningCallback(at_epochs=[], prune={1: 0.5}, prune_steps={400: 1})
    HeadPruningCallback(at_epochs=[], prune_steps={2: 0.5, 4: 1.0})  # all fractions
    HeadPruningCallback(at_epochs=[], prune_steps={2: 1, 4: 3})  # all counts


def _trainer(tmp_path, multi30k_dir, callbacks, model=None):
    from transformers import MarianMTModel, Seq2SeqTrainer, Seq2SeqTrainingArguments

    from prunetrain.mt.text.data import build_dataset, make_collator, marian_config, read_parallel, train_tokenizer

    pairs = read_parallel(multi30k_dir, "train", limit=64)
    tokenizer = train_tokenizer(pairs, vocab_size=300)
    torch.manual_seed(0)
    model = MarianMTModel(marian_config(tokenizer, d_model=16, ffn_dim=32, layers=1, heads=4))
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=16,
                                    save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True)
    batches = [make_collator(tokenizer, model)([build_dataset(pairs[:8], tokenizer)[i] for i in range(8)])]
    for callback in callbacks:
        callback.batches = batches
    return Seq2SeqTrainer(model=model, args=args, train_dataset=build_dataset(pairs, tokenizer),
                          data_collator=make_collator(tokenizer, model), processing_class=tokenizer,
                          callbacks=callbacks)


def test_mixed_amounts_that_go_back_are_refused_before_training(tmp_path, multi30k_dir):
    from prunetrain import HeadPruningCallback

    callback = HeadPruningCallback(at_epochs=[], prune_steps={1: 0.5, 2: 2})  # half of 12 heads, then 2 heads
    trainer = _trainer(tmp_path, multi30k_dir, [callback])
    with pytest.raises(ValueError, match=r"prune/prune_steps: 2 at step 2 is less than the 0.5 pruned at step 1"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_two_pruning_callbacks_on_one_model_warn(tmp_path, multi30k_dir):
    from prunetrain import HeadPruningCallback

    first = HeadPruningCallback(at_epochs=[], prune_steps={1: 2})
    second = HeadPruningCallback(at_epochs=[], prune_steps={2: 2})
    trainer = _trainer(tmp_path, multi30k_dir, [first, second])
    with pytest.warns(UserWarning, match=r"model: HeadPruningCallback attaches a HeadMask while another "
                                         r"HeadPruningCallback keeps one attached; both apply"):
        trainer.train()


@pytest.mark.parametrize("keep", [[True, False, True, True], [[1.0, 1.0], [0.0, 1.0]], torch.tensor([1, 0, 1, 1]).bool(),
                                  torch.ones(2, 2), {"a": 1}])
def test_bool_and_nested_keep_values_are_refused_everywhere(keep):
    from prunetrain.zoo import tiny_model

    model = tiny_model("bert")
    mask = pt.HeadMask.ones(model)
    site = pt.find_heads(model).sites[0].name
    pattern = rf"mask\['{site}'\]: keep values must be numbers in \[0, 1\], one per head in a flat list \(no bools\)"
    with pytest.raises(ValueError, match=pattern):
        mask[site] = keep
    data = mask.to_dict()
    data["sites"][site] = keep.tolist() if torch.is_tensor(keep) else keep
    with pytest.raises(ValueError, match=pattern):
        pt.HeadMask.from_dict(data, model)


def test_a_mask_file_with_bools_is_one_line(monkeypatch, capsys, model_dir, tmp_path):
    net = pt.load_pruned(model_dir)
    data = pt.HeadMask.ones(net).to_dict()
    site = next(iter(data["sites"]))
    data["sites"][site] = [True, False]
    (tmp_path / "mask.json").write_text(json.dumps(data))
    assert_one_line(run_main(monkeypatch, capsys, "shrink", model_dir, "--mask", tmp_path / "mask.json", "--output",
                             tmp_path / "out"), r"mask\['.*'\]: keep values must be numbers .* \(no bools\), got "
                                                r"\[True, False\]")
    assert not (tmp_path / "out").exists()


def test_a_soft_mask_is_never_folded_twice_by_two_commands(monkeypatch, capsys, model_dir, tmp_path):
    net = pt.load_pruned(model_dir)
    soft = pt.HeadMask.ones(net)
    soft[pt.find_heads(net).sites[0].name] = [0.5, 0.25]  # scales only: the layout stays the same
    soft.to_json(tmp_path / "soft.json")
    code, _, err = run_main(monkeypatch, capsys, "shrink", model_dir, "--mask", tmp_path / "soft.json", "--output",
                            tmp_path / "once")
    assert code == 0, err
    before = tree(tmp_path / "once")
    assert_one_line(run_main(monkeypatch, capsys, "shrink", tmp_path / "once", "--mask", tmp_path / "soft.json",
                             "--output", tmp_path / "twice"),
                    r"mask: this model was already shrunk with these soft keep values, which are now folded into its "
                    r"output projections; shrinking again would scale those heads a second time")
    assert tree(tmp_path / "once") == before and not (tmp_path / "twice").exists()


# ---------------------------------------------------------------------------------------------------------------------
# exports and results
# ---------------------------------------------------------------------------------------------------------------------
def test_an_export_never_carries_a_pickle_along(monkeypatch, capsys, model_dir, tmp_path):
    source = Path(shutil.copytree(model_dir, tmp_path / "source"))
    (source / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    (source / "optimizer.pt").write_bytes(b"\x80\x04pickle")
    code, out, err = run_main(monkeypatch, capsys, "export", source, tmp_path / "padded", "--format", "padded")
    assert code == 0, err
    files = json.loads(out)["files"]
    assert "tokenizer.json" in files and not any(f.endswith((".bin", ".pt")) for f in files), files


def test_a_source_tree_that_cannot_be_copied_is_one_short_line(monkeypatch, capsys, model_dir, tmp_path):
    source = Path(shutil.copytree(model_dir, tmp_path / "source"))
    (source / "notes").mkdir()
    for i in range(20):
        os.mkfifo(source / "notes" / f"pipe{i}")
    code, _, err = result = run_main(monkeypatch, capsys, "export", source, tmp_path / "padded", "--format", "padded")
    assert_one_line(result, r"source: '.*notes' could not be copied into the export \(.*pipe\d+.*named pipe")
    assert len(err) < 500 and not (tmp_path / "padded").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


@pytest.mark.parametrize("content, pattern", [
    ("{not json", r"run: '.*a/results.json' is not valid JSON \(Expecting property name"),
    (json.dumps({"bleu_over_training": "many"}), r"run: '.*a/results.json' field 'bleu_over_training' is not a list "
                                                 r"of records"),
])
def test_compare_names_a_damaged_results_file(monkeypatch, capsys, tmp_path, content, pattern):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(content)
    assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", "--output",
                             tmp_path / "out"), pattern)
    assert_one_line(run_main(monkeypatch, capsys, "compare", tmp_path / "a", tmp_path / "b", "--output",
                             tmp_path / "a" / "cmp"), r"--output: '.*cmp' lies inside run '.*a'")
    assert not (tmp_path / "out").exists() and not (tmp_path / "a" / "cmp").exists()


def test_results_with_nan_are_never_written_as_json():
    from prunetrain.utils.files import dumps_strict

    with pytest.raises(ValueError, match=r"importance: scores\[1\]\[0\] is not a finite number \(NaN or infinite\); "
                                         r"the result is not written"):
        dumps_strict({"scores": [[0.5], [float("nan")]]}, "importance")
    assert json.loads(dumps_strict({"a": [1.5]}, "x")) == {"a": [1.5]}


# ---------------------------------------------------------------------------------------------------------------------
# issue 37: values checked before the run directory is touched, FLOP budgets the schedule needs, the tokenizer a
# resume trains with
# ---------------------------------------------------------------------------------------------------------------------
def _finished_run(out: Path, recipe) -> dict:
    """A finished run directory of `recipe` (what --overwrite would replace); returns its tree."""
    from prunetrain.mt.run.run_dir import mark_complete, prepare_output_dir

    prepare_output_dir(out, recipe, resume=False, overwrite=False)
    (out / "results.json").write_text(json.dumps({"train_minutes": 1.5}))
    mark_complete(out)
    return tree(out)


def _layout_file(tmp_path: Path, heads: list[int]) -> Path:
    """A prunetrain_layout.json of the smoke recipe's model whose first site keeps `heads`."""
    from prunetrain.mt.text.data import marian_config
    from transformers import MarianMTModel

    layout = pt.find_heads(MarianMTModel(marian_config(300, d_model=32, ffn_dim=8, layers=2, heads=4)))
    record = layout.to_dict()
    record["sites"][0] = {**record["sites"][0], "heads": heads, "num_heads": len(heads)}
    path = tmp_path / "layout" / "prunetrain_layout.json"
    path.parent.mkdir()
    path.write_text(json.dumps(record))
    return path


def test_initial_architecture_values_are_refused_before_a_finished_run_is_touched(monkeypatch, capsys, tmp_path,
                                                                                  multi30k_dir):
    from prunetrain.mt.config.recipe import load_recipe

    out = tmp_path / "finished"
    before = _finished_run(out, load_recipe("wmt-small-deen"))
    bad_layout = _layout_file(tmp_path, [0, 7])
    for override, pattern in [
        ("pruning.init_layout=/nonexistent.json", r"pruning.init_layout: '/nonexistent.json' holds no "
                                                  r"prunetrain_layout.json"),
        (f"pruning.init_layout={bad_layout}", r"pruning.init_layout: .* does not fit the recipe's model .*site "
                                              r"'model.encoder.layers.0.self_attn' keeps .*7"),
        ("pruning.init_heads=1000", r"pruning.init_heads: 1000 is more than the model's 24 heads"),
        ("pruning.init_heads=3", r"pruning.init_heads: 3 cannot be kept with pruning.min_heads_per_layer=1"),
    ]:
        base = ["recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--set", override]
        assert_one_line(run_main(monkeypatch, capsys, *base, "--show"), pattern)
        assert_one_line(run_main(monkeypatch, capsys, *base, "--output", out, "--overwrite"), pattern)
        assert tree(out) == before


def test_a_flop_budget_the_schedule_cannot_use_is_refused_before_the_run_directory(monkeypatch, capsys, tmp_path,
                                                                                   multi30k_dir):
    from prunetrain.mt.text.data import read_parallel, train_tokenizer
    from prunetrain.mt.run.preflight import step_flops_floor
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_record import with_data_dir
    from prunetrain.mt.run.runner import build_model
    from prunetrain.cli.recipes import _smoke_overrides

    recipe = with_data_dir(load_recipe("wmt-small-deen", _smoke_overrides("wmt-small-deen")), multi30k_dir)
    pairs = read_parallel(multi30k_dir, "train", limit=recipe.data.train_limit)
    tokenizer = train_tokenizer(pairs, vocab_size=recipe.data.vocab_size)
    full, _, _ = step_flops_floor(recipe, build_model(recipe, tokenizer), tokenizer, pairs)
    out = tmp_path / "finished"
    before = _finished_run(out, load_recipe("wmt-small-deen"))
    base = ["recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--output", out, "--overwrite"]
    assert_one_line(run_main(monkeypatch, capsys, *base, "--set", "train.max_flops=1"),
                    r"train.max_flops: 1 is spent by the first training step \(at least .* FLOPs with this model and "
                    r"data\); the run would stop after one step")
    assert_one_line(run_main(monkeypatch, capsys, *base, "--set", f"train.max_flops={3 * full}"),
                    r"train.max_flops: .* is spent before pruning.schedule_steps step 10: the first 9 steps alone "
                    r"need at least .* training FLOPs")
    assert tree(out) == before


@pytest.mark.parametrize("overrides, pattern", [
    (["train.max_flops=0.5"], r"train.max_flops: 0.5 is not allowed; a FLOP budget is a count of training FLOPs"),
    (["train.max_flops=10", "train.cooldown=1e-320"],
     r"train.cooldown: 1e-320 of train.max_flops=10.0 is less than one FLOP"),
])
def test_a_cooldown_or_budget_too_small_for_floats_is_refused_up_front(monkeypatch, capsys, overrides, pattern):
    args = [arg for override in overrides for arg in ("--set", override)]
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", *args, "--show"), pattern)


def test_the_cooldown_never_divides_by_an_underflowed_product():
    from types import SimpleNamespace

    from prunetrain.training.cooldown import FlopCooldownCallback, cooldown_factor

    assert cooldown_factor(0.0, 1e-300, 1e-30) == 1.0  # share · budget is 0.0 in floats
    assert cooldown_factor(1e-300, 1e-300, 1e-30) == 0.0
    assert cooldown_factor(90.0, 100.0, 0.2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"share: 1e-30 × the clock's max_flops 1e-300 is below the smallest float"):
        FlopCooldownCallback(SimpleNamespace(max_flops=1e-300), 1e-30)


def test_flop_points_one_step_crosses_together_are_each_reported():
    from types import SimpleNamespace

    from prunetrain.mt.run.preflight import merged_flop_points
    from prunetrain.mt.config.recipe import load_recipe

    recipe = load_recipe("wmt-small-deen", ["eval.test_flops=[0.25, 0.26, 0.5, 0.9]", "train.max_flops=100"])
    clock = SimpleNamespace(flops=60, records=[{"kind": "flops", "flops_target": 26.0, "flops": 27, "step": 3},
                                               {"kind": "flops", "flops_target": 50.0, "flops": 52, "step": 5}])
    assert merged_flop_points(recipe, clock) == [{"share": 0.25, "step": 3}]  # 0.9 was never reached


def test_the_report_says_a_flop_budget_defines_the_run():
    from prunetrain.mt.run.report import _points_lines

    cap = {"max_minutes": 60, "fired": False, "planned_steps": 5448}
    by_flops = _points_lines({"time_cap": cap, "max_flops": 1.78e14, "flop_budget_reached_at_step": 2250,
                              "steps": 2250})
    assert by_flops[0].startswith("The run is defined by its FLOP budget (train.max_flops=1.78e+14 training FLOPs, "
                                  "reached at step 2250)")
    assert "5448" not in by_flops[0]
    by_steps = _points_lines({"time_cap": cap, "max_flops": None})
    assert by_steps[0].startswith("The run is defined by its 5448 steps")
    merged = _points_lines({"time_cap": cap, "max_flops": 100, "test_flops_merged": [{"share": 0.25, "step": 3}]})
    assert "eval.test_flops 0.25 was crossed by step 3 together with a later point" in merged[1]


def test_the_time_cap_names_the_flop_budget_as_the_end(caplog):
    from types import SimpleNamespace

    from prunetrain.training.time_cap import TimeCapCallback

    clock = SimpleNamespace(flops=0, max_flops=1000)
    cap = TimeCapCallback(60.0, measure_steps=2, budget=clock)
    state = SimpleNamespace(global_step=0, max_steps=5448, epoch=0.0)
    cap.on_train_begin(None, state, None)
    cap.start -= 2.0  # two steps in two seconds: the cap would stop near step 3600
    for step in (1, 2):
        state.global_step, clock.flops = step, 10 * step
        with caplog.at_level("WARNING", logger="prunetrain"):
            cap.on_step_end(None, state, SimpleNamespace(should_training_stop=False))
    assert cap.budget_end_step == 100 and cap.expected_end_step == 100
    assert "FLOP budget of 1000 training FLOPs is expected to end the run near step 100" in caplog.text
    assert "expected to stop near step" not in caplog.text


def test_a_resume_refuses_a_replaced_tokenizer(monkeypatch, capsys, tmp_path, multi30k_dir):
    from prunetrain.cli.recipes import _smoke_overrides
    from prunetrain.mt.text.data import read_parallel, train_tokenizer
    from prunetrain.mt.run.preflight import write_tokenizer_record
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_dir import prepare_output_dir
    from prunetrain.mt.evaluation.eval_sets import load_test_sets
    from prunetrain.mt.run.run_record import data_record, with_data_dir

    recipe = with_data_dir(load_recipe("wmt-small-deen", _smoke_overrides("wmt-small-deen")), multi30k_dir)
    limit = recipe.data.train_limit
    pairs = [read_parallel(multi30k_dir, "train", limit=limit), read_parallel(multi30k_dir, "valid"),
             read_parallel(multi30k_dir, "test"), load_test_sets(recipe)]
    out = tmp_path / "run"
    prepare_output_dir(out, recipe, resume=False, overwrite=False, data=data_record(recipe, pairs))
    train_tokenizer(pairs[0], vocab_size=recipe.data.vocab_size, path=out / "tokenizer")
    write_tokenizer_record(out)
    (out / "checkpoint-5").mkdir()
    other = train_tokenizer(pairs[0][::-1][:600], vocab_size=recipe.data.vocab_size)  # same size, other merges
    assert len(other) == recipe.data.vocab_size
    other.save_pretrained(out / "tokenizer")
    before = tree(out)
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir,
                             "--output", out, "--resume"),
                    r"--resume: the run's tokenizer changed since it started: '.*tokenizer.json' differs \(sha256 "
                    r"recorded in tokenizer_record.json\)")
    assert tree(out) == before


# ---------------------------------------------------------------------------------------------------------------------
# validation and more test sets (eval.valid, eval.valid_limit, eval.more_test_splits)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, pattern", [
    ("eval.valid=1", r"eval.valid: 1 is not a boolean \(true/false\)\.$"),
    ("eval.print_test=1", r"eval.print_test: 1 is not a boolean \(true/false\)\.$"),
    ("eval.valid_limit=-1", r"eval.valid_limit: -1 is not allowed"),
    ("eval.more_test_splits=[test_2017_flickr, test_2017_flickr]",
     r"eval.more_test_splits: 'test_2017_flickr' is named more than once; give each split once\.$"),
    ("eval.more_test_splits=[../x]", r"eval.more_test_splits: '../x' is not a split name"),
    ("eval.more_test_splits=[valid]", r"eval.more_test_splits: 'valid' is the training, validation or main test split"),
    ("data.test_split=valid", r"data.test_split: 'valid' is the validation split, which eval.valid scores apart"),
])
def test_bad_evaluation_sets_are_refused_in_one_line(monkeypatch, capsys, tmp_path, override, pattern):
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", override, "--show"), pattern)
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--set", override, "--output",
                             tmp_path / "run"), pattern)
    assert not (tmp_path / "run").exists()


def test_a_missing_test_set_is_refused_before_the_run_directory_is_touched(monkeypatch, capsys, tmp_path,
                                                                           multi30k_dir):
    data = write_small_data(tmp_path / "data", multi30k_dir)
    for lang in ("de", "en"):
        (data / f"test_2017_mscoco.{lang}").unlink()
    pattern = (r"eval.more_test_splits: 'test_2017_mscoco' cannot be read: read_parallel: .*test_2017_mscoco.de does "
               r"not exist; splits with both .de and .en files in .*: test, test_2017_flickr, train, valid\.$")
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", "--data-dir", data,
                             "--output", tmp_path / "run"), pattern)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------------------------------
# records are checked, not trusted: the precision a checkpoint was trained in
# ---------------------------------------------------------------------------------------------------------------------
def test_a_measured_run_without_its_precision_record_is_not_resumed(tmp_path):
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_settings import measured_settings

    recipe = load_recipe("wmt-small-deen", ["train.precision=measure"])
    (tmp_path / "checkpoint-8").mkdir()
    with pytest.raises(ValueError, match=r"^--resume: '.*precision_record.json' is missing, but the run has "
                                         r"checkpoints: it measured its precision and attention when it started"):
        measured_settings(recipe, None, None, tmp_path, print)


def test_a_checkpoint_is_resumed_only_in_the_settings_it_was_trained_in(tmp_path):
    from prunetrain.mt.run.run_settings import SETTINGS_IN_CHECKPOINT, check_checkpoint_settings

    checkpoint = tmp_path / "checkpoint-8"
    checkpoint.mkdir()
    check_checkpoint_settings(checkpoint, {"precision": "bf16", "attention": "sdpa"}, "x")  # no record: nothing to say
    (checkpoint / SETTINGS_IN_CHECKPOINT).write_text(json.dumps({"precision": "fp32", "attention": "sdpa"}))
    check_checkpoint_settings(checkpoint, {"precision": "fp32", "attention": "sdpa"}, "x")
    with pytest.raises(ValueError, match=r"^--resume: checkpoint-8 was trained with precision 'fp32', but the run "
                                         r"would go on with 'bf16' \(chosen by precision_record.json\)"):
        check_checkpoint_settings(checkpoint, {"precision": "bf16", "attention": "sdpa"}, "precision_record.json")


@pytest.mark.slow
def test_a_resume_refuses_a_checkpoint_trained_in_another_precision(smoke_recipe_run, tmp_path, multi30k_dir):
    """Every checkpoint of a run records the precision and attention it was trained in; a resume that would go on
    in another one (its record edited, another machine's `auto`) is refused in one line and changes nothing."""
    from conftest import run_cli
    from prunetrain.mt.run.run_settings import SETTINGS_IN_CHECKPOINT

    out, result = smoke_recipe_run
    assert result.returncode == 0, result.stderr[-3000:]
    cut = Path(shutil.copytree(out, tmp_path / "cut"))
    steps = sorted(int(p.name.rsplit("-", 1)[1]) for p in cut.glob("checkpoint-*"))
    records = [json.loads((cut / f"checkpoint-{s}" / SETTINGS_IN_CHECKPOINT).read_text()) for s in steps]
    assert len({json.dumps(r) for r in records}) == 1 and records[0]["precision"] in ("bf16", "fp32")
    for name in ("run_complete.json", "results.json", "report.md"):
        (cut / name).unlink()
    other = "fp32" if records[0]["precision"] == "bf16" else "bf16"
    (cut / f"checkpoint-{steps[-1]}" / SETTINGS_IN_CHECKPOINT).write_text(
        json.dumps({**records[0], "precision": other}))
    before = tree(cut)
    resumed = run_cli("recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir, "--output", cut, "--resume")
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert resumed.stderr.strip().splitlines()[-1].startswith(
        f"prunetrain: error: --resume: checkpoint-{steps[-1]} was trained with precision '{other}', but the run would "
        f"go on with '{records[0]['precision']}'")
    assert tree(cut) == before
