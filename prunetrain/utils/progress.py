"""Progress bars for long work (translation batches, importance batches, curve points, studies, training).

The library is quiet by default. The command line turns bars on when stderr is a terminal, or always with
`PRUNETRAIN_PROGRESS=1` (`0` turns them off). Bars go to stderr, so a command's stdout stays pure JSON.
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")
ENV = "PRUNETRAIN_PROGRESS"
_enabled = False


def enable(flag: bool | None = None) -> bool:
    """Turn bars on or off; `None` decides from `$PRUNETRAIN_PROGRESS`, else whether stderr is a terminal."""
    global _enabled
    if flag is None:
        env = os.environ.get(ENV)
        flag = env == "1" if env in ("0", "1") else sys.stderr.isatty()
    _enabled = bool(flag)
    return _enabled


def enabled() -> bool:
    return _enabled


def bar(iterable: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it") -> Iterable[T]:
    """`iterable` wrapped in a tqdm bar on stderr when bars are on, else `iterable` itself."""
    if not _enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                mininterval=0.5)
