"""A plain install (no extras) works: every module imports, `hasattr`/`dir()`/`inspect` never raise, and a name or
format that needs a missing extra says which one to install, in one line, only when it is used.

The optional packages are made missing for real: `sys.modules[name] = None` makes Python's import system raise
`ModuleNotFoundError` for them (as on a machine without them), whatever this environment has installed, so these
tests check the no-extras install also where CI has installed the extras.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hostile import assert_one_line, run_main
from prunetrain.utils.extras import EXTRAS

BLOCK_EXTRAS = "import sys\nfor _name in %r:\n    sys.modules[_name] = None\n" % sorted(EXTRAS)


def run_without_extras(code: str) -> str:
    """`code` in a fresh interpreter in which every optional package is missing; its stdout (it must succeed)."""
    done = subprocess.run([sys.executable, "-c", BLOCK_EXTRAS + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def test_every_module_and_name_without_the_extras():
    out = run_without_extras("""
        import importlib, inspect, pkgutil
        import prunetrain
        from prunetrain.utils.extras import MissingExtraError

        for extra in %r:
            try:
                __import__(extra)
                raise SystemExit(f"{extra} imported although it was blocked")
            except ModuleNotFoundError:
                pass
        from prunetrain.engine.families import core

        every = [importlib.import_module(info.name) for info in pkgutil.walk_packages(prunetrain.__path__, "prunetrain.")
                 if not info.name.endswith("__main__")]  # (__main__ runs the command line)
        lazy = set(core._SUBCLASSES)  # the names modules build on first access (the declared attention subclasses)
        modules = names = absent = 0
        for module in every:
            info = module.__spec__
            modules += 1
            inspect.getmembers(module)  # dir() + getattr, as doc generators do
            for name in sorted(set(dir(module)) | set(getattr(module, "__all__", [])) | lazy):
                names += 1
                if hasattr(module, name):
                    continue
                try:
                    getattr(module, name)
                except MissingExtraError as err:
                    assert "install" in str(err) and len(str(err).splitlines()) == 1, str(err)
                    absent += 1
                    print("ABSENT", info.name, name, "|", err)
                except AttributeError:
                    listed = name in dir(module) or name in getattr(module, "__all__", [])
                    assert not listed, f"{info.name} lists {name}, which does not resolve"
        print("COUNTS", modules, names, absent)
    """ % sorted(EXTRAS))
    counts = [line for line in out.splitlines() if line.startswith("COUNTS")][0].split()
    assert int(counts[1]) > 100 and int(counts[2]) > 2000, out[-2000:]  # the walk really walked the package
    absent = [line for line in out.splitlines() if line.startswith("ABSENT")]
    # the fairseq attention subclass, offered by name for pickles, is the one name built from an extra
    for module in ("prunetrain.interop.fairseq", "prunetrain.engine.families.core"):
        assert any(f"{module} EmptyFairseqAttention" in line and "--with-fairseq" in line for line in absent), out
    assert all("EmptyFairseqAttention" in line for line in absent), out


def test_export_api_without_the_extras_says_what_to_install(tmp_path):
    out = run_without_extras(f"""
        from transformers import LlamaConfig, LlamaForCausalLM
        from prunetrain.export import export

        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=64))
        for fmt in ("onnx", "gguf", "ctranslate2"):
            try:
                export(model, "{tmp_path}/" + fmt, fmt)
            except ValueError as err:
                print(fmt, "|", err)
    """)
    lines = dict(line.split(" | ", 1) for line in out.splitlines() if " | " in line)
    assert "onnx is missing: pip install 'prunetrain[onnx]'" in lines["onnx"], out
    assert "gguf is missing: bash scripts/install.sh --with-llama" in lines["gguf"], out
    assert "ctranslate2 is missing: pip install 'prunetrain[ctranslate2]'" in lines["ctranslate2"], out
    assert not list(tmp_path.iterdir()), "nothing is written when the extra is missing"


@pytest.mark.parametrize("fmt,package,hint", [("onnx", "onnxruntime", r"prunetrain\[onnx\]"),
                                              ("gguf", "llama_cpp", "--with-llama")])
def test_export_cli_without_an_extra(monkeypatch, capsys, tmp_path, fmt, package, hint):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=64)).save_pretrained(tmp_path / "model")
    monkeypatch.setitem(sys.modules, package, None)
    result = run_main(monkeypatch, capsys, "export", tmp_path / "model", tmp_path / "out", "--format", fmt)
    assert_one_line(result, rf"--format: .*{package.replace('_', '-')}.* is missing: .*{hint}")
    assert not (tmp_path / "out").exists()


def test_the_dev_extra_installs_what_the_suite_needs():
    """`pip install -e .[dev]` then `pytest` runs: the dev extra holds the test extra (pytest-xdist, which the
    suite's addopts `-n auto` needs, and every package a test imports)."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert "prunetrain[test]" in extras["dev"]
    assert any(req.startswith("pytest-xdist") for req in extras["test"])
    assert "-n auto" in project["tool"]["pytest"]["ini_options"]["addopts"]
