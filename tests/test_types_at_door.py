"""Types at the door (`prunetrain.utils.door`): every public function and option record of `prunetrain.__all__` and
`prunetrain.export` refuses a wrong-typed boolean or number before any work (a string is never a bool, a bool never
a count, NaN never a finite float), in one sentence naming the argument; so does the command line (exit code 2, one
line, no traceback). The reported cases run on real models and real exports."""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from pathlib import Path

import pytest
import torch
from hostile import assert_one_line, run_main, save_tiny_translation_model, tree
from transformers import BertConfig, BertModel

import prunetrain
import prunetrain.export
from prunetrain.utils import door

NOT_GUARDED = {
    "FamilyAdapter": "a base class for adapters; it takes no arguments",
    "Scorer": "a Protocol: the shape of a scorer, never called",
    "TrainingDiverged": "an exception raised by prunetrain, not called by users",
}
EXPORT_FUNCTIONS = [
    ("prunetrain.export.formats", "export"), ("prunetrain.export.formats", "check_formats"),
    ("prunetrain.export.ctranslate2", "ctranslate2_reason"), ("prunetrain.export.ctranslate2", "export_ctranslate2"),
    ("prunetrain.export.ctranslate2", "translate_ctranslate2"), ("prunetrain.export.onnx", "export_onnx"),
    ("prunetrain.export.onnx", "check_onnx"), ("prunetrain.export.gguf", "write_gguf"),
    ("prunetrain.export.gguf", "check_gguf"), ("prunetrain.export.gguf", "export_gguf"),
    ("prunetrain.export.gguf", "gguf_reason"),
]


def _doors() -> list[tuple[str, object]]:
    """Every public callable the door must guard: (name, callable)."""
    import importlib

    out = [(name, getattr(prunetrain, name)) for name in prunetrain.__all__]
    out += [(f"export.{name}", getattr(prunetrain.export, name)) for name in prunetrain.export.__all__]
    out += [(f"{module}.{name}", getattr(importlib.import_module(module), name)) for module, name in EXPORT_FUNCTIONS]
    return [(name, obj) for name, obj in out if callable(obj) and not isinstance(obj, dict)
            and name not in NOT_GUARDED]


DOORS = _doors()


def test_every_public_function_and_record_is_guarded_by_the_door():
    unguarded = [name for name, obj in DOORS if not door.is_checked(obj)]
    assert not unguarded, f"not guarded by @checked: {unguarded}"
    assert len(DOORS) >= 60
    for name, obj in DOORS:  # every hint resolves (a hint the door cannot read would fail the first call)
        function = obj.__init__ if inspect.isclass(obj) else obj
        function.resolve_hints()


# ---------------------------------------------------------------------------------------------------------------------
# wrong-typed booleans and numbers, fed to every such parameter with valid stand-ins for the required others
# ---------------------------------------------------------------------------------------------------------------------
def _arms(hint) -> list:
    """The arms of a hint: Optional/Union flattened, Annotated kept (its bounds and NON_FINITE matter)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return [arm for a in typing.get_args(hint) for arm in _arms(a)]
    return [hint]


def _base(arm):
    return typing.get_args(arm)[0] if typing.get_origin(arm) is typing.Annotated else arm


def _fits(value, arm) -> bool:
    """Whether `value` is of the kind one arm admits, by plain rules written here (not the door's)."""
    base = _base(arm)
    if base is bool:
        return type(value) is bool
    if base is int:
        return type(value) is int
    if base is float:
        non_finite = typing.get_origin(arm) is typing.Annotated and door.NON_FINITE in typing.get_args(arm)
        return type(value) in (int, float) and (non_finite or math.isfinite(value))
    if base is str:
        return isinstance(value, str)
    if typing.get_origin(base) is typing.Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(base))
    if base is typing.Any or base is object:
        return True
    if isinstance(base, type) and not typing.get_origin(base):
        return isinstance(value, base) and not (base is int and type(value) is bool)
    return False  # containers, callables: a bare scalar is none of them


