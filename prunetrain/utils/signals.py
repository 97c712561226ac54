"""SIGINT and SIGTERM around steps that must not be cut in half (prunetrain.utils.output_paths, rule 3).

`signals_raise`: SIGTERM raises `Terminated` as SIGINT raises `KeyboardInterrupt`, so `finally` blocks clean up for
both. `signals_held`: both are held back and act when the block ends, so the steps inside run to the end.

While the outermost `signals_raise` lasts (`signals_held` enters one), the main thread's SIGINT and SIGTERM handlers
are `_on_signal`: inside `signals_held` it only notes the signal, outside it acts (`_act`). Two ways CPython loses
or leaks a signal, and how each is closed:

- Blocking a signal in the main thread does not hold it in the process: the kernel hands a process-wide signal to
  a thread that does not block it (torch's worker threads), whose C handler asks the main thread to run the Python
  handler at its next bytecode, inside the held steps. Hence the noting handler, on top of the main thread's mask.
- A Python handler runs some time after the signal came, and `signal.signal` checks for due signals and only then
  installs the new handler: a signal landing in between is dropped when the new handler is the default action.
  Hence the handlers are put back with the signals blocked and noted, and a noted one is sent again, to meet the
  handler put back (`_put_back`). Another thread can still receive the signal in those instants; CPython's C handler
  then writes its number to the wakeup fd, which is watched while the handlers are put back (`_signals_seen`).

What remains open: in a process with other threads, a SIGTERM whose C handler starts in another thread just before
the default action is put back and finishes after the wakeup fd is restored is still dropped (CPython reports
"Signal 15 ignored due to race condition"). Measured with a loop that does nothing but enter and leave a held block
beside an idle thread: about 1 SIGTERM in 100–400 is lost; with real work in the loop the put-back is a far smaller
share of the time. Closing it would mean keeping a Python SIGTERM handler installed while other threads exist.

Only the main thread may change handlers; in other threads `signals_held` blocks the signals in the thread's own
mask and `signals_raise` does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)
_saved: dict[int, object] = {}  # the handlers `_on_signal` replaced, put back when the outermost signals_raise ends
_noted: list[int] = []  # signals that came while held, acted on when the outermost signals_held ends
_depth = {"raise": 0, "hold": 0}
_terminated = {"fired": False}
_DEFAULT = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
_cleanups: list = []  # run before a signal's exception is raised (`cleanup_on_signal`)


class Terminated(SystemExit):
    """SIGTERM arrived while prunetrain held a staging directory: raised so that cleanup runs as for SIGINT (exit
    status 128 + SIGTERM, as a process killed by SIGTERM reports in a shell)."""

    def __init__(self):
        super().__init__(128 + signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _mask(how: int, signals) -> set | None:
    """pthread_sigmask where the platform has it (returns the previous mask), else nothing."""
    return signal.pthread_sigmask(how, signals) if hasattr(signal, "pthread_sigmask") else None


def _act(signum: int, frame) -> None:
    """What a signal does outside held steps: SIGTERM whose action was the default raises `Terminated`, once (a
    second SIGTERM must not interrupt the cleanup the first one started); otherwise the replaced handler runs
    (for SIGINT Python's own, which raises KeyboardInterrupt)."""
    handler = _saved.get(signum, _DEFAULT[signum])  # (the default too for a handler left behind by an interrupt)
    if signum == signal.SIGTERM and handler is signal.SIG_DFL:
        if not _terminated["fired"]:
            _terminated["fired"] = True
            _run_cleanups()
            raise Terminated()
    elif callable(handler):
        if handler is signal.default_int_handler:
            _run_cleanups()
        handler(signum, frame)


def _run_cleanups() -> None:
    for cleanup in reversed(_cleanups):
        cleanup()


@contextlib.contextmanager
def cleanup_on_signal(cleanup) -> Iterator[None]:
    """Run `cleanup()` (idempotent) before the exception a SIGINT or SIGTERM raises inside this block, wherever it
    lands — also in the instants between the end of the block's body and its `finally`, where the exception would
    otherwise skip the cleanup that `finally` was about to do. Main thread only; elsewhere a plain block."""
    main = _main_thread()
    if main:
        _cleanups.append(cleanup)
    try:
        yield
    finally:
        if main:
            _cleanups.remove(cleanup)


def _on_signal(signum: int, frame) -> None:
    """The main thread's SIGINT and SIGTERM handler while prunetrain guards a step: noted inside held steps, else
    acted on."""
    if _depth["hold"] > 0:
        if signum not in _noted:
            _noted.append(signum)
    else:
        _act(signum, frame)


def _install() -> None:
    _terminated["fired"] = False
    for signum in HELD:
        current = signal.getsignal(signum)
        if callable(current) or (signum == signal.SIGTERM and current is signal.SIG_DFL):
            _saved[signum] = current  # an ignored or C-level disposition is left as it is
            signal.signal(signum, _on_signal)


@contextlib.contextmanager
def _signals_seen() -> Iterator[set[int]]:
    """The signals whose C-level handler ran while inside, also one whose Python handler will never run: CPython
    writes each signal's number to the wakeup fd, set here to a pipe (a wakeup fd set before, asyncio's, gets the
    bytes passed on)."""
    seen: set[int] = set()
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end)
    try:
        yield seen
    finally:
        signal.set_wakeup_fd(previous)
        try:
            data = os.read(read_end, 1024)
        except BlockingIOError:
            data = b""
        os.close(read_end)
        os.close(write_end)
        seen.update(data)
        if data and previous >= 0:
            with contextlib.suppress(OSError):
                os.write(previous, data)


