"""The package layout: imports point one way (application → training → methods → engine; utils lowest), no module,
function or constructor is a giant, and the modules that were split keep their former import paths.

Every module under prunetrain/ is parsed with `ast` (imports inside functions count too, since a lazy import is still
a dependency), and each import of a prunetrain module is checked against the rules below; the same parse measures
modules (≤ 600 lines), functions (≤ 80 lines) and public constructors (≤ 10 parameters), reporting every offender.
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
    assert violations("from prunetrain.mt.evaluation.translation import evaluate_bleu", "prunetrain.methods.curve") == [
        "prunetrain.methods.curve (line 1) imports prunetrain.mt"]
    lazy = "def f():\n    import prunetrain.training.callbacks as c\n"
    assert violations(lazy, "prunetrain.engine.mask") == ["prunetrain.engine.mask (line 2) imports prunetrain.training"]
    assert violations("from ..mt import runner", "prunetrain.bench.runner") == [
        "prunetrain.bench.runner (line 1) imports prunetrain.mt"]
    assert violations("from prunetrain import cli", "prunetrain.utils.progress") == [
        "prunetrain.utils.progress (line 1) imports prunetrain.cli"]
    assert violations("from prunetrain.engine.heads import find_heads", "prunetrain.methods.importance") == []
    assert violations("from prunetrain.methods.curve import pruning_curve", "prunetrain.mt.run.runner") == []


def test_the_layout_has_the_documented_folders():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert set(LIBRARY) - {"export"} | set(APPLICATION) <= folders, folders
    assert not [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")], \
        "modules belong in a folder that names their layer"


@pytest.mark.parametrize("path", all_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_one_way(path):
    found = violations(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
    assert not found, "; ".join(found)


# ---------------------------------------------------------------------------------------------------------------------
# no import circle inside the engine: heads/mask reach the family adapters only through engine.registry (issue 29)
# ---------------------------------------------------------------------------------------------------------------------
def import_graph(prefix: str) -> dict[str, set[str]]:
    """module -> the modules under `prefix` it imports (each import resolved to the longest module name that exists,
    so `from prunetrain.engine.families import register` is an edge to the package `prunetrain.engine.families`)."""
    modules = {module_name(p): p for p in all_modules()}

    def resolve(target: str) -> str:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target

    graph = {}
    for module, path in modules.items():
        if module == prefix or module.startswith(prefix + "."):
            imported = imported_modules(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
            graph[module] = {t for t in (resolve(target) for _, target in imported)
                             if t != module and (t == prefix or t.startswith(prefix + "."))}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle of `graph`: one line per strongly connected component of more than one module (or a module that
    imports itself), as a path `a → b → ... → a` through it followed by all its members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [f"{_cycle_path(graph, members)} (members: {', '.join(members)})" for members in sorted(components)]


def _cycle_path(graph: dict[str, set[str]], members: list[str]) -> str:
    """One circle through the first member, walking only inside the component (breadth first: a shortest one)."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for other in sorted(graph.get(node, ())):
            if other == start:
                return " → ".join(paths[node] + [start])
            if other in inside and other not in paths:
                paths[other] = paths[node] + [other]
                queue.append(other)
    raise AssertionError(f"no circle through {start}")  # pragma: no cover - a component always has one


def test_the_cycle_finder_reports_every_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"g"}, "h": {"a"}}
    assert import_cycles(graph) == ["a → b → c → a (members: a, b, c)", "e → f → e (members: e, f)",
                                    "g → g (members: g)"]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_engine_import_graph_has_no_cycle():
    graph = import_graph("prunetrain.engine")
    assert "prunetrain.engine.registry" in graph["prunetrain.engine.heads"], "heads reaches adapters via registry"
    cycles = import_cycles(graph)
    assert not cycles, "import circles inside prunetrain.engine:\n" + "\n".join(cycles)


