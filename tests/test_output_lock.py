"""One writer per output directory, and the library's `overwrite=True` bound by the command line's rule (issue 37).

- `output_lock`: a second process writing the same output directory fails at once with one line naming it (every
  writer: export, shrink, prune, recipe runs and their --resume, save_pruned, save_translation_model, export());
  a killed holder never blocks the next writer; two real `prunetrain shrink` processes racing for one --output end
  with exactly one model and one refusal.
- `overwrite=True` of save_pruned / save_translation_model / export replaces only what `--overwrite` replaces, and
  nothing writes or replaces "", ".", the current directory, a directory holding it, the home directory or "/".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import prunetrain as pt
from hostile import LOAD_MODULES, REPO, assert_one_line, run_main, save_tiny_translation_model, tree
from prunetrain.export import export
from prunetrain.utils import output_paths as op

HOLD_LOCK = LOAD_MODULES + """
with op.output_lock(sys.argv[2]):
    print("ready", flush=True)
    sys.stdin.readline()
"""
LOCKED = r"another prunetrain process is writing '.*{name}'.*wait until it has finished or choose another"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("output-lock") / "model", multi30k_dir)


class Holder:
    """A real process holding the lock of `destination` until it is released or killed."""

    def __init__(self, destination: Path):
        self.child = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(REPO), str(destination)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
        assert self.child.stdout.readline().strip() == "ready", self.child.stderr.read()

    def release(self) -> None:
        self.child.communicate("\n", timeout=30)
        assert self.child.returncode == 0

    def kill(self) -> None:
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=30)
        self.child.stdin.close()
        self.child.stdout.close()
        self.child.stderr.close()


@pytest.fixture
def holder():
    made = []

    def hold(destination: Path) -> Holder:
        made.append(Holder(destination))
        return made[-1]

    yield hold
    for one in made:
        if one.child.poll() is None:
            one.kill()


# ---------------------------------------------------------------------------------------------------------------------
# the lock itself
# ---------------------------------------------------------------------------------------------------------------------
def test_a_second_writer_fails_at_once_and_a_dead_holder_blocks_nobody(tmp_path, holder):
    out = tmp_path / "out"
    first = holder(out)
    with pytest.raises(op.OutputLocked, match=LOCKED.format(name="out")):
        with op.output_lock(out):
            pass
    first.kill()  # SIGKILL: no cleanup ran, the kernel dropped the lock
    assert op.lock_file(out).exists()
    with op.output_lock(out):
        with op.output_lock(out):  # re-entrant within one process
            assert op.lock_file(out).exists()
    assert not op.lock_file(out).exists()  # removed by the last holder
    second = holder(out)
    second.release()
    with op.output_lock(out):
        pass


def test_every_command_that_writes_a_directory_refuses_a_locked_output(monkeypatch, capsys, tmp_path, model_dir,
                                                                       holder, multi30k_dir):
    from hostile import write_small_data

    net = pt.load_pruned(model_dir)
    mask = pt.HeadMask.ones(net)
    mask.to_json(tmp_path / "mask.json")
    data = write_small_data(tmp_path / "data", multi30k_dir, pairs=4)
    out = tmp_path / "out"
    holder(out)
    for args in (["export", model_dir, out, "--format", "padded"],
                 ["shrink", model_dir, "--mask", tmp_path / "mask.json", "--output", out],
                 ["prune", model_dir, "--data-dir", data, "--output", out, "--num-batches", "1"],
                 ["recipe", "wmt-small-deen", "--smoke", "--data-dir", data, "--output", out],
                 ["recipe", "wmt-small-deen", "--smoke", "--data-dir", data, "--output", out, "--resume"]):
        flag = "destination" if args[0] == "export" else "--output"
        assert_one_line(run_main(monkeypatch, capsys, *args), f"{flag}: " + LOCKED.format(name="out"))
    assert not out.exists()


def test_the_library_savers_refuse_a_locked_output(tmp_path, model_dir, holder):
    from prunetrain.mt.evaluation.translation import load_model_tokenizer, save_translation_model

    net = pt.load_pruned(model_dir)
    tokenizer = load_model_tokenizer(model_dir, None)
    out = tmp_path / "out"
    holder(out)
    for write in (lambda: pt.save_pruned(net, out), lambda: save_translation_model(net, tokenizer, out),
                  lambda: export(model_dir, out, "padded")):
        with pytest.raises(op.OutputLocked, match=LOCKED.format(name="out")):
            write()
    assert not out.exists()


def test_two_real_shrinks_racing_for_one_output_leave_one_model_and_one_refusal(tmp_path, model_dir):
    net = pt.load_pruned(model_dir)
    mask = pt.HeadMask.ones(net)
    site = pt.find_heads(net).sites[0].name
    mask.set(site, 0, 0.0)
    mask.to_json(tmp_path / "mask.json")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "prunetrain.cli", "shrink", str(model_dir), "--mask", str(tmp_path / "mask.json"),
               "--output", str(out)]
    env = {**os.environ, "PRUNETRAIN_PROGRESS": "0"}
    children = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
    results = [(child.wait(timeout=300), *child.communicate()) for child in children]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    refusal = next(err for code, _, err in results if code == 2).strip().splitlines()
    assert len(refusal) == 1 and ("another prunetrain process is writing" in refusal[0]
                                  or "already exists and is not empty" in refusal[0]), refusal
    assert pt.find_heads(pt.load_pruned(out)).total_heads == pt.find_heads(net).total_heads - 1
    assert not op.lock_file(out).exists()


# ---------------------------------------------------------------------------------------------------------------------
# overwrite=True in the library: the command line's rule
# ---------------------------------------------------------------------------------------------------------------------
def test_library_overwrite_never_deletes_a_directory_of_other_files(tmp_path, model_dir):
    from prunetrain.mt.evaluation.translation import load_model_tokenizer, save_translation_model

    net = pt.load_pruned(model_dir)
    tokenizer = load_model_tokenizer(model_dir, None)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    (mine / "config.json").write_text("{}")
    before = tree(mine)
    pattern = (r"'.*mine' is not empty and carries no prunetrain marker \(.prunetrain-output.json\).*; "
               r"overwrite=True.* replaces only directories prunetrain marked as its own")
    for write in (lambda: pt.save_pruned(net, mine, overwrite=True),
                  lambda: save_translation_model(net, tokenizer, mine, overwrite=True),
                  lambda: export(model_dir, mine, "padded", overwrite=True)):
        with pytest.raises(ValueError, match=pattern):
            write()
    assert tree(mine) == before
    saved = pt.save_pruned(net, tmp_path / "model")  # a directory prunetrain wrote is replaced
    assert pt.save_pruned(net, saved, overwrite=True) == saved
    assert export(model_dir, saved, "padded", overwrite=True)["destination"] == str(saved)


@pytest.mark.parametrize("where", ["", ".", "cwd", "parent", "home", "/"])
def test_nothing_writes_or_replaces_the_current_home_or_root_directory(monkeypatch, capsys, tmp_path, model_dir,
                                                                       where):
    work = tmp_path / "work"
    shutil.copytree(model_dir, work)  # a model directory: --overwrite would otherwise replace it
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work))
    target = {"cwd": str(work), "parent": "..", "home": str(work)}.get(where, where)
    before = tree(tmp_path)
    pattern = (r"an empty path|is the current directory|holds the current directory|is the home directory|"
               r"is the file-system root")
    net = pt.load_pruned(work)
    for write in (lambda: pt.save_pruned(net, target, overwrite=True),
                  lambda: export(work, target, "padded", overwrite=True)):
        with pytest.raises(ValueError, match=pattern):
            write()
    if target:
        assert_one_line(run_main(monkeypatch, capsys, "export", model_dir, target, "--format", "padded",
                                 "--overwrite"), pattern)
    assert tree(tmp_path) == before
