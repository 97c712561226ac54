"""Reading recipe YAML strictly: what the file says is what the run gets, or one sentence saying why not.

A plain `yaml.safe_load` lets through what silently changes a recipe: a duplicate key (or schedule step) keeps its
last value, an empty file is "no recipe" and becomes the defaults, `1e-3` is read as a string (YAML 1.1 wants a dot),
and an alias bomb (a few lines of `&a [*b, *b, ...]`) expands to billions of nodes — in the error message too.
`load_yaml` refuses duplicates, empty documents, top-level values that are not mappings, aliases (a recipe never
needs them; refused when composed, before anything is expanded) and text that is not UTF-8, and reads YAML 1.2
numbers (`1e-3`, `1E5`) as numbers. `build_dataclass` then checks the mapping key by key against the recipe
dataclasses' annotations.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing

import yaml

from prunetrain.utils.files import utf8_text

FLOAT_12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")
"""YAML 1.2 core-schema floats; the YAML 1.1 resolver PyYAML uses reads `1e-3` (no dot) as a string."""


class StrictYamlError(ValueError):
    """YAML that parses but that a recipe must not hold (a duplicate key, an alias, absurd nesting)."""


class _Refused(yaml.constructor.ConstructorError):
    pass


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without aliases or duplicate keys, with YAML 1.2 floats."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                None, None, f"an alias (*{event.anchor}) — recipes use no anchors or aliases; write the value out",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(None, None, f"a key that is a {type(key).__name__}",
                                                        key_node.start_mark) from None
            if key in seen:
                lines = sorted({seen[key] + 1, key_node.start_mark.line + 1})
                raise _Refused(None, None, f"the key {key!r} twice (line {' and '.join(map(str, lines))}); each key "
                                           f"may appear once", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_StrictLoader.yaml_implicit_resolvers = {k: [r for r in v if r[0] != "tag:yaml.org,2002:float"]
                                         for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_12, list("-+0123456789."))


def _construct_float(loader, node):
    value = loader.construct_scalar(node)
    return float(value.replace("_", "").lower().replace(".inf", "inf").replace(".nan", "nan"))


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _reason(err: yaml.YAMLError) -> str:
    """One short line from a YAML error: the problem and where, never the (possibly huge) content."""
    problem = getattr(err, "problem", None) or type(err).__name__
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{' '.join(str(problem).split())[:200]}{where}"


def load_yaml(text: str | bytes, where: str):
    """The value of a YAML document, read strictly (see the module docstring); ValueError naming `where`."""
    text = utf8_text(text, where)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 — a SafeLoader subclass
    except _Refused as err:
        raise StrictYamlError(f"{where} is not a valid recipe: it holds {_reason(err)}.") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{where} is not valid YAML ({_reason(err)}).") from None
    except RecursionError:
        raise StrictYamlError(f"{where} nests too deeply to be read.") from None


def load_recipe_mapping(data: bytes, where: str) -> dict:
    """A recipe file's content: a non-empty YAML mapping of sections (ValueError naming `where` otherwise)."""
    value = load_yaml(data, where)
    if value is None:
        raise ValueError(f"{where} is empty; a recipe is a mapping of sections (data, model, train, pruning, eval), "
                         f"e.g. a copy of a shipped recipe.")
    if not isinstance(value, dict):
        raise ValueError(f"{where} holds a YAML {type(value).__name__}, not a mapping of recipe sections.")
    return value


def load_override_value(raw: str, where: str):
    """The value of a `--set key=value` (YAML, strictly: `{2: 0.5, 2: 0.6}` is refused, `1e-3` is a number);
    text that is not YAML at all stays the string it is."""
    try:
        return load_yaml(raw, where)
    except StrictYamlError:
        raise
    except ValueError:
        return raw


# -------------------------------------------------------------------------------------------------------------------
# the raw mapping into the recipe dataclasses, field by field against their annotations
# -------------------------------------------------------------------------------------------------------------------
def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _show(value) -> str:
    """`repr(value)`, cut to 80 characters (a huge value never floods the one-line message)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit for str()
        text = f"<an integer of more than {sys.get_int_max_str_digits()} digits>"
    return text if len(text) <= 80 else text[:77] + "..."


def coerce(value, tp, where: str):
    """Check `value` against the annotation `tp` (int, float, bool, str, list[...], dict[...]); ints pass as
    floats (finite ones: an int too large for a float is refused)."""
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ValueError(f"{where}: {_show(value)} is not a list of {_type_name(item)}.")
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {_show(value)} is not a mapping of {_type_name(key_tp)} to "
                             f"{_type_name(value_tp)}.")
        return {coerce(k, key_tp, f"{where} key"): coerce(v, value_tp, f"{where}[{k}]") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {_show(value)} is not a boolean (true/false).")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: {_show(value)} is not an integer.")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: {_show(value)} is not a number.")
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{where}: {_show(value)} is too large for a number.") from None
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: {_show(value)} is not a string.")
        return value
    raise TypeError(f"{where}: unsupported annotation {tp!r}")  # pragma: no cover


def build_dataclass(cls, data, where: str):
    """`cls(**data)` after checking every key exists in `cls` and every value against its annotation (nested
    dataclasses built the same way); errors name the recipe key (`where.key`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'recipe'}: expected a mapping of keys, got {_show(data)}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ValueError(f"{path}: unknown key; valid keys{' in ' + where if where else ''} are "
                             f"{', '.join(names)}.")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = build_dataclass(tp, value, path)
        else:
            kwargs[key] = coerce(value, tp, path)
    return cls(**kwargs)


__all__ = ["StrictYamlError", "build_dataclass", "coerce", "load_override_value", "load_recipe_mapping", "load_yaml"]