def _put_back() -> None:
    """Put the replaced handlers back, with the signals blocked and noted meanwhile. A signal that came in the switch
    is sent again and, once unblocked, meets the handler put back (SIGTERM's default action: the process ends by
    SIGTERM): one noted by `_on_signal`, or one that another thread received in the instants in which `signal.signal`
    had checked for due signals but not yet installed the default action (seen on the wakeup fd)."""
    _depth["hold"] += 1  # from here a signal already due is noted, not acted on half-way
    old_mask = None
    seen: set[int] = set()
    try:
        old_mask = _mask(signal.SIG_BLOCK, ())
        _mask(signal.SIG_BLOCK, HELD)
        with _signals_seen() if old_mask is not None else contextlib.nullcontext(set()) as seen:
            for signum, handler in list(_saved.items()):
                if signal.getsignal(signum) is _on_signal:  # a handler someone else installed meanwhile stays
                    signal.signal(signum, handler)
        _saved.clear()
    finally:
        _depth["hold"] -= 1
        lost = [signum for signum in HELD if signum in seen and not callable(signal.getsignal(signum))]
        again = set(_noted) | set(lost)
        _noted.clear()
        for signum in sorted(again):
            if not (signum == signal.SIGTERM and _terminated["fired"]):  # a first SIGTERM already ends the process
                os.kill(os.getpid(), signum)  # pending while this thread blocks it
        if old_mask is not None:
            _mask(signal.SIG_SETMASK, old_mask)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While inside: SIGTERM raises `Terminated` (where its action was the default), so `finally` blocks run for
    SIGTERM as they do for SIGINT. Re-entrant; the outermost block puts the handlers back when it ends."""
    if not _main_thread():
        yield
        return
    outermost = _depth["raise"] == 0
    _depth["raise"] += 1
    try:
        if outermost:
            _install()
        yield
    finally:
        _depth["raise"] -= 1
        if outermost:
            _put_back()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM are held back while inside and act when the outermost block ends, so the steps inside run
    to the end. Re-entrant; the thread's mask is restored whatever happens, also when a signal already due
    interrupts the entry."""
    old_mask = _mask(signal.SIG_BLOCK, ())  # the current mask; nothing changed yet
    if not _main_thread():
        try:
            _mask(signal.SIG_BLOCK, HELD)
            yield
        finally:
            _mask(signal.SIG_SETMASK, old_mask)
        return
    with signals_raise():
        _depth["hold"] += 1
        try:
            _mask(signal.SIG_BLOCK, HELD)
            yield
        finally:
            if old_mask is not None:
                _mask(signal.SIG_SETMASK, old_mask)  # a signal that waited is noted now
            _depth["hold"] -= 1
            if _depth["hold"] == 0 and _noted:
                noted = list(_noted)
                _noted.clear()
                for signum in noted:  # the first to raise ends the block
                    _act(signum, None)


__all__ = ["HELD", "Terminated", "cleanup_on_signal", "signals_held", "signals_raise"]
