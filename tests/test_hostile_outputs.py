"""Outputs on a full disk, a read-only file system or beyond the file-size limit (issue 37): one line naming the flag,
the path and the reason in words, exit code 2, no traceback (no raw `OSError` text, no `SafetensorError`), and
nothing half-written left (staging directories, temporary and lock files removed).

The disks are real: a tmpfs of a few kilobytes mounted for the test (filled to the last byte first, so that every
write fails) and a tmpfs remounted read-only — root may write anywhere else, so chmod would prove nothing. Where
mounting is refused (no privileges), those tests are skipped; each checks first that its disk really refuses
writes, so none can pass without the failure it is about. The file-size limit is `RLIMIT_FSIZE` in a child process
(EFBIG).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import prunetrain as pt
from hostile import REPO, assert_one_line, run_main, save_tiny_translation_model, tree, write_small_data
from prunetrain.zoo import tiny_model


def _mount(path: Path, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode}); the full and "
                    f"read-only disk tests need mount privileges")


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs filled to the last byte: any write of file data there fails with ENOSPC."""
    disk = tmp_path / "full"
    _mount(disk, "size=64k")
    try:
        filler = os.open(disk / ".filler", os.O_WRONLY | os.O_CREAT)
        try:
            for chunk in (4096, 1):  # pages, then the last bytes
                with pytest.raises(OSError) as err:
                    while True:
                        os.write(filler, b"\0" * chunk)
                assert err.value.errno == errno.ENOSPC
        finally:
            os.close(filler)
        with pytest.raises(OSError) as err:  # the disk the tests rely on really is full
            (disk / "probe").write_bytes(b"x" * 8192)
        assert err.value.errno == errno.ENOSPC
        (disk / "probe").unlink(missing_ok=True)
        yield disk
    finally:
        _unmount(disk)


@pytest.fixture
def read_only_disk(tmp_path):
    """A tmpfs remounted read-only (with one existing empty directory): every write there fails with EROFS."""
    disk = tmp_path / "ro"
    _mount(disk, "size=1m")
    try:
        (disk / "empty").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(OSError) as err:
            (disk / "probe").write_text("x")
        assert err.value.errno == errno.EROFS
        yield disk
    finally:
        _unmount(disk)


def _left(disk: Path) -> list[str]:
    """What a failed command left on the disk (the filler aside)."""
    return sorted(name for name in os.listdir(disk) if name not in (".filler", "empty"))


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return pt.save_pruned(tiny_model("llama"), tmp_path_factory.mktemp("src") / "llama")


@pytest.fixture(scope="module")
def translation(tmp_path_factory, multi30k_dir) -> Path:
    return save_tiny_translation_model(tmp_path_factory.mktemp("mt") / "model", multi30k_dir)


FULL = r"no space left on the device; free some space or choose another {flag}\."
READ_ONLY = r"the file system is read-only; choose a {flag} on a file system you can write to\."


@pytest.mark.parametrize("fmt", ["padded", "remote-code", "uniform"])
def test_export_to_a_full_disk_is_one_line_naming_the_destination(monkeypatch, capsys, source, full_disk, fmt):
    before = tree(source)
    assert_one_line(run_main(monkeypatch, capsys, "export", source, full_disk / "out", "--format", fmt),
                    rf"^prunetrain: error: destination: cannot write '{full_disk / 'out'}': "
                    + FULL.format(flag="destination") + "$")
    assert _left(full_disk) == [] and tree(source) == before


def test_onnx_export_to_a_full_disk_is_one_line(monkeypatch, capsys, source, full_disk):
    pytest.importorskip("onnxruntime")
    code, _, err = run_main(monkeypatch, capsys, "export", source, full_disk / "out", "--format", "onnx")
    assert code == 2 and "Traceback" not in err, err
    assert f"prunetrain: error: destination: cannot write '{full_disk / 'out'}': no space left on the device" \
        in err, err
    assert _left(full_disk) == []


def test_shrink_and_the_library_savers_on_a_full_disk(monkeypatch, capsys, source, full_disk, tmp_path):
    from prunetrain.export.formats import export

    (tmp_path / "mask.json").write_text(json.dumps({"model.layers.0.self_attn": [1, 1, 0, 0]}))
    assert_one_line(run_main(monkeypatch, capsys, "shrink", source, "--mask", tmp_path / "mask.json", "--output",
                             full_disk / "shrunk"),
                    rf"--output: cannot write '{full_disk / 'shrunk'}': " + FULL.format(flag="--output"))
    with pytest.raises(ValueError, match=r"^path: cannot write '.*saved': no space left on the device"):
        pt.save_pruned(tiny_model("llama"), full_disk / "saved")
    with pytest.raises(ValueError, match=r"^destination: cannot write '.*padded': no space left on the device"):
        export(source, full_disk / "padded", "padded")
    assert _left(full_disk) == []


def test_result_and_translation_files_on_a_full_disk(monkeypatch, capsys, source, translation, full_disk, tmp_path,
                                                     multi30k_dir):
    data = write_small_data(tmp_path / "data", multi30k_dir, pairs=4)
    (tmp_path / "in.de").write_text("Ein Hund läuft.\nZwei Katzen.\n", encoding="utf-8")
    for args in (["evaluate", translation, "--data-dir", data, "--limit", "2", "--beams", "1"],
                 ["translate", translation, "--input", tmp_path / "in.de", "--beams", "1"],
                 ["importance", translation, "--data-dir", data, "--num-batches", "1", "--batch-size", "2"],
                 ["bench", source, source, "--batch-sizes", "1", "--seq-lens", "4", "--repeats", "1"]):
        assert_one_line(run_main(monkeypatch, capsys, *args, "--output", full_disk / "out.txt"),
                        rf"^prunetrain: error: --output: cannot write '{full_disk / 'out.txt'}': "
                        + FULL.format(flag="--output"))
        assert _left(full_disk) == []