def test_the_package_import_graph_has_no_cycle():
    """No circle anywhere: a lazy import inside a function counts, so a circle cannot hide behind one (issue 63)."""
    cycles = import_cycles(import_graph("prunetrain"))
    assert not cycles, "import circles in prunetrain:\n" + "\n".join(cycles)


def test_the_application_is_in_rooms():
    """`prunetrain/mt` holds no module of its own: each part of the application has a room (text, evaluation,
    config, run, comparison), so the folder tree shows its structure."""
    mt = PACKAGE / "mt"
    loose = sorted(p.name for p in mt.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in prunetrain/mt: {loose}"
    rooms = {p.name for p in mt.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == {"text", "evaluation", "config", "run", "comparison"}, rooms


def test_heads_and_mask_reach_the_adapters_only_through_the_registry():
    graph = import_graph("prunetrain.engine")
    for module in ("prunetrain.engine.heads", "prunetrain.engine.mask", "prunetrain.engine.registry"):
        families = sorted(t for t in graph[module] if t.startswith("prunetrain.engine.families"))
        assert not families, f"{module} imports {', '.join(families)}; use prunetrain.engine.registry"
    assert graph["prunetrain.engine.registry"] == set(), "the registry imports nothing of the engine"


# ---------------------------------------------------------------------------------------------------------------------
# sizes: every module a room you can read in one sitting (issue 29)
# ---------------------------------------------------------------------------------------------------------------------
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80  # from the `def` line to the last line of the body (decorators not counted)
MAX_CONSTRUCTOR_PARAMETERS = 10  # an explicit `__init__` (self not counted) or a dataclass's fields

EXEMPT: dict[str, str] = {
    # "path/under/prunetrain.py" or "path/under/prunetrain.py::Qualified.name" -> why it may be larger: only
    # generated tables and data belong here, each with a one-line reason.
    "mt/config/recipe.py::TrainConfig": "a recipe YAML section: its fields are the keys users write (--set train.epochs=4)",
    "mt/config/recipe.py::PruningConfig": "a recipe YAML section: its fields are the keys users write "
                                   "(--set pruning.curve_steps=[600])",
    "mt/config/recipe.py::EvalConfig": "a recipe YAML section: its fields are the keys users write (--set eval.valid=true)",
}


def long_module(source: str, limit: int = MAX_MODULE_LINES) -> list[tuple[str, str]]:
    """[("", what is over)] when the module has more than `limit` lines."""
    lines = len(source.splitlines())
    return [("", f"{lines} lines (limit {limit})")] if lines > limit else []


def _definitions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and class, nested ones included, in source order."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield prefix + node.name, node
            yield from _definitions(node, prefix + node.name + ".")
        else:
            yield from _definitions(node, prefix)


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, str]]:
    """(qualified name, what is over) of every function, method or nested function longer than `limit` lines."""
    found = []
    for name, node in _definitions(ast.parse(source)):
        lines = node.end_lineno - node.lineno + 1
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > limit:
            found.append((name, f"line {node.lineno} {name}: {lines} lines (limit {limit})"))
    return found


def _is_dataclass(node: ast.ClassDef) -> bool:
    def name(decorator):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)

    return any(name(d) == "dataclass" for d in node.decorator_list)


def _dataclass_fields(node: ast.ClassDef) -> list[str]:
    """The constructor's fields: annotated class attributes, less ClassVars and `field(init=False)`."""
    out = []
    for item in node.body:
        if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
            continue
        if "ClassVar" in ast.unparse(item.annotation):
            continue
        value = item.value
        if isinstance(value, ast.Call) and any(k.arg == "init" and isinstance(k.value, ast.Constant)
                                               and k.value.value is False for k in value.keywords):
            continue
        out.append(item.target.id)
    return out


