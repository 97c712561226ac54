"""Where prunetrain may write and what it may replace (`prunetrain.utils.output_paths`, issue 25): an output is never
an input, inside one or around one; `--overwrite` replaces only prunetrain's own directories; a replacement is
crash-safe at any signal (SIGINT and SIGTERM alike) and leaves no staging directory behind.

The relation rules are tested on the library and through every kind of command; a fuzzer throws random input/output
relations at the real command line and checks that no input ever changes; the signal tests kill real processes
(a loop of replacements, `prunetrain shrink` in place, `prunetrain export`) at random moments or while they stage.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import prunetrain as pt
from hostile import (LOAD_MODULES, REPO, assert_one_line, run_main, save_tiny_translation_model, stop_at_random, tree,
                     write_small_data)
from prunetrain.utils import output_paths as op


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("output-paths") / "model", multi30k_dir)


@pytest.fixture
def world(tmp_path, model_dir, multi30k_dir) -> Path:
    """A work directory: a model, data, an input text, a mask, and a directory of someone else's files."""
    shutil.copytree(model_dir, tmp_path / "model")
    write_small_data(tmp_path / "data", multi30k_dir, pairs=4)
    (tmp_path / "in.txt").write_text("Ein Hund.\n")
    net = pt.load_pruned(tmp_path / "model")
    mask = pt.HeadMask.ones(net)
    mask.set(pt.find_heads(net).sites[0].name, 0, 0.0)
    mask.to_json(tmp_path / "mask.json")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    return tmp_path


def hidden_entries(path: Path) -> list[str]:
    """Staging or set-aside directories prunetrain left anywhere under `path`."""
    return sorted(str(p.relative_to(path)) for p in path.rglob(".*")
                  if any(f".{kind}-" in p.name for kind in ("staging", "replaced", "removing", "previous")))


# ---------------------------------------------------------------------------------------------------------------------
# rule 1: never over, into or around an input
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("output, pattern", [
    ("data", r"--output: '.*data' is --data-dir '.*data'; prunetrain never writes over what it reads"),
    ("data/train.en", r"--output: '.*train.en' lies inside --data-dir '.*data'; prunetrain never writes into"),
    (".", r"--output: '.*' holds --data-dir '.*data'; writing or replacing it could destroy that input"),
    ("link", r"--output: '.*link' is --data-dir"),  # a symlink to the data
    ("x/../data/new", r"--output: '.*new' lies inside --data-dir"),
])
def test_an_output_is_never_an_input_inside_one_or_around_one(tmp_path, output, pattern):
    (tmp_path / "data").mkdir()
    (tmp_path / "x").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    with pytest.raises(ValueError, match=pattern):
        op.check_disjoint(tmp_path / output, {"--data-dir": tmp_path / "data"})
    op.check_disjoint(tmp_path / "elsewhere", {"--data-dir": tmp_path / "data"})
    op.check_disjoint(tmp_path / "data", {"model": tmp_path / "data"}, in_place="model")  # asked for by name


def test_translate_and_evaluate_never_write_over_or_into_their_inputs(monkeypatch, capsys, world):
    before = tree(world)
    for args, pattern in [
        (["translate", world / "model", "--input", world / "in.txt", "--output", world / "in.txt"],
         r"--output: '.*in.txt' is --input '.*in.txt'; prunetrain never writes over what it reads"),
        (["translate", world / "model", "--input", world / "in.txt", "--output", world / "model" / "config.json"],
         r"--output: '.*config.json' lies inside model '.*model'; prunetrain never writes into what it reads"),
        (["evaluate", world / "model", "--data-dir", world / "data", "--output", world / "model" / "config.json"],
         r"--output: '.*config.json' lies inside model"),
        (["evaluate", world / "model", "--data-dir", world / "data", "--output", world / "data" / "test.en"],
         r"--output: '.*test.en' lies inside --data-dir"),
        (["importance", world / "model", "--data-dir", world / "data", "--tokenizer", world / "model",
          "--output", world / "model" / "tokenizer.json"], r"--output: '.*tokenizer.json' lies inside model"),
    ]:
        assert_one_line(run_main(monkeypatch, capsys, *args), pattern)
    assert tree(world) == before


def test_recipe_never_deletes_its_data(monkeypatch, capsys, world):
    before = tree(world)
    for output, pattern in [(world / "data", r"--output: '.*data' is data.dir '.*data'"),
                            (world, r"--output: '.*' holds data.dir '.*data'; writing or replacing it could destroy")]:
        for extra in ([], ["--overwrite"], ["--resume"]):
            assert_one_line(run_main(monkeypatch, capsys, "recipe", "wmt-small-deen", "--smoke", "--data-dir",
                                     world / "data", "--output", output, *extra), pattern)
    assert tree(world) == before