def test_outputs_on_a_read_only_file_system(monkeypatch, capsys, source, translation, read_only_disk, tmp_path,
                                            multi30k_dir):
    data = write_small_data(tmp_path / "data", multi30k_dir, pairs=4)
    assert_one_line(run_main(monkeypatch, capsys, "evaluate", translation, "--data-dir", data, "--limit", "2",
                             "--beams", "1", "--output", read_only_disk / "empty" / "bleu.json"),
                    r"--output: cannot write '.*bleu.json': " + READ_ONLY.format(flag="--output"))
    code, _, err = run_main(monkeypatch, capsys, "export", source, read_only_disk / "out", "--format", "padded")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("prunetrain: error: destination: ") and "Read-only file system" in err.replace(
        "read-only", "Read-only"), err


def test_a_file_size_limit_is_one_line_and_leaves_nothing(source, tmp_path):
    """RLIMIT_FSIZE below the weights' size: safetensors fails with EFBIG (its SafetensorError, not an OSError)."""
    size = (source / "model.safetensors").stat().st_size

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    result = subprocess.run([sys.executable, "-m", "prunetrain.cli", "export", str(source), str(tmp_path / "out"),
                             "--format", "padded"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            preexec_fn=limit)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip() == (f"prunetrain: error: destination: cannot write '{tmp_path / 'out'}': the file "
                                     f"would exceed the file-size limit; raise the file-size limit (ulimit -f) or "
                                     f"choose another destination."), result.stderr
    assert sorted(os.listdir(tmp_path)) == []


def test_only_write_failures_of_the_output_are_mapped(tmp_path):
    """An unreadable input (its own file name) or an error of another kind passes through unchanged."""
    from prunetrain.utils.write_errors import OutputWriteError, write_errors, write_failure

    out = tmp_path / "out"
    assert write_failure(PermissionError(errno.EACCES, "Permission denied", "/somewhere/input.json"), out) is None
    assert write_failure(OSError(errno.ENOENT, "No such file or directory"), out) is None  # names no file
    assert write_failure(OSError(errno.ENOSPC, "No space left on device"), out) == (errno.ENOSPC,
                                                                                   "no space left on the device")
    assert write_failure(OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".out.staging-1" / "a")),
                         out) == (errno.EROFS, "the file system is read-only")
    assert write_failure(OSError(errno.ENAMETOOLONG, "File name too long", str(out / "x")), out) == (
        errno.ENAMETOOLONG, "file name too long")
    assert write_failure(FileExistsError(errno.EEXIST, "File exists", str(tmp_path)), out) == (
        errno.EEXIST, "a part of its path is a file, not a directory")
    with pytest.raises(OutputWriteError, match=r"^--output: cannot write '.*out': the disk quota is exceeded"):
        with write_errors("--output", out):
            with write_errors("path", tmp_path / ".out.staging-1" / "model"):  # the outer block names the output
                raise OSError(errno.EDQUOT, "Disk quota exceeded", str(tmp_path / ".out.staging-1" / "model" / "f"))
    with pytest.raises(KeyError):
        with write_errors("--output", out):
            raise KeyError("x")


@pytest.mark.parametrize("kind", ["dangling link", "link loop", "under a file", "name too long"])
def test_output_paths_no_write_can_use_are_one_line(monkeypatch, capsys, source, translation, tmp_path,
                                                     multi30k_dir, kind):
    """Neighbours of the full disk: an output that is a link to nothing (writing would replace the link, or create
    its target's missing parents somewhere else), one under a file, a name longer than the file system allows."""
    data = write_small_data(tmp_path / "data", multi30k_dir, pairs=2)
    (tmp_path / "afile").write_text(json.dumps({"model.layers.0.self_attn": [1, 1, 0, 0]}))  # a mask, and a file
    out = {"dangling link": tmp_path / "link", "link loop": tmp_path / "loop", "under a file": tmp_path / "afile" / "x",
           "name too long": tmp_path / ("n" * 300)}[kind]
    if kind == "dangling link":
        out.symlink_to(tmp_path / "gone" / "target")
    elif kind == "link loop":
        out.symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(out)
    pattern = {"dangling link": r"is a symbolic link to nothing \(dangling or a loop, -> '.*'\); remove it or choose "
                                r"another {flag}\.",
               "link loop": r"is a symbolic link to nothing \(dangling or a loop, -> '.*loop2'\)",
               "under a file": r"(cannot write '.*afile/x': a part of its path is a file, not a directory; choose "
                               r"another {flag}|'.*afile' is a file, not a directory; give a path in a directory)",
               "name too long": r"(cannot write '.*': file name too long; choose another {flag}|cannot create the "
                                r"lock file .*\(File name too long\))"}[kind]
    before = tree(tmp_path)
    for flag, args in (("destination", ["export", source, out, "--format", "padded"]),
                       ("--output", ["shrink", source, "--mask", tmp_path / "afile", "--output", out]),
                       ("--output", ["evaluate", translation, "--data-dir", data, "--limit", "1", "--beams", "1",
                                     "--output", out])):
        assert_one_line(run_main(monkeypatch, capsys, *args), rf"^prunetrain: error: {flag}: .*"
                        + pattern.format(flag=flag))
    assert tree(tmp_path) == before and not (tmp_path / "gone").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
