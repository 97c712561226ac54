"""Nothing lost by construction (issue 63): a directory is prunetrain's only by the marker prunetrain writes into it
(`.prunetrain-output.json`: kind and version), never by the names of its files; `--overwrite` of anything else is
refused in one line; a recipe run `--overwrite` replaces is checked (starting model, teacher: loadable and finite)
before it is touched and kept whole until the new run is complete; `scripts/keep_run.sh` never replaces another
run's kept results; a save killed with SIGKILL at any moment leaves the old output or the new one, whole.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import prunetrain as pt
from hostile import REPO, assert_one_line, run_main, save_tiny_translation_model, tree
from prunetrain.export import export
from prunetrain.utils import output_paths as op

MARKER = op.MARKER_FILE


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("markers") / "model", multi30k_dir)


def users_directory(path: Path) -> Path:
    """A directory of a user's own files that happens to hold a `recipe.yaml` (and a `config.json`)."""
    path.mkdir()
    (path / "recipe.yaml").write_text("my: notes\n")
    (path / "config.json").write_text("{}")
    (path / "thesis.tex").write_text("years of work")
    return path


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()
                  if any(f".{kind}-" in p.name for kind in ("staging", "replaced", "removing", "previous")))


# ---------------------------------------------------------------------------------------------------------------------
# ownership by marker
# ---------------------------------------------------------------------------------------------------------------------
def test_every_directory_prunetrain_writes_is_marked_with_its_kind(tmp_path, model_dir):
    marker = op.read_marker(model_dir)  # save_translation_model
    assert marker["kind"] == "model" and marker["version"] == op.MARKER_VERSION
    assert set(marker["entries"]) == {p.name for p in model_dir.iterdir()} - {MARKER}
    net = pt.load_pruned(model_dir)
    assert op.read_marker(pt.save_pruned(net, tmp_path / "saved"))["kind"] == "model"
    exported = export(model_dir, tmp_path / "exported", "padded")
    marker = op.read_marker(tmp_path / "exported")
    assert marker["kind"] == "export" and marker["format"] == "padded"
    assert sorted(marker["entries"]) == sorted(set(exported["files"]) - {MARKER})
    assert MARKER not in (marker["entries"])


def test_reported_overwrite_of_a_users_directory_holding_recipe_yaml_is_refused(monkeypatch, capsys, tmp_path,
                                                                                model_dir, multi30k_dir):
    """export --overwrite, shrink --overwrite, recipe --overwrite and export(..., overwrite=True) deleted a directory
    of the user's files whenever it held a file named recipe.yaml."""
    mine = users_directory(tmp_path / "mine")
    before = tree(mine)
    net = pt.load_pruned(model_dir)
    mask = pt.HeadMask.ones(net)
    mask.set(pt.find_heads(net).sites[0].name, 0, 0.0)
    mask.to_json(tmp_path / "mask.json")
    no_marker = r"'.*mine' is not empty and carries no prunetrain marker \(.prunetrain-output.json\)"
    assert_one_line(run_main(monkeypatch, capsys, "export", model_dir, mine, "--format", "padded", "--overwrite"),
                    no_marker + r".*--overwrite replaces only directories prunetrain marked")
    assert_one_line(run_main(monkeypatch, capsys, "shrink", model_dir, "--mask", tmp_path / "mask.json", "--output",
                             mine, "--overwrite"), no_marker)
    assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", "--data-dir", multi30k_dir,
                             "--output", mine, "--overwrite"),
                    r"--output: '.*mine' is not empty and holds no prunetrain run \(no .prunetrain-output.json")
    with pytest.raises(ValueError, match=no_marker + r".*overwrite=True"):
        export(model_dir, mine, "padded", overwrite=True)
    with pytest.raises(ValueError, match=no_marker):
        pt.save_pruned(net, mine, overwrite=True)
    assert tree(mine) == before


def test_a_marker_is_needed_a_listed_entry_is_not_enough_and_kinds_stay_apart(tmp_path, model_dir):
    net = pt.load_pruned(model_dir)
    saved = pt.save_pruned(net, tmp_path / "saved")
    assert pt.save_pruned(net, saved, overwrite=True) == saved  # marked: replaced
    (saved / "notes.txt").write_text("mine")  # the user's file put into it since: not replaced
    with pytest.raises(ValueError, match=r"holds 'notes.txt', which is not part of the model prunetrain wrote"):
        pt.save_pruned(net, saved, overwrite=True)
    (saved / "notes.txt").unlink()
    (saved / MARKER).write_text("{not json")  # a damaged (or forged-by-accident) marker is no marker
    with pytest.raises(ValueError, match=r"carries no prunetrain marker"):
        pt.save_pruned(net, saved, overwrite=True)
    run = tmp_path / "run"  # a recipe run prunetrain marked is not replaced by a model save or an export
    run.mkdir()
    (run / "recipe.yaml").write_text("name: x\n")
    op.write_marker(run, "recipe-run", list_entries=False)
    before = tree(run)
    with pytest.raises(ValueError, match=r"holds a recipe-run prunetrain wrote, which overwrite=True here does not "
                                         r"replace \(only a model or export\)"):
        pt.save_pruned(net, run, overwrite=True)
    with pytest.raises(ValueError, match=r"holds a recipe-run prunetrain wrote"):
        export(model_dir, run, "padded", overwrite=True)
    assert tree(run) == before


