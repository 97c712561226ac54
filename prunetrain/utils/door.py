"""Types at the door: one check of a public function's arguments against its type hints.

`@checked` on a public function (or on a class: its `__init__`, a dataclass's generated one included) checks every
argument the caller passed against the parameter's type hint before the function runs, strictly:

- a bool is never a number: `True` is refused where the hint admits `int` or `float` but not `bool`, and a bool
  hint admits only `True`/`False` (numpy's bool too), never a string such as 'no' or the number 1;
- a float must be finite (no NaN, no infinity) unless its hint is `AnyFloat`; an `int` is a float (PEP 484);
- `typing.Annotated` bounds written in this module (`PositiveInt`, `NonNegativeInt`, `Fraction01`, ...) are checked
  with the type: a negative count is refused where a count is meant;
- the typing grammar the package uses: `X | None`, `Literal[...]`, `tuple[X, ...]`, `list[X]`, `Sequence[X]` (a
  string is not a sequence of anything but characters: refused), `Mapping[K, V]`, `Iterable[X]` (its items are
  checked only when it is a list, tuple or set: a generator is never consumed by the check), `Callable`, classes.

A refused argument raises `ValueError` with one sentence naming the argument, the value and what is allowed, in
`prunetrain.utils.validate`'s words ("num_beams: True is not allowed; expected an integer >= 1."), so
the CLI reports it in one line with exit code 2. Only arguments the caller passed are checked (defaults are the
function's own business), hints are resolved once at the first call, and only doors are decorated: hot paths
(forward hooks, per-step code) never are.

Why not pydantic's `validate_call` or beartype: pydantic (not a dependency of prunetrain) converts rather than
checks unless in strict mode, admits NaN for a float even then, needs `arbitrary_types_allowed` for every torch type
and reports several lines; beartype would be a new dependency whose checks follow `isinstance`, so `True` passes as
an `int` and NaN as a `float`: the two mistakes this door exists for. The grammar the package uses fits in this
module, with the package's own messages.

`own=(...)`: a parameter whose function checks it with a message that says more than the door's (a record given as
a dict, an old keyword's value, a batch of the wrong shape) is left to that check; the door checks every other one,
and a body's own checks are for what a hint cannot say (ranges that depend on other arguments, the model, files).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import types
import typing
from collections import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

DOOR = "__prunetrain_door__"
"""The attribute `@checked` sets on the function (a class: on its `__init__`) it guards."""


@dataclass(frozen=True)
class Bounds:
    """A range a number must lie in (an `Annotated` marker): `minimum`/`maximum` inclusive unless `*_open`."""

    minimum: float | None = None
    maximum: float | None = None
    min_open: bool = False
    max_open: bool = False

    def admits(self, value) -> bool:
        if self.minimum is not None and (value <= self.minimum if self.min_open else value < self.minimum):
            return False
        return self.maximum is None or (value < self.maximum if self.max_open else value <= self.maximum)

    def text(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return (f"in {'(' if self.min_open else '['}{self.minimum:g}, {self.maximum:g}"
                    f"{')' if self.max_open else ']'}")
        if self.minimum is not None:
            return f"{'>' if self.min_open else '>='} {self.minimum:g}"
        return f"{'<' if self.max_open else '<='} {self.maximum:g}"


NON_FINITE = "non-finite allowed"
"""`Annotated[float, NON_FINITE]`: NaN and infinities are admitted (`AnyFloat`)."""

PositiveInt = Annotated[int, Bounds(minimum=1)]
NonNegativeInt = Annotated[int, Bounds(minimum=0)]
PositiveFloat = Annotated[float, Bounds(minimum=0, min_open=True)]
NonNegativeFloat = Annotated[float, Bounds(minimum=0)]
Fraction01 = Annotated[float, Bounds(minimum=0, maximum=1)]
AnyFloat = Annotated[float, NON_FINITE]

_UNION_TYPES = (Union, types.UnionType)
_STRINGS = (str, bytes)


def _numpy_kind(value) -> str | None:
    """'bool', 'int' or 'float' for a numpy scalar, else None (numpy is not imported for the check)."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(value, numpy.generic):
        return None
    if isinstance(value, numpy.bool_):
        return "bool"
    if isinstance(value, numpy.integer):
        return "int"
    return "float" if isinstance(value, numpy.floating) else None