WRONG = {bool: ["False", 1], int: [True, 1.5, "3"], float: ["x", True, math.nan]}


def _wrong_values(hint) -> list:
    """The wrong values for a parameter with a bool, int or float arm: those no arm admits."""
    arms = _arms(hint)
    kinds = {_base(a) for a in arms} & set(WRONG)
    candidates = [v for kind in (bool, int, float) if kind in kinds for v in WRONG[kind]]
    out = []
    for value in candidates:
        if not any(_fits(value, arm) for arm in arms) and not any(value is v for v in out):
            out.append(value)
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """Valid values for required parameters, by hint (real objects: a tiny BERT and its layout, mask, scores)."""
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=32))
    layout = prunetrain.find_heads(model)
    mask = prunetrain.HeadMask(layout)
    root = tmp_path_factory.mktemp("stand-ins")
    from prunetrain.training.training_clock import TrainingClock

    return {
        torch.nn.Module: model, prunetrain.HeadLayout: layout, prunetrain.HeadMask: mask,
        prunetrain.HeadScores: prunetrain.random_scores(layout), Path: root / "out", str: str(root / "out"),
        float: 0.5, int: 1, bool: False, torch.dtype: torch.float32, type: object,
        "clock": TrainingClock(), "sites": (), "cls": object,
    }


def _stand_in(name: str, hint, stand_ins: dict):
    if name in stand_ins:
        return stand_ins[name]
    for arm in _arms(hint):
        base = _base(arm)
        origin = typing.get_origin(base)
        if base in stand_ins:
            value = stand_ins[base]
            for marker in typing.get_args(arm)[1:]:  # a bound: its lower end (or just above it)
                if isinstance(marker, door.Bounds) and marker.minimum is not None:
                    value = type(value)(marker.minimum + (1 if base is int else 0.5) * marker.min_open)
            return value
        if origin is typing.Literal:
            return typing.get_args(base)[0]
        if origin in (tuple, list, dict) or base in (tuple, list, dict):
            return (origin or base)()
        if origin in (typing.Sequence, typing.Iterable) or base in (typing.Iterable,):
            return []
        if origin is not None and getattr(origin, "__name__", "") in ("Sequence", "Iterable", "Collection"):
            return []
        if origin is not None and getattr(origin, "__name__", "") in ("Mapping", "MutableMapping"):
            return {}
        if origin is not None and getattr(origin, "__name__", "") == "Callable" or base is typing.Callable:
            return lambda *args, **kwargs: 0.0
        if base is type(None):
            return None
        if isinstance(base, type):
            try:
                return base()
            except TypeError:  # a class that needs arguments: try the next arm
                continue
    if hint is None:
        return None
    raise AssertionError(f"no stand-in for {name}: {hint}")


def _cases():
    cases = []
    for name, obj in DOORS:
        function = obj.__init__ if inspect.isclass(obj) else obj
        hints = function.resolve_hints()
        for parameter, hint in hints.items():
            for value in _wrong_values(hint):
                cases.append(pytest.param(name, parameter, value, id=f"{name}-{parameter}={value!r}"))
    return cases


CASES = _cases()


def test_the_walk_reaches_the_reported_parameters():
    reached = {(name, parameter) for name, parameter, _ in (c.values for c in CASES)}
    for case in [("save_pruned", "overwrite"), ("export.export", "overwrite"), ("find_heads", "discover"),
                 ("prunetrain.export.ctranslate2.translate_ctranslate2", "num_beams"),
                 ("prunetrain.export.ctranslate2.translate_ctranslate2", "length_penalty"),
                 ("Importance", "num_batches"), ("GateTraining", "gate_lr"), ("SmoothedCrossEntropy", "epsilon")]:
        assert case in reached, case
    assert len(CASES) > 150


