"""The documentation cannot drift: every ```python block of README.md and docs/*.md runs (or, where it needs a trained
run, a download or several processes, is compiled with its imports resolved), the API page names every export of
`prunetrain`, the CLI page every command and option, and the recipe-settings page every recipe key with its default.

What a block may assume is said by an HTML comment right before its fence (docs/contributing.md):
`<!-- docs-test: engine -->`, `<!-- docs-test: trainer -->`, `<!-- docs-test: test_readme -->` (run and checked in
tests/test_readme.py), `<!-- docs-test: import-only: REASON -->`; no comment: the block runs on its own.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import re
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import prunetrain

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"(?:^<!-- docs-test: (?P<marker>[^\n]*?) -->\n)?^```python[^\n]*\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE)
EXTRAS = {"fairseq", "llama_cpp", "gguf"}  # optional extras the suite does not install (CI's later stage does)


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    line: int
    marker: str | None
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("code"))
            found.append(Block(page, line, match.group("marker"), match.group("code")))
    return found


BLOCKS = code_blocks()


def test_every_python_fence_is_collected():
    fences = sum(len(re.findall(r"^```python", p.read_text(encoding="utf-8"), re.MULTILINE)) for p in PAGES)
    assert fences == len(BLOCKS) >= 10
    assert any(b.page.name == "README.md" for b in BLOCKS), "the README shows no Python example"


def _check_imports(code: str, filename: str) -> None:
    """Compile `code` and resolve its imports: modules import, names taken from them exist."""
    tree = ast.parse(code, filename)
    compile(tree, filename, "exec")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in EXTRAS:
                    importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module.split(".")[0] not in EXTRAS:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")  # a submodule, else ImportError


def _prunetrain_deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
            and "stop working in prunetrain 0.2" in str(w.message)]


def _engine_namespace() -> dict:
    from prunetrain.zoo import tiny_inputs, tiny_model

    model = tiny_model("marian")
    batch = tiny_inputs("marian")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(**batch).loss.backward()
    opt.step()
    return {"model": model, "batch": batch, "opt": opt}


def _pruned_dir_namespace(tmp_path: Path) -> dict:
    """A tiny Marian model with one head removed, saved by `save_pruned` to `runs/pruned` under `tmp_path`."""
    from prunetrain.zoo import tiny_model

    model = tiny_model("marian")
    mask = prunetrain.HeadMask.ones(model)
    mask.set("model.decoder.layers.0.encoder_attn", 1, 0.0)
    prunetrain.shrink(model, mask)
    prunetrain.save_pruned(model, tmp_path / "runs" / "pruned")
    return {}


def _trainer_namespace(tmp_path: Path, multi30k_dir: Path) -> dict:
    """The README's Trainer names (`tests/test_readme.py`), with 4 validation and 4 test pairs."""
    from test_readme import _trainer_namespace as readme_namespace

    from prunetrain.mt.text.data import read_parallel

    namespace = readme_namespace(tmp_path, multi30k_dir, "dev_pairs", "valid", num_train_epochs=3)
    return dict(namespace, test_pairs=read_parallel(multi30k_dir, "test", limit=4))


def _keys_test_readme_checks() -> list[str]:
    source = (ROOT / "tests" / "test_readme.py").read_text(encoding="utf-8")
    return re.findall(r'block\("([^"]+)"\)', source)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_code_block(block: Block, tmp_path, monkeypatch, request):
    marker = block.marker
    if marker is not None and marker.startswith("import-only:"):
        assert marker.split(":", 1)[1].strip(), f"{block.name}: say why the block only has its imports checked"
        _check_imports(block.code, block.name)
        return
    if marker == "test_readme":
        keys = [k for k in _keys_test_readme_checks() if k in block.code]
        assert len(keys) == 1, f"{block.name} is left to tests/test_readme.py, which checks no block like it"
        return
    namespaces = {None: dict, "engine": _engine_namespace, "pruned-dir": lambda: _pruned_dir_namespace(tmp_path),
                  "trainer": lambda: _trainer_namespace(tmp_path, request.getfixturevalue("multi30k_dir"))}
    assert marker in namespaces, f"{block.name}: unknown docs-test marker {marker!r} (docs/contributing.md)"
    namespace = namespaces[marker]()
    monkeypatch.chdir(tmp_path)  # a block that writes (out/pruned) writes here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(block.code, block.name, "exec"), namespace)  # noqa: S102  (the documented example itself)
    assert not _prunetrain_deprecations(caught), f"{block.name} shows a deprecated form"
    if block.code.count("HeadPruningCallback(") and marker == "trainer":  # the front page's promise: heads removed
        assert prunetrain.find_heads(namespace["model"]).total_heads < 24