def _is_int(value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or _numpy_kind(value) == "int"


def _is_bool(value) -> bool:
    return isinstance(value, bool) or _numpy_kind(value) == "bool"


def _is_float(value) -> bool:
    return _is_int(value) or (isinstance(value, float) or _numpy_kind(value) == "float")


def _admits_str(hint) -> bool:
    """Whether `hint` admits a str (then a string is a fine iterable of it)."""
    return hint is Any or hint is str or (get_origin(hint) in _UNION_TYPES and any(_admits_str(a) for a in
                                                                                   get_args(hint)))


def admits(value, hint) -> bool:
    """Whether `value` fits `hint` (module docstring)."""
    if hint is Any or hint is object or isinstance(hint, TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        base, markers = args[0], args[1:]
        if base is float and NON_FINITE in markers:
            return _is_float(value)
        if not admits(value, base):
            return False
        return all(m.admits(value) for m in markers if isinstance(m, Bounds))
    if origin in _UNION_TYPES:
        return any(admits(value, arm) for arm in args)
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if hint is bool:
        return _is_bool(value)
    if hint is int:
        return _is_int(value)
    if hint is float:
        return _is_float(value) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is None:
        return _admits_class(value, hint)
    return _admits_generic(value, origin, args)


def _admits_class(value, hint) -> bool:
    if not isinstance(hint, type):
        return True  # a hint the door does not read (a NewType, a string left unresolved by design)
    if getattr(hint, "_is_protocol", False) and not getattr(hint, "_is_runtime_protocol", False):
        return True  # a static-only Protocol cannot be checked at run time
    return isinstance(value, hint)


def _admits_generic(value, origin, args) -> bool:
    if origin is type:
        return isinstance(value, type) and (not args or not isinstance(args[0], type) or issubclass(value, args[0]))
    if origin is abc.Callable:
        return callable(value)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(admits(v, args[0]) for v in value)
        return not args or (len(args) == len(value) and all(admits(v, a) for v, a in zip(value, args)))
    if origin in (dict, abc.Mapping, abc.MutableMapping):
        if not isinstance(value, origin if origin is dict else abc.Mapping):
            return False
        key, item = args if args else (Any, Any)
        return all(admits(k, key) and admits(v, item) for k, v in value.items())
    item = args[0] if args else Any
    if origin in (list, set, frozenset):
        return isinstance(value, origin) and all(admits(v, item) for v in value)
    if origin in (abc.Sequence, abc.MutableSequence):
        if not isinstance(value, abc.Sequence) or isinstance(value, _STRINGS):
            return False
        return all(admits(v, item) for v in value)
    if origin in (abc.Iterable, abc.Collection, abc.Iterator, abc.Set):
        if not isinstance(value, origin) or (isinstance(value, _STRINGS) and not _admits_str(item)):
            return False
        if isinstance(value, (list, tuple, set, frozenset)):  # never consume a one-shot iterable
            return all(admits(v, item) for v in value)
        return True
    return isinstance(value, origin) if isinstance(origin, type) else True


def describe(hint) -> str:
    """What `hint` admits, in words ("an integer >= 1", "True or False"; None, the default as a rule, unsaid)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any or hint is object:
        return "any value"
    if hint is None or hint is type(None):
        return "None"
    if origin is Annotated:
        base, bounds = args[0], [m for m in args[1:] if isinstance(m, Bounds)]
        if base is float and NON_FINITE in args[1:]:
            return "a number"
        text = describe(base)
        return text + "".join(f" {b.text()}" for b in bounds)
    if origin in _UNION_TYPES:
        arms = [describe(a) for a in args if a is not type(None)]  # None (the default, as a rule) goes unsaid
        if int in args and float in args:
            arms = [a for a in arms if a != "an integer"]
        return " or ".join(dict.fromkeys(arms))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    simple = {bool: "True or False", int: "an integer", float: "a finite number", str: "a str"}
    if hint in simple:
        return simple[hint]
    if origin is None:
        return _a(str(getattr(hint, "__name__", hint)))
    if origin is abc.Callable:
        return "a callable"
    names = {tuple: "a tuple", list: "a list", dict: "a dict", abc.Mapping: "a mapping", abc.Sequence: "a sequence",
             abc.Iterable: "an iterable", set: "a set", type: "a class"}
    text = names.get(origin, f"a {getattr(origin, '__name__', origin)}")
    if args and origin in (tuple, list, set, abc.Sequence, abc.Iterable) and args[0] is not Any:
        text += f" of {_plural(describe(args[0]))}"
    elif len(args) == 2 and origin in (dict, abc.Mapping):
        text += f" from {_plural(describe(args[0]))} to {_plural(describe(args[1]))}"
    return text


_PLURALS = {"True or False": "bools", "an integer": "integers", "a finite number": "finite numbers", "a str": "strs",
            "a number": "numbers", "a callable": "callables"}


def _plural(text: str) -> str:
    """"an integer >= 1" -> "integers >= 1"; other descriptions are kept whole after "items that are"."""
    for single, many in _PLURALS.items():
        if text == single or text.startswith(single + " "):
            return many + text[len(single):]
    return f"items that are {text}"


def _a(name: str) -> str:
    """"an int", "a str": the article for a type name."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def refusal(argument: str, value, hint) -> str | None:
    """None when `value` fits `hint`, else the one sentence that refuses it."""
    if admits(value, hint):
        return None
    from prunetrain.utils.validate import allowed_text, short_repr

    choices = _literal_choices(hint)
    if choices is not None:  # `check_choice`'s words
        return f"{argument}: {short_repr(value)} is not one of {allowed_text(choices)}."
    return f"{argument}: {short_repr(value)} is not allowed; expected {describe(hint)}."


def _literal_choices(hint) -> list | None:
    """The values of a `Literal[...]` hint (None included for `Literal[...] | None`), else None."""
    arms = get_args(hint) if get_origin(hint) in _UNION_TYPES else (hint,)
    if not all(get_origin(a) is Literal or a is type(None) for a in arms):
        return None
    return [v for a in arms for v in (get_args(a) if get_origin(a) is Literal else (None,))]


def check(argument: str, value, hint):
    """`value` when it fits `hint`, else ValueError (`refusal`): the door for one value (a record's field, a CLI
    option)."""
    message = refusal(argument, value, hint)
    if message is not None:
        raise ValueError(message)
    return value


def resolve_hints(function: Callable, namespace: dict | None = None) -> dict[str, Any]:
    """The function's parameter hints as objects (`Annotated` kept), strings evaluated in `namespace` (default: the
    function's module). A hint that cannot be resolved is a defect of the package: TypeError names it."""
    if namespace is None:  # the module that defines it, under any decorators (torch.no_grad's lives in torch)
        namespace = getattr(inspect.unwrap(function), "__globals__", {})
    hints = {}
    for name, hint in inspect.get_annotations(function).items():
        if name == "return":
            continue
        if isinstance(hint, str):
            try:
                hint = eval(hint, {**vars(typing), **namespace})  # the package's own annotations
            except Exception as error:
                raise TypeError(f"{function.__qualname__}: the hint {hint!r} of {name!r} cannot be resolved "
                                f"({error}).") from error
        hints[name] = hint
    return hints


def _guard(function: Callable, namespace: dict | None = None, own: tuple[str, ...] = ()) -> Callable:
    signature = inspect.signature(function)
    unknown = set(own) - set(signature.parameters)
    if unknown:
        raise TypeError(f"{function.__qualname__}: own={sorted(unknown)} names no parameter.")
    hints: dict | None = None

    @functools.wraps(function)
    def door(*args, **kwargs):
        nonlocal hints
        if hints is None:
            hints = {k: v for k, v in resolve_hints(function, namespace).items() if k not in own}
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return function(*args, **kwargs)  # Python's own message for a missing or unknown argument
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if hint is None:
                continue
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                for item in value:
                    check(name, item, hint)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                for key, item in value.items():
                    check(key, item, hint)
            else:
                check(name, value, hint)
        return function(*args, **kwargs)

    setattr(door, DOOR, True)
    door.__wrapped__ = function
    door.resolve_hints = lambda: resolve_hints(function, namespace)
    door.own_checks = tuple(own)
    return door


def checked(target=None, *, own: tuple[str, ...] = ()):
    """Guard a public function, or a class's `__init__` (a dataclass's generated one too): every argument passed is
    checked against its hint before anything runs (module docstring). `own`: parameters the function checks itself
    with a message that says more than the door's (a record given as a dict, an old keyword's value): the door
    leaves them to it. `@checked` and `@checked(own=(...))` both work."""
    if target is None:
        return functools.partial(checked, own=tuple(own))
    if isinstance(target, type):
        if "__init__" not in vars(target) and is_checked(target):
            return target  # the inherited `__init__` is guarded already
        namespace = vars(sys.modules[target.__module__])
        target.__init__ = _guard(target.__init__, namespace, tuple(own))
        return target
    return _guard(target, own=tuple(own))


def is_checked(target) -> bool:
    """Whether `target` (a function, or a class through its `__init__`) is guarded by `@checked`."""
    function = target.__init__ if isinstance(target, type) else target
    return getattr(function, DOOR, False) is True


__all__ = [
    "DOOR",
    "NON_FINITE",
    "AnyFloat",
    "Bounds",
    "Fraction01",
    "NonNegativeFloat",
    "NonNegativeInt",
    "PositiveFloat",
    "PositiveInt",
    "admits",
    "check",
    "checked",
    "describe",
    "is_checked",
    "refusal",
    "resolve_hints",
]