@pytest.mark.parametrize("name, parameter, value", CASES)
def test_a_wrong_typed_bool_or_number_is_refused_in_one_sentence(name, parameter, value, stand_ins):
    obj = dict(DOORS)[name]
    function = obj.__init__ if inspect.isclass(obj) else obj
    signature = inspect.signature(function)
    hints = function.resolve_hints()
    args, kwargs = [], {}
    for p in list(signature.parameters.values())[1 if inspect.isclass(obj) else 0:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name == parameter:
            given = value
        elif p.default is p.empty:
            given = _stand_in(p.name, hints.get(p.name), stand_ins)
        else:
            continue
        if p.kind is p.POSITIONAL_ONLY:
            args.append(given)
        else:
            kwargs[p.name] = given
    with pytest.raises(ValueError) as refused:
        obj(*args, **kwargs)
    message = str(refused.value)
    assert re.search(rf"(^|\.){re.escape(parameter)}\b", message.split(":")[0]), message
    assert "\n" not in message and message.endswith("."), message


# ---------------------------------------------------------------------------------------------------------------------
# the door's own grammar
# ---------------------------------------------------------------------------------------------------------------------
@door.checked
def _guarded(flag: bool = False, count: door.PositiveInt = 1, items: typing.Sequence[float] = (),
             share: door.Fraction01 = 0.5, anything: door.AnyFloat = 0.0, lines: typing.Iterable[str] = ()):
    return "ran"


@pytest.mark.parametrize("kwargs, message", [
    ({"flag": "no"}, r"^flag: 'no' is not allowed; expected True or False\.$"),
    ({"flag": 1}, r"^flag: 1 is not allowed; expected True or False\.$"),
    ({"count": True}, r"^count: True is not allowed; expected an integer >= 1\.$"),
    ({"count": 0}, r"^count: 0 is not allowed; expected an integer >= 1\.$"),
    ({"count": 2.0}, r"^count: 2\.0 is not allowed"),
    ({"items": "12"}, r"^items: '12' is not allowed; expected a sequence of finite numbers\.$"),
    ({"items": [1.0, math.inf]}, r"^items: \[1\.0, inf\] is not allowed"),
    ({"share": 1.5}, r"^share: 1\.5 is not allowed; expected a finite number in \[0, 1\]\.$"),
    ({"share": math.nan}, r"^share: nan is not allowed"),
    ({"lines": 3}, r"^lines: 3 is not allowed; expected an iterable of strs\.$"),
])
def test_the_door_refuses_in_one_sentence(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _guarded(**kwargs)


def test_the_door_admits_what_the_hints_admit_and_never_consumes_a_generator():
    import numpy

    lines = (line for line in ["a", "b"])
    assert _guarded(flag=numpy.bool_(True), count=numpy.int64(3), items=[1, 2.5], share=1, anything=math.nan,
                    lines=lines) == "ran"
    assert list(lines) == ["a", "b"]


# ---------------------------------------------------------------------------------------------------------------------
# the reported cases, on real models and real exports
# ---------------------------------------------------------------------------------------------------------------------
def _tiny_model():
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32))


@pytest.mark.parametrize("overwrite", ["no", "False", 0, 1, None])
def test_export_and_save_pruned_refuse_a_non_bool_overwrite_and_keep_the_directory(tmp_path, overwrite):
    from prunetrain.export.formats import export as formats_export

    model = _tiny_model()
    saved = prunetrain.save_pruned(model, tmp_path / "saved")
    exported = tmp_path / "exported"
    prunetrain.export.export(saved, exported, "padded")
    before_saved, before_exported = tree(saved), tree(exported)
    with pytest.raises(ValueError, match=rf"^overwrite: {re.escape(repr(overwrite))} is not allowed; expected True or "
                                         rf"False\.$"):
        prunetrain.save_pruned(_tiny_model(), saved, overwrite=overwrite)
    for export in (prunetrain.export.export, formats_export):
        with pytest.raises(ValueError, match=r"^overwrite: .* is not allowed; expected True or False\.$"):
            export(saved, exported, "padded", overwrite=overwrite)
    assert tree(saved) == before_saved and tree(exported) == before_exported