# ---------------------------------------------------------------------------------------------------------------------
# recipe --overwrite of a finished run: checked first, the old run kept until the new one is complete
# ---------------------------------------------------------------------------------------------------------------------
COMPRESS = "wmt-small-deen-compress"


def _compress_recipe(*extra):
    from prunetrain.cli.recipes import _smoke_overrides
    from prunetrain.mt.config.recipe import load_recipe

    return load_recipe(COMPRESS, [o for o in _smoke_overrides(COMPRESS) if not o.startswith("model.init_from")]
                       + list(extra))


@pytest.fixture(scope="module")
def trained_models(tmp_path_factory, multi30k_dir):
    """Models of the compress recipe's smoke size with one tokenizer: good, NaN in one weight, one tensor missing,
    and an unfinished run directory whose full/ is the good model."""
    from safetensors.torch import load_file, save_file

    from prunetrain.mt.evaluation.translation import save_translation_model
    from prunetrain.mt.run.inputs import build_model
    from prunetrain.mt.text.data import read_parallel, train_tokenizer

    root = tmp_path_factory.mktemp("trained")
    recipe = _compress_recipe("model.init_from=x")
    tokenizer = train_tokenizer(read_parallel(multi30k_dir, "train", limit=300), vocab_size=300)
    torch.manual_seed(0)
    good = save_translation_model(build_model(recipe, tokenizer), tokenizer, root / "good")
    nan_model = build_model(recipe, tokenizer)
    with torch.no_grad():
        nan_model.model.encoder.layers[0].fc1.weight[0, 0] = float("nan")
    nan = save_translation_model(nan_model, tokenizer, root / "nan")
    missing = Path(shutil.copytree(good, root / "missing"))
    weights = load_file(missing / "model.safetensors")
    dropped = next(name for name in sorted(weights) if "fc1.weight" in name)
    save_file({k: v for k, v in weights.items() if k != dropped}, missing / "model.safetensors",
              metadata={"format": "pt"})
    unfinished = root / "unfinished"
    unfinished.mkdir()
    op.write_marker(unfinished, "recipe-run", list_entries=False)
    (unfinished / "recipe.yaml").write_text("name: x\n")
    shutil.copytree(good, unfinished / "full")
    return {"good": good, "nan": nan, "missing": missing, "unfinished": unfinished}


def _finished_run(path: Path, recipe) -> Path:
    from prunetrain.mt.run.run_dir import mark_complete, prepare_output_dir

    prepare_output_dir(path, recipe, resume=False, overwrite=False, progress=lambda line: None)
    (path / "results.json").write_text(json.dumps({"finished": "weeks of training"}))
    mark_complete(path)
    return path


@pytest.mark.parametrize("case", ["init_from-nan", "teacher-nan", "init_from-missing-tensor", "init_from-unfinished"])
def test_recipe_overwrite_of_a_finished_run_refuses_damaged_weights_before_touching_it(
        monkeypatch, capsys, tmp_path, trained_models, multi30k_dir, case):
    """The reported case: the finished run was deleted, then the starting model or teacher was refused."""
    models = trained_models
    start, teacher, pattern = {
        "init_from-nan": (models["nan"], None, r"model.init_from: '.*nan' holds NaN or infinite values in tensor"),
        "teacher-nan": (models["good"], models["nan"], r"distill.teacher: '.*nan' holds NaN or infinite values"),
        "init_from-missing-tensor": (models["missing"], None, (r"model.init_from: '.*missing' does not fit its "
                                                              r"recorded layout \(missing keys")),
        "init_from-unfinished": (models["unfinished"], None, (r"model.init_from: '.*unfinished' is an unfinished "
                                                              r"run \(no run_complete.json\)")),
    }[case]
    finished = _finished_run(tmp_path / "finished", _compress_recipe(f"model.init_from={models['good']}"))
    before = tree(finished)
    sets = ["--set", f"model.init_from={start}"] + (["--set", f"distill.teacher={teacher}"] if teacher else [])
    code, out, err = run_main(monkeypatch, capsys, "recipe", COMPRESS, "--smoke", *sets, "--data-dir", multi30k_dir,
                              "--output", finished, "--overwrite")
    assert "kept whole" not in err, err[-2000:]  # refused before the old run was even moved aside
    assert_one_line((code, out, "\n".join(line for line in err.splitlines() if "error" in line)), pattern)
    assert tree(finished) == before and leftovers(tmp_path) == []