def test_import_check_fails_on_a_missing_name():
    with pytest.raises(ImportError):
        _check_imports("from prunetrain import no_such_name", "x")
    with pytest.raises(SyntaxError):
        _check_imports("def (", "x")


# --- the API reference -------------------------------------------------------------------------------------------


def test_api_page_documents_every_export():
    entries = re.findall(r"^::: ([\w.]+)$", (ROOT / "docs" / "api.md").read_text(encoding="utf-8"), re.MULTILINE)
    names = [path.rsplit(".", 1)[1] for path in entries]
    assert sorted(names) == sorted(prunetrain.__all__), (
        f"docs/api.md lacks {sorted(set(prunetrain.__all__) - set(names))}, "
        f"or names what prunetrain does not export: {sorted(set(names) - set(prunetrain.__all__))}")
    for path in entries:
        module, name = path.rsplit(".", 1)
        assert getattr(importlib.import_module(module), name) is getattr(prunetrain, name), path


# --- the CLI reference -------------------------------------------------------------------------------------------


def _cli_hook():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_page_documents_every_command_and_option():
    hook = _cli_hook()
    page = hook.cli_markdown()
    commands = list(hook.walk(hook.root_command()))
    assert len(commands) >= 17 and ("prunetrain study ablate" in dict(commands))
    for path, command in commands:
        assert f"## `{path}`" in page, path
        for param in command.params:
            if param.param_type_name == "argument":
                assert f"`{param.name.upper()}`" in page, (path, param.name)
            elif not param.hidden:
                assert all(f"`{opt}`" in page for opt in param.opts), (path, param.opts)
    assert "mkdocs" in (ROOT / "mkdocs.yml").read_text() and "docs/hooks/cli_reference.py" in (
        ROOT / "mkdocs.yml").read_text()


# --- the recipe settings -----------------------------------------------------------------------------------------


def _schema(recipe_class) -> dict[str, object]:
    """`section.key` (or a top-level key) → default, for every field of a recipe dataclass."""
    out = {}
    for f in dataclasses.fields(recipe_class):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                out[f"{f.name}.{g.name}"] = getattr(value, g.name)
        else:
            out[f.name] = value
    return out


def _documented(heading: str) -> dict[str, str]:
    """`key` → default cell of the table under `heading` on docs/recipes.md."""
    text = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([\w.]+)` \| `(.*?)` \|", section, re.MULTILINE))


KINDS_ON_PAGE = {"translation": "## Translation recipes (`kind: translation`)",
                 "l0-sweep": "## Gate sweeps (`kind: l0-sweep`)"}


def _recipe_classes():
    from prunetrain.mt.config.recipe import Recipe
    from prunetrain.mt.config.recipe_l0 import GateSweepRecipe

    return {"translation": Recipe, "l0-sweep": GateSweepRecipe}


@pytest.mark.parametrize("kind", sorted(KINDS_ON_PAGE))
def test_recipe_page_matches_the_schema(kind):
    schema = _schema(_recipe_classes()[kind])
    documented = _documented(KINDS_ON_PAGE[kind])
    assert sorted(set(schema) - set(documented)) == [], "recipe keys missing on docs/recipes.md"
    assert sorted(set(documented) - set(schema)) == [], "docs/recipes.md documents keys the schema does not have"
    for key, value in schema.items():
        shown = '""' if value == "" else (repr(value) if isinstance(value, str) else str(value).replace("'", ""))
        assert documented[key] == shown, f"docs/recipes.md: {key} defaults to {shown}, the page says {documented[key]}"


def test_every_shipped_recipe_key_is_documented():
    from prunetrain.mt.config.recipe import RECIPES_DIR

    recipes = sorted(RECIPES_DIR.glob("*.yaml"))
    assert len(recipes) >= 3
    for path in recipes:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        kind = data.get("kind", "translation")
        keys = {f"{section}.{key}" if isinstance(values, dict) else section
                for section, values in data.items() for key in (values if isinstance(values, dict) else [None])}
        missing = sorted(keys - set(_documented(KINDS_ON_PAGE[kind])))
        assert not missing, f"{path.name}: keys not on docs/recipes.md: {missing}"


# --- the front page ----------------------------------------------------------------------------------------------


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    first_screen = "\n".join(readme.splitlines()[:60])
    assert "HeadPruningCallback" in first_screen and "Trainer(" in first_screen
    assert "bash scripts/install.sh && .venv/bin/python -m pytest -q\n" in readme  # CI's first stage runs it
    assert "bash scripts/install.sh && .venv/bin/prunetrain recipe wmt-small-deen\n" in readme
    assert "scripts/docs.sh" in readme
    for link in re.findall(r"\]\(((?:docs|recipes|benchmarks)/[^)#]*)", readme):
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