def test_smoothed_cross_entropy_refuses_a_count_that_is_no_count():
    loss = prunetrain.SmoothedCrossEntropy(0.1)
    logits, labels = torch.randn(2, 3, 7), torch.tensor([[1, 2, -100], [3, -100, -100]])
    assert loss({"logits": logits}, labels, num_items_in_batch=3) > 0
    for bad in (-3, 0, True, 2.5, "3"):
        with pytest.raises(ValueError, match=rf"^num_items_in_batch: {re.escape(repr(bad))} is not allowed; expected "
                                             rf"an integer >= 1\.$"):
            loss({"logits": logits}, labels, num_items_in_batch=bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"num_beams": True}, r"^num_beams: True is not allowed; expected an integer >= 1\.$"),
    ({"num_beams": 1.5}, r"^num_beams: 1\.5 is not allowed"),
    ({"max_new_tokens": True}, r"^max_new_tokens: True is not allowed; expected an integer >= 1\.$"),
    ({"max_new_tokens": 0}, r"^max_new_tokens: 0 is not allowed; expected an integer >= 1\.$"),
    ({"length_penalty": math.nan}, r"^length_penalty: nan is not allowed; expected a finite number\.$"),
    ({"batch_size": -1}, r"^batch_size: -1 is not allowed; expected an integer >= 1\.$"),
    ({"threads": "2"}, r"^threads: '2' is not allowed"),
])
def test_translate_ctranslate2_refuses_bad_settings_before_reading_anything(tmp_path, kwargs, message):
    from prunetrain.export.ctranslate2 import translate_ctranslate2

    with pytest.raises(ValueError, match=message):  # the directory does not exist: nothing was read
        translate_ctranslate2(tmp_path / "missing", ["Ein Hund."], **kwargs)


def test_translate_ctranslate2_reads_any_iterable_of_sentences(tmp_path, multi30k_dir):
    pytest.importorskip("ctranslate2")
    from prunetrain.export.ctranslate2 import translate_ctranslate2

    source = save_tiny_translation_model(tmp_path / "model", multi30k_dir)
    prunetrain.export.export(source, tmp_path / "ct2", "ctranslate2")
    sentences = ["Ein Hund läuft.", "Zwei Katzen schlafen."]
    listed = translate_ctranslate2(tmp_path / "ct2", sentences, max_new_tokens=8)
    assert len(listed) == 2
    assert translate_ctranslate2(tmp_path / "ct2", (s for s in sentences), max_new_tokens=8) == listed
    assert translate_ctranslate2(tmp_path / "ct2", tuple(sentences), max_new_tokens=8) == listed
    for bad, message in [("Ein Hund.", r"^sources: 'Ein Hund\.' is not a list of sentences"),
                         (["Ein Hund.", 3],
                          r"^sources: \['Ein Hund\.', 3\] is not allowed; expected an iterable of strs\.$"),
                         (iter(["Ein Hund.", 3]), r"^sources: item 2 is 3, not a str sentence\.$"),
                         (5, r"^sources: 5 is not allowed; expected an iterable of strs\.$")]:
        with pytest.raises(ValueError, match=message):
            translate_ctranslate2(tmp_path / "ct2", bad)