def wide_constructors(source: str, limit: int = MAX_CONSTRUCTOR_PARAMETERS) -> list[tuple[str, str]]:
    """(qualified name, what is over) of the public classes (no leading underscore anywhere in the qualified name) whose constructor takes more than
    `limit` parameters; a dataclass counts the fields of its dataclass bases in the same module."""
    found, fields_of = [], {}
    for name, node in _definitions(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"),
                    None)
        if init is not None:
            a = init.args
            count = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            what = "__init__ takes"
        elif _is_dataclass(node):
            inherited = [f for base in node.bases if isinstance(base, ast.Name) for f in fields_of.get(base.id, [])]
            fields_of[node.name] = list(dict.fromkeys(inherited + _dataclass_fields(node)))
            count, what = len(fields_of[node.name]), "has"
        else:
            continue
        public = not any(part.startswith("_") for part in name.split("."))
        if public and count > limit:
            unit = "parameters" if init is not None else "fields"
            found.append((name, f"line {node.lineno} {name} {what} {count} {unit} (limit {limit})"))
    return found


SIZE_CHECKS = {"module length": long_module, "function length": long_functions,
               "constructor width": wide_constructors}


def offenders(check: str) -> dict[str, list[str]]:
    """file (relative to prunetrain/) -> what is over the limit, for every module and one check; exemptions out."""
    out = {}
    for path in all_modules():
        relative = str(path.relative_to(PACKAGE))
        if relative in EXEMPT:
            continue
        found = [what for name, what in SIZE_CHECKS[check](path.read_text(encoding="utf-8"))
                 if f"{relative}::{name}" not in EXEMPT]
        if found:
            out[relative] = found
    return out


def _report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"prunetrain/{path}: {item}" for path, items in sorted(found.items()) for item in items)


def test_the_size_checkers_find_what_they_forbid():
    assert long_module("x = 1\n" * 601) == [("", "601 lines (limit 600)")] and long_module("x = 1\n" * 600) == []
    source = ("def short():\n" + "    x = 1\n" * 79 + "class A:\n    def long(self):\n" + "        x = 1\n" * 80
              + "    def outer(self):\n        def inner():\n" + "            x = 1\n" * 80)
    assert [what for _, what in long_functions(source)] == [
        "line 82 A.long: 81 lines (limit 80)", "line 163 A.outer: 82 lines (limit 80)",
        "line 164 A.outer.inner: 81 lines (limit 80)"]
    params = ", ".join(f"p{i}" for i in range(10))
    wide = (f"class Ok:\n    def __init__(self, {params}):\n        pass\n"
            f"class Wide:\n    def __init__(self, {params}, *, extra=None):\n        pass\n"
            f"class _Private:\n    def __init__(self, {params}, extra):\n        pass\n"
            "@dataclass(frozen=True)\nclass Base:\n" + "".join(f"    f{i}: int = 0\n" for i in range(6)) +
            "@dataclass\nclass Options(Base):\n" + "".join(f"    g{i}: int = 0\n" for i in range(4)) +
            "    seen: ClassVar[int] = 0\n    cache: dict = field(init=False, default_factory=dict)\n"
            "@dataclasses.dataclass\nclass More(Options):\n    h: int = 0\n")
    assert wide_constructors(wide) == [("Wide", "line 4 Wide __init__ takes 11 parameters (limit 10)"),
                                       ("More", "line 27 More has 11 fields (limit 10)")]


@pytest.mark.parametrize("check", list(SIZE_CHECKS))
def test_no_module_function_or_constructor_over_the_limits(check):
    """Every module ≤ 600 lines, every function ≤ 80 lines, every public constructor ≤ 10 parameters — except the
    EXEMPT tables, data and recipe schema, each by name with its reason."""
    found = offenders(check)
    assert not found, f"over the {check} limit:\n" + _report(found)