def test_a_replaced_run_is_kept_until_the_new_one_completes(tmp_path):
    """The new run fails after its directory was prepared: the old run is put back whole; once a new run
    completes, the old one is gone."""
    from prunetrain.mt.run.run_dir import mark_complete, prepare_output_dir, replaced_run_kept

    recipe = _compress_recipe("model.init_from=x")
    finished = _finished_run(tmp_path / "run", recipe)
    before = tree(finished)
    lines = []
    with pytest.raises(RuntimeError, match="diverged"), replaced_run_kept(finished, lines.append):
        prepare_output_dir(finished, recipe, resume=False, overwrite=True, progress=lines.append)
        assert not (finished / "results.json").exists() and len(leftovers(tmp_path)) == 1
        raise RuntimeError("diverged")
    assert tree(finished) == before and leftovers(tmp_path) == []
    assert "is back in" in lines[-1]
    with replaced_run_kept(finished, lines.append):
        prepare_output_dir(finished, recipe, resume=False, overwrite=True, progress=lines.append)
        (finished / "results.json").write_text("{}")
        mark_complete(finished)
    assert json.loads((finished / "results.json").read_text()) == {} and leftovers(tmp_path) == []


KILLED_OVERWRITE = """
import os, sys
sys.path.insert(0, sys.argv[1])
from prunetrain.mt.config.recipe import load_recipe
from prunetrain.mt.run.run_dir import prepare_output_dir
recipe = load_recipe("wmt-small-deen", [])
prepare_output_dir(sys.argv[2], recipe, resume=False, overwrite=True, progress=lambda line: None)
open(os.path.join(sys.argv[2], "checkpoint-1"), "w").write("half a run")
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_run_overwrite_killed_with_sigkill_gets_the_old_run_back_at_the_next_start(tmp_path):
    from prunetrain.mt.config.recipe import load_recipe
    from prunetrain.mt.run.run_dir import prepare_output_dir

    recipe = load_recipe("wmt-small-deen", [])
    finished = _finished_run(tmp_path / "run", recipe)
    before = tree(finished)
    child = subprocess.Popen([sys.executable, "-c", KILLED_OVERWRITE, str(REPO), str(finished)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()
    child.send_signal(signal.SIGKILL)
    child.communicate()
    assert (finished / "checkpoint-1").exists() and len(leftovers(tmp_path)) == 1  # the old run aside, whole
    lines = []
    with pytest.raises(ValueError, match=r"already holds a finished run"):  # a plain re-run: put back, then refused
        prepare_output_dir(finished, recipe, resume=False, overwrite=False, progress=lines.append)
    assert tree(finished) == before and leftovers(tmp_path) == []
    assert "a replacement that did not finish was stopped" in lines[0]


# ---------------------------------------------------------------------------------------------------------------------
# kill -9 at random moments: the old output or the new one, whole
# ---------------------------------------------------------------------------------------------------------------------
SAVE_LOOP = """
import os, random, signal, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
import prunetrain as pt
dest, sources = sys.argv[2], sys.argv[3:5]
models = [pt.load_pruned(source) for source in sources]
rng = random.Random(int(sys.argv[5]))
print("ready", flush=True)
for line in sys.stdin:  # one kill per line: a forked writer saving over and over, killed at a random moment
    pid = os.fork()
    if pid == 0:
        k = 0
        while True:
            pt.save_pruned(models[k % 2], dest, overwrite=True)
            k += 1
    time.sleep(rng.uniform(0.0, 0.25))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("killed", flush=True)