# ---------------------------------------------------------------------------------------------------------------------
# the command line: every numeric and boolean option fed a value of the wrong kind
# ---------------------------------------------------------------------------------------------------------------------
def _cli_cases():
    import typer

    import prunetrain.cli  # noqa: F401  (registers the commands)
    from prunetrain.cli.common import app

    cases = []

    def walk(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
            return
        hints = typing.get_type_hints(command.callback)
        required = [p for p in command.params if p.required]
        for param in command.params:
            hint = hints.get(param.name)
            kinds = {_base(a) for a in _arms(hint)} & {bool, int, float}
            if not kinds or not param.opts or not param.opts[0].startswith("--"):
                continue
            flag = param.opts[0]
            if bool in kinds:
                wrong = [f"{flag}=maybe"]
            elif int in kinds:
                wrong = [[flag, "abc"], [flag, "1.5"]]
            else:
                wrong = [[flag, "abc"]]
            for args in wrong:
                args = [args] if isinstance(args, str) else args
                options = [p.opts[0] if p.opts[0].startswith("--") else None for p in required]
                cases.append(pytest.param(path, options, args, flag, id=f"{' '.join(path)} {' '.join(args)}"))

    walk(typer.main.get_command(app), ())
    return cases


CLI_CASES = _cli_cases()


def test_the_cli_walk_reaches_the_numeric_options():
    flags = {(" ".join(path), flag) for path, _, _, flag in (c.values for c in CLI_CASES)}
    for case in [("prune", "--ffn-amount"), ("evaluate", "--beams"), ("translate", "--beams"), ("bench", "--repeats"),
                 ("study speed", "--threads"), ("export", "--overwrite")]:
        assert case in flags, case


@pytest.mark.parametrize("path, required, wrong, flag", CLI_CASES)
def test_a_cli_option_of_the_wrong_kind_exits_2_in_one_line(path, required, wrong, flag, tmp_path, monkeypatch,
                                                           capsys):
    args = list(path)
    for option in required:  # existing directories for every required argument and option
        args += [tmp_path] if option is None else [option, tmp_path]
    result = run_main(monkeypatch, capsys, *args, *wrong)
    assert_one_line(result, re.escape(flag))


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory, multi30k_dir):
    """A tiny saved translation model, a small parallel-text directory and a one-line input file."""
    from hostile import write_small_data

    root = tmp_path_factory.mktemp("cli-inputs")
    (root / "in.txt").write_text("Ein Hund.\n")
    return save_tiny_translation_model(root / "model", multi30k_dir), write_small_data(root / "data", multi30k_dir), \
        root


@pytest.mark.parametrize("args, flag, allowed", [
    (["evaluate", "{model}", "--data-dir", "{data}", "--beams", "0"], "--beams", "an integer >= 1"),
    (["evaluate", "{model}", "--data-dir", "{data}", "--limit", "-1"], "--limit", "an integer >= 1"),
    (["translate", "{model}", "--input", "{root}/in.txt", "--batch-size", "-2"], "--batch-size", "an integer >= 1"),
    (["prune", "{model}", "--output", "{root}/p", "--data-dir", "{data}", "--amount", "nan"], "--amount",
     "fraction in"),
    (["prune", "{model}", "--output", "{root}/p", "--data-dir", "{data}", "--ffn-amount", "-0.5"], "--ffn-amount",
     "fraction in"),
    (["prune", "{model}", "--output", "{root}/p", "--data-dir", "{data}", "--flops", "nan"], "--flops",
     "fraction in"),
    (["prune", "{model}", "--output", "{root}/p", "--data-dir", "{data}", "--min-heads-per-layer", "-1"],
     "--min-heads-per-layer", "an integer >= 0"),
    (["importance", "{model}", "--data-dir", "{data}", "--num-batches", "0"], "--num-batches", "an integer >= 1"),
    (["bench", "{model}", "{model}", "--warmup", "-1"], "--warmup", "an integer >= 0"),
    (["study", "speed", "{model}", "--data-dir", "{data}", "--threads", "0"], "--threads", "an integer >= 1"),
    (["study", "ablate", "{model}", "--data-dir", "{data}", "--threshold", "nan"], "--threshold", "finite number"),
    (["study", "ablate", "{model}", "--data-dir", "{data}", "--alpha", "nan"], "--alpha", r"level in \(0, 1\)"),
    (["compare", "{model}", "{model}", "--output", "{root}/c", "--bootstrap-samples", "-1"], "--bootstrap-samples",
     "an integer >= 1"),
])
def test_a_cli_count_that_is_negative_or_a_nan_exits_2_in_one_line(args, flag, allowed, tiny_inputs, monkeypatch,
                                                                    capsys):
    model, data, root = tiny_inputs
    args = [a.format(model=model, data=data, root=root) for a in args]
    assert_one_line(run_main(monkeypatch, capsys, *args), rf"{re.escape(flag)}: \S+ is not .*{allowed}")
    assert not (root / "p").exists() and not (root / "c").exists()