# ---------------------------------------------------------------------------------------------------------------------
# rule 2: --overwrite replaces only prunetrain's own directories
# ---------------------------------------------------------------------------------------------------------------------
def test_overwrite_replaces_only_directories_prunetrain_writes(monkeypatch, capsys, world, tmp_path):
    before = tree(world / "other")
    assert_one_line(run_main(monkeypatch, capsys, "shrink", world / "model", "--mask", world / "mask.json",
                             "--output", world / "other", "--overwrite"),
                    r"--output: '.*other' is not empty and carries no prunetrain marker \(.prunetrain-output.json\): "
                    r"prunetrain did not write it .*; --overwrite replaces only directories prunetrain marked")
    assert tree(world / "other") == before
    (world / "model" / "notes.txt").write_text("mine too")  # a model directory with a stranger inside
    assert_one_line(run_main(monkeypatch, capsys, "shrink", world / "model", "--mask", world / "mask.json",
                             "--output", world / "model", "--overwrite"),
                    r"holds 'notes.txt', which is not part of the model prunetrain wrote there; --overwrite replaces "
                    r"only what prunetrain wrote")
    (world / "model" / "notes.txt").unlink()
    shutil.copytree(world / "model", tmp_path / "old-export")  # a model directory prunetrain wrote: replaced
    code, _, err = run_main(monkeypatch, capsys, "shrink", world / "model", "--mask", world / "mask.json",
                            "--output", tmp_path / "old-export", "--overwrite")
    assert code == 0, err
    assert pt.find_heads(pt.load_pruned(tmp_path / "old-export")).total_heads == 5
    assert (tmp_path / "old-export" / "tokenizer.json").is_file() and hidden_entries(tmp_path) == []


# ---------------------------------------------------------------------------------------------------------------------
# fuzz: random input/output relations through the real commands; no input ever changes
# ---------------------------------------------------------------------------------------------------------------------
FILE_OUTPUTS = ["in.txt", "model/config.json", "model/new.json", "data/train.en", "data/new.json", "mask.json",
                "new.json", ".", "model", "link-in.txt", "sub/../in.txt", "other/new.json"]
DIR_OUTPUTS = ["model", "model/sub", "data", "data/sub", ".", "other", "fresh", "link-model", "sub/../model",
               "copy", "mask.json", "in.txt"]


def test_fuzz_output_relations_never_touch_an_input(monkeypatch, capsys, world, model_dir):
    rng = random.Random(25)
    (world / "sub").mkdir()
    (world / "link-in.txt").symlink_to(world / "in.txt")
    (world / "link-model").symlink_to(world / "model")
    reads = {"translate": ["model", "in.txt"], "evaluate": ["model", "data"], "shrink": ["model", "mask.json"]}
    outcomes = {0: 0, 2: 0}
    for case in range(30):
        shutil.rmtree(world / "copy", ignore_errors=True)
        shutil.copytree(model_dir, world / "copy")
        command = rng.choice(sorted(reads))
        inputs = reads[command]
        before = {name: tree(world / name) if (world / name).is_dir() else (world / name).read_bytes()
                  for name in inputs}
        overwrite = ["--overwrite"] if rng.random() < 0.5 else []
        if command == "shrink":
            output = world / rng.choice(DIR_OUTPUTS)
            args = ["shrink", world / "model", "--mask", world / "mask.json", "--output", output, *overwrite]
        elif command == "translate":
            output = world / rng.choice(FILE_OUTPUTS)
            args = ["translate", world / "model", "--input", world / "in.txt", "--output", output, "--beams", "1"]
        else:
            output = world / rng.choice(FILE_OUTPUTS)
            args = ["evaluate", world / "model", "--data-dir", world / "data", "--beams", "1", "--output", output]
        code, _, err = run_main(monkeypatch, capsys, *args)
        assert code in (0, 2) and "Traceback" not in err, (args, err[-2000:])
        if code == 2:
            assert len(err.strip().splitlines()) == 1, err
        in_place = command == "shrink" and os.path.realpath(output) == os.path.realpath(world / "model")
        for name in inputs:
            now = tree(world / name) if (world / name).is_dir() else (world / name).read_bytes()
            if in_place and code == 0 and name == "model":
                assert pt.find_heads(pt.load_pruned(world / "model")).total_heads == 5, args
                shutil.rmtree(world / "model")
                shutil.copytree(model_dir, world / "model")  # the next case starts from the original again
            else:
                assert now == before[name], (args, name)
        assert (world / "other" / "notes.txt").read_text() == "mine", args  # someone else's file is never removed
        assert hidden_entries(world) == [], args
        outcomes[code] += 1
    assert outcomes[0] >= 3 and outcomes[2] >= 10, outcomes  # both paths exercised