"""


def test_save_pruned_killed_with_sigkill_at_random_moments_leaves_a_whole_output(tmp_path, model_dir):
    """A writer replacing a model directory over and over (`save_pruned(..., overwrite=True)`, two models in turn)
    is killed with SIGKILL at seeded random moments: the destination is one of the two models, byte for byte, or
    (killed between the swap's two renames) absent with the old one whole beside it — which the next writer puts
    back when it takes the lock. Never a mix, never a part."""
    net = pt.load_pruned(model_dir)
    first = pt.save_pruned(net, tmp_path / "first")
    mask = pt.HeadMask.ones(net)
    mask.set(pt.find_heads(net).sites[0].name, 0, 0.0)
    pt.shrink(net, mask)
    second = pt.save_pruned(net, tmp_path / "second")
    versions = [tree(first), tree(second)]
    assert versions[0] != versions[1]
    work = tmp_path / "work"
    work.mkdir()
    dest = work / "model"
    shutil.copytree(first, dest)
    child = subprocess.Popen([sys.executable, "-c", SAVE_LOOP, str(REPO), str(dest), str(first), str(second), "63"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        for case in range(8):
            child.stdin.write("kill\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "killed", child.stderr.read()
            if dest.exists():
                assert tree(dest) in versions, (case, sorted(tree(dest)))
            else:  # between the two renames: the old one whole, set aside
                kept = [p / "old" for p in work.iterdir() if p.name.startswith(".model.replaced-")]
                assert len(kept) == 1 and tree(kept[0]) in versions, case
            with op.output_lock(dest, flag="path"):  # the next writer repairs what the kill left
                assert tree(dest) in versions, case
            assert sorted(p.name for p in work.iterdir()) == ["model"], (case, list(work.iterdir()))
    finally:
        child.stdin.close()
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()


def test_the_next_writer_puts_back_an_output_set_aside_by_a_swap_that_never_happened(tmp_path, model_dir):
    """A SIGKILL between the two renames of a swap leaves the destination absent and the old directory whole in
    `.NAME.replaced-*/old`; the next writer of NAME puts it back (and removes staging and half-removed leftovers)."""
    dest = Path(shutil.copytree(model_dir, tmp_path / "model"))
    before = tree(dest)
    aside = tmp_path / ".model.replaced-x1"
    aside.mkdir()
    os.rename(dest, aside / "old")
    (tmp_path / ".model.staging-x2" / "out").mkdir(parents=True)
    (tmp_path / ".model.removing-x3" / "gone").mkdir(parents=True)
    (tmp_path / ".other.staging-x4").mkdir()  # another destination's: not this writer's to touch
    net = pt.load_pruned(aside / "old")
    with pytest.raises(ValueError, match=r"already exists and is not empty"):  # recovered, then checked
        pt.save_pruned(net, dest)
    assert tree(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.staging-x4", "model"]


# ---------------------------------------------------------------------------------------------------------------------
# scripts/keep_run.sh
# ---------------------------------------------------------------------------------------------------------------------
def _finished_fake_run(path: Path, results: str) -> Path:
    (path / "pruned").mkdir(parents=True)
    for name in ("report.md", "test_translations.json", "run_complete.json", "pruned/prunetrain_layout.json"):
        (path / name).write_text("{}")
    (path / "results.json").write_text(results)
    return path


def _keep(run: Path, kept: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "keep_run.sh"), str(run), str(kept)], capture_output=True,
                          text=True, check=False)


def test_keep_run_never_replaces_the_kept_results_of_another_run(tmp_path):
    """The reported case: `keep_run.sh RUN_A KEPT_DIR_OF_B` silently replaced B's kept results."""
    run_a = _finished_fake_run(tmp_path / "a", '{"run": "a"}')
    run_b = _finished_fake_run(tmp_path / "b", '{"run": "b"}')
    kept_b = tmp_path / "kept" / "b"
    assert _keep(run_b, kept_b).returncode == 0
    marker = op.read_marker(kept_b)
    assert marker["kind"] == "kept-run" and marker["source"] == str(run_b.resolve())
    assert set(marker["entries"]) == {"results.json", "report.md", "test_translations.json", "layout.json"}
    before = tree(kept_b)
    done = _keep(run_a, kept_b)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"keep_run.sh: KEEP_DIR '{kept_b}' keeps another run"), done.stderr
    assert tree(kept_b) == before
    assert _keep(run_b, kept_b).returncode == 0 and tree(kept_b) == before  # the same run: kept again, unchanged
    legacy = tmp_path / "kept" / "legacy"  # kept before markers: its results.json is the run's identity
    legacy.mkdir()
    (legacy / "results.json").write_text('{"run": "b"}')
    assert _keep(run_a, legacy).returncode == 2 and (legacy / "results.json").read_text() == '{"run": "b"}'
    assert _keep(run_b, legacy).returncode == 0 and op.read_marker(legacy)["kind"] == "kept-run"
    mine = users_directory(tmp_path / "mine")
    done = _keep(run_a, mine)
    assert done.returncode == 2 and "holds no kept run" in done.stderr and (mine / "thesis.tex").is_file()
    (kept_b / "notes.txt").write_text("mine")
    done = _keep(run_b, kept_b)
    assert done.returncode == 2 and "holds 'notes.txt', which keep_run.sh did not write" in done.stderr
    assert leftovers(tmp_path / "kept") == []
