"""The package layout: imports point one way (application → training → methods → engine; utils lowest).

Every module under prunetrain/ is parsed with `ast` (imports inside functions count too, since a lazy import is still
a dependency), and each import of a prunetrain module is checked against the rules below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "prunetrain"
LIBRARY = ("engine", "methods", "training", "bench", "utils", "zoo", "interop", "export")
APPLICATION = ("mt", "cli")
FORBIDDEN = {  # package -> the prunetrain packages it must not import
    **{library: set(APPLICATION) for library in LIBRARY},
    "engine": {"methods", "training", "bench", "export", "interop", *APPLICATION},
    "methods": {"training", *APPLICATION},
    "utils": {"engine", "methods", "training", "bench", "zoo", "interop", "export", *APPLICATION},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source` (relative imports resolved against `module`)."""
    out = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            out += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]  # `from prunetrain import mt`
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in FORBIDDEN:
        return []
    forbidden = FORBIDDEN[parts[1]]
    found = []
    for line, target in imported_modules(source, module, is_package):
        pieces = target.split(".")
        if len(pieces) >= 2 and pieces[0] == "prunetrain" and pieces[1] in forbidden:
            found.append(f"{module} (line {line}) imports {'.'.join(pieces[:2])}")
    return sorted(set(found))


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_checker_finds_what_it_forbids():
    assert violations("from prunetrain.mt.translation import evaluate_bleu", "prunetrain.methods.curve") == [
        "prunetrain.methods.curve (line 1) imports prunetrain.mt"]
    lazy = "def f():\n    import prunetrain.training.callbacks as c\n"
    assert violations(lazy, "prunetrain.engine.mask") == ["prunetrain.engine.mask (line 2) imports prunetrain.training"]
    assert violations("from ..mt import runner", "prunetrain.bench.runner") == [
        "prunetrain.bench.runner (line 1) imports prunetrain.mt"]
    assert violations("from prunetrain import cli", "prunetrain.utils.progress") == [
        "prunetrain.utils.progress (line 1) imports prunetrain.cli"]
    assert violations("from prunetrain.engine.heads import find_heads", "prunetrain.methods.importance") == []
    assert violations("from prunetrain.methods.curve import pruning_curve", "prunetrain.mt.runner") == []


def test_the_layout_has_the_documented_folders():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert set(LIBRARY) - {"export"} | set(APPLICATION) <= folders, folders
    assert not [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")], \
        "modules belong in a folder that names their layer"


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_one_way(path):
    found = violations(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
    assert not found, "; ".join(found)