def test_exemptions_name_what_exists():
    for name, reason in EXEMPT.items():
        path = PACKAGE / name.split("::")[0]
        assert path.is_file() and reason.strip(), f"EXEMPT names {name!r}, which is not a module of prunetrain"
        if "::" in name:
            defined = [qualified for qualified, _ in _definitions(ast.parse(path.read_text(encoding="utf-8")))]
            assert name.split("::")[1] in defined, f"EXEMPT names {name!r}, which {path.name} does not define"


# ---------------------------------------------------------------------------------------------------------------------
# the import paths of the modules that were split (issue 29) keep every public name
# ---------------------------------------------------------------------------------------------------------------------
FORMER_MODULES = {
    "prunetrain.methods.studies": [
        "AfterUnit", "Journal", "KIND_COLORS", "Metric", "PAPER_SPEEDUP_AT_HALF", "PairedTest", "ablate_each_head",
        "ablation_table", "cross_dataset", "defined", "keep_one_head_per_layer", "pearson", "per_kind_curves",
        "pruning_curves_study", "spearman", "speed_study", "within", "write_cross_dataset_outputs"],
    "prunetrain.methods.importance": [
        "AblationScorer", "ConfidenceScorer", "GradientScorer", "HeadScores", "LossFn", "NORMALIZE", "NORMALIZE_EPS",
        "PER", "REDUCTION", "RandomScorer", "SCORERS", "Scorer", "ablation_scores", "batch_to", "confidence_scores",
        "get_scorer", "head_importance", "is_causal_lm", "loss_token_count", "random_scores", "register_scorer",
        "scoring_mode"],
    "prunetrain.bench.runner": [
        "Alternation", "BenchConfig", "BenchResult", "DTYPES", "GENERATE_MODES", "JSON_FORMAT", "MATMUL_OPS", "ORDERS",
        "alternate", "benchmark", "breakdown_table", "compare_times", "format_table", "load_model", "make_inputs",
        "op_breakdown", "peak_memory", "run_bench", "summarize"],
    "prunetrain.interop.fairseq": [
        "ACTIVATIONS", "EMPTY_FAIRSEQ", "FAIRSEQ_MODEL_TYPE", "FSMTAdapter", "FairseqAdapter", "FairseqCheckpoint",
        "FairseqDictionary", "FairseqHeadConfig", "FairseqTransformer", "IMPORT_FILE", "PrunableFSMTAttention",
        "SAFE_CHECKPOINT_GLOBALS", "SPECIAL_SYMBOLS", "SUPPORTED_ARCHS", "TARGET_TOKENIZER_DIR", "convert_fairseq",
        "dictionary_tokenizer", "fairseq_importance", "fairseq_loss", "fsmt_config_from_fairseq",
        "hf_batch_from_fairseq", "import_fairseq", "load_fairseq_checkpoint", "load_fairseq_tokenizers", "translate",
        "wrap_fairseq", "EmptyFairseqAttention"],
}


@pytest.mark.parametrize("module", [pytest.param(name, marks=[pytest.mark.fairseq] if "fairseq" in name else [])
                                    for name in FORMER_MODULES])  # with and without the extra
def test_split_modules_keep_their_former_names(module):
    import importlib

    from prunetrain.utils.extras import MissingExtraError

    imported = importlib.import_module(module)
    missing = [name for name in FORMER_MODULES[module] if not hasattr(imported, name)]
    for name in list(missing):  # provided, but built from an optional package that is not installed here
        with pytest.raises(AttributeError) as err:
            getattr(imported, name)
        if err.type is MissingExtraError and "install" in str(err.value):
            missing.remove(name)
    assert not missing, f"{module} lost {', '.join(missing)}"
    assert set(imported.__all__) <= set(FORMER_MODULES[module]), f"{module}.__all__ names a name it did not have"


def test_every_top_level_name_resolves():
    import prunetrain

    missing = [name for name in prunetrain.__all__ if not hasattr(prunetrain, name)]
    assert not missing, f"prunetrain.__all__ names {missing}, which do not resolve (the lazy table is stale)"