# ---------------------------------------------------------------------------------------------------------------------
# rule 3: replacements are crash-safe at any signal
# ---------------------------------------------------------------------------------------------------------------------
_LOOP = LOAD_MODULES + """
from pathlib import Path
dest = Path(sys.argv[2])
print("ready", flush=True)
version = 0
while True:
    version += 1
    with op.staging_directory(dest) as staging:
        new = staging / "new"
        new.mkdir()
        for i in range(20):
            (new / f"f{i}").write_text(str(version) * 2000)
        op.write_file(new / "done", str(version))
        op.replace_directory(new, dest)
"""


def _whole(dest: Path) -> bool:
    """Every file of one version, none missing: the old directory or the new one, never a mix or a part."""
    contents = {p.name: p.read_text() for p in dest.iterdir()} if dest.is_dir() else {}
    version = contents.pop("done", None)
    return version is not None and sorted(contents) == sorted(f"f{i}" for i in range(20)) and \
        all(text == version * 2000 for text in contents.values())


@pytest.mark.usefixtures("sigint_raises")
def test_fuzz_signals_during_replacement_leave_a_whole_directory_and_no_staging(tmp_path):
    """A process replacing a directory over and over is stopped by SIGTERM or SIGINT at random moments: the
    destination is always one whole version and no staging or set-aside directory is left (held steps with a worker
    thread receiving the signal: tests/test_signals.py)."""
    rng = random.Random(2525)
    dest = tmp_path / "dest"
    dest.mkdir()
    for i in range(20):
        (dest / f"f{i}").write_text("0" * 2000)
    (dest / "done").write_text("0")
    for case in range(24):
        code = stop_at_random(_LOOP, [dest], rng, max_delay=0.08)
        assert code in (128 + signal.SIGTERM, -signal.SIGTERM, -signal.SIGINT, 1), code
        assert _whole(dest), (case, sorted(p.name for p in dest.iterdir()) if dest.is_dir() else "missing")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"], (case, list(tmp_path.iterdir()))


def _signal_while_staging(args: list, parent: Path, name: str, sig: int) -> subprocess.Popen:
    """Run `prunetrain ARGS` and send `sig` as soon as it stages `name` in `parent` (None if it never did)."""
    child = subprocess.Popen([sys.executable, "-m", "prunetrain.cli", *map(str, args)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    while child.poll() is None:
        if any(entry.startswith(f".{name}.staging-") for entry in os.listdir(parent)):
            child.send_signal(sig)
            child.stdout_text, child.stderr_text = child.communicate(timeout=120)
            return child
        time.sleep(0.001)
    child.communicate()
    return None


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_an_in_place_shrink_keeps_the_old_model_whole(world, model_dir, sig, tmp_path_factory):
    """The signal comes while the command stages its output: the old model stays whole. It can also land after
    the replacement (the staging directory is removed last, and a busy machine delays the test's look): then the
    command was done and the new model must be whole. Tried until one landed before the replacement."""
    before = tree(world / "model")
    again = tmp_path_factory.mktemp("again") / "model"  # the same shrink, undisturbed: what "done" looks like
    shutil.copytree(model_dir, again)
    shrink_args = ["shrink", None, "--mask", world / "mask.json", "--output", None, "--overwrite"]
    subprocess.run([sys.executable, "-m", "prunetrain.cli",
                    *map(str, [again if a is None else a for a in shrink_args])], cwd=REPO, check=True)
    after = tree(again)
    assert after != before
    for _ in range(5):
        child = _signal_while_staging([world / "model" if a is None else a for a in shrink_args], world, "model",
                                      sig)
        assert hidden_entries(world) == []
        if child is None or tree(world / "model") == after:  # done before the signal came, or before it acted
            shutil.rmtree(world / "model")
            shutil.copytree(model_dir, world / "model")
            continue
        assert child.returncode != 0
        assert tree(world / "model") == before  # the old directory, whole
        return
    pytest.fail("in five tries the signal never came before the replacement (or the command never staged)")


def test_a_sigterm_during_export_leaves_no_staging_directory(world):
    """The signal comes while the export stages its output: nothing is left, neither the export nor its staging. A
    busy machine can delay the test's look until the export is done (its staging is removed last): then the export
    is whole and the try is made again."""
    for _ in range(5):
        child = _signal_while_staging(["export", world / "model", world / "exported", "--format", "padded"], world,
                                      "exported", signal.SIGTERM)
        assert child is not None, "the command never staged its output"
        assert hidden_entries(world) == []
        if child.returncode == 0:  # done before the signal acted
            assert (world / "exported").is_dir()
            shutil.rmtree(world / "exported")
            continue
        assert child.returncode == 128 + signal.SIGTERM, child.stderr_text[-2000:]
        assert not (world / "exported").exists()
        return
    pytest.fail("the signal never landed while the export was staging (5 tries)")
