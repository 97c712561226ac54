"""Argument checks shared by the whole package: one function per kind of mistake, one exception type per mistake.

Every check raises `ValueError` (a value of the wrong type counts as a wrong value: `TypeError` is never used for user
input, so callers and the CLI catch one type) with one sentence that names the argument, the value given and what
is allowed. The CLI turns these into one line on stderr and exit code 2.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

ALL_BATCHES: int | None = None
"""`max_batches=ALL_BATCHES` (None): use every batch the source yields."""


def allowed_text(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def short_repr(value: Any) -> str:
    """`repr(value)` cut to 60 characters, for one-line messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_choice(argument: str, value: Any, allowed: Sequence[Any]) -> Any:
    """`value` must be one of `allowed`."""
    if isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed):
        raise ValueError(f"{argument}: {value!r} is not one of {allowed_text(allowed)}.")
    if value not in allowed:
        raise ValueError(f"{argument}: {value!r} is not one of {allowed_text(allowed)}.")
    return value


def check_bool(argument: str, value: Any) -> bool:
    """`value` must be a real bool (numpy's bool too): a string such as 'no' or a number is refused, never read as
    its truth value."""
    import numpy

    if isinstance(value, numpy.bool_):
        return bool(value)
    if not isinstance(value, bool):
        raise ValueError(f"{argument}: {value!r} is not allowed; expected True or False.")
    return value


def check_finite_float(argument: str, value: Any) -> float:
    """A finite real number of any sign (not a bool, a string, NaN or an infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{argument}: {value!r} is not allowed; expected a finite number.")
    return float(value)


def check_int(argument: str, value: Any, minimum: int = 1) -> int:
    """`value` must be an int (not a bool) >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{argument}: {value!r} is not allowed; expected an integer >= {minimum}.")
    return value


def check_ints(argument: str, values: Any, minimum: int = 1) -> tuple[int, ...]:
    """A non-empty sequence of ints >= `minimum`."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{argument}: {values!r} is not a list of integers >= {minimum}.")
    values = tuple(values)
    if not values:
        raise ValueError(f"{argument}: {values!r} is empty; give at least one integer >= {minimum}.")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{argument}: {value!r} is not allowed; expected integers >= {minimum}.")
    return values


def check_positive_float(argument: str, value: Any, allow_zero: bool = False) -> float:
    """A finite real number > 0 (or >= 0 with `allow_zero`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{argument}: {value!r} is not allowed; expected a finite number {bound}.")
    return float(value)


def check_level(argument: str, value: Any) -> float:
    """A significance level: a number strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{argument}: {value!r} is not allowed; expected a significance level in (0, 1).")
    return float(value)


def check_fraction(argument: str, value: Any) -> float:
    """A float (or int 0/1) in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{argument}: {value!r} is not a fraction in [0, 1].")
    return float(value)


def check_open_fraction(argument: str, value: Any) -> float:
    """A float strictly between 0 and 1 (a share that removes something and leaves something)."""
    if isinstance(value, bool) or not isinstance(value, float) or not 0.0 < value < 1.0:
        raise ValueError(f"{argument}: {value!r} is not a share in (0, 1); give a float such as 0.5.")
    return value


def check_amount(argument: str, amount: Any) -> int | float:
    """One convention for amounts of heads: a float in [0, 1] is a fraction of the heads, an int >= 0 a count."""
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        raise ValueError(f"{argument}: {amount!r} is not an amount; use a fraction (float in [0, 1]) or a count "
                         f"(int >= 0) of heads.")
    if isinstance(amount, float) and not 0.0 <= amount <= 1.0:  # also rejects nan
        raise ValueError(f"{argument}: {amount!r} is not a fraction in [0, 1] (a float is a fraction of the heads, "
                         f"an int a count).")
    if isinstance(amount, int) and amount < 0:
        raise ValueError(f"{argument}: {amount!r} is negative; a count of heads is an int >= 0.")
    return amount


def check_amount_convention(argument: str, amounts: Iterable[Any]) -> None:
    """One convention for a schedule's amounts (a float a fraction, an int a count), made unambiguous: in a schedule
    that also holds fractions, an int 1 could be meant as "all of them" — it is refused (write 1.0 for all heads, or
    give every amount as a count). Other mixes are clear (2, 12, ... can only be counts) and are ordered by the head
    counts they mean (`prunetrain.training.points.amount_decreases`)."""
    plain = [a for a in amounts if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if any(isinstance(a, float) and a != 0 for a in plain) and any(isinstance(a, int) and a == 1 for a in plain):
        raise ValueError(f"{argument}: mixes fractions (floats) with the count 1, which is one head, not all of "
                         f"them; write 1.0 for all heads, or give every amount as a count.")


def check_kinds(argument: str, kinds: Any, allowed: Sequence[str]) -> list[str] | None:
    """None (all kinds), one kind or a non-empty list of kinds, each one of `allowed` (the attention kinds)."""
    if kinds is None:
        return None
    chosen = [kinds] if isinstance(kinds, str) else list(kinds)
    if not chosen:
        raise ValueError(f"{argument}: an empty selection; give None (all kinds) or some of {', '.join(allowed)}.")
    for kind in chosen:
        if kind not in allowed:
            raise ValueError(f"{argument}: {kind!r} is not an attention kind; allowed: {', '.join(allowed)}.")
    return chosen


def check_sentences(argument: str, sources: Any) -> list[str]:
    """Sentences to translate as a list of str, read from any iterable (a generator too, read once): a bare string
    (one text, which would be translated character by character) or a non-string sentence is refused."""
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Iterable):
        raise ValueError(f"{argument}: {short_repr(sources)} is not a list of sentences; pass a list of str (one "
                         f"sentence per item, e.g. [text] for one).")
    sources = list(sources)
    for index, source in enumerate(sources):
        if not isinstance(source, str):
            raise ValueError(f"{argument}: item {index + 1} is {short_repr(source)}, not a str sentence.")
    return sources


def check_fractions(argument: str, fractions: Any) -> list[float]:
    """A non-empty list of fractions in [0, 1], returned sorted without duplicates."""
    if isinstance(fractions, (str, bytes)) or not isinstance(fractions, Iterable):
        raise ValueError(f"{argument}: {fractions!r} is not a list of fractions in [0, 1].")
    out = []
    for f in fractions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
            raise ValueError(f"{argument}: {f!r} is not a fraction in [0, 1] (e.g. 0.1 for 10 % of the heads).")
        out.append(float(f))
    if not out:
        raise ValueError(f"{argument}: give at least one fraction in [0, 1].")
    return sorted(set(out))
