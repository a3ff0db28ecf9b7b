"""Waiting for real threads and processes: poll a condition until it holds or a deadline passes.

Tests, benchmarks and ``plugmq chaos`` wait this one way. The deadline is not a timed assertion: it
only keeps a broken build (or a fault that really lost something) from hanging, so it is generous.
When it passes, :class:`WaitTimeout` names what never happened and the last value the condition
gave, which is usually the fastest way to see why.
"""

from __future__ import annotations

import reprlib
import time
from collections.abc import Callable
from typing import TypeVar

from plugmq.core.errors import PlugmqError

__all__ = ["WAIT_S", "WaitTimeout", "seconds_until", "wait_for"]

T = TypeVar("T")

#: The bound tests use when waiting for another real thread or a child process on loopback.
WAIT_S = 20.0

_repr = reprlib.Repr()
_repr.maxstring = 200
_repr.maxother = 200


class WaitTimeout(PlugmqError, AssertionError):
    """A condition polled by :func:`wait_for` did not hold before its deadline.

    An AssertionError, so a test fails on it as on an assert; a PlugmqError, so the CLI reports it
    as a line, not a traceback.
    """

    def __init__(self, what: str, timeout: float, last: object, error: BaseException | None) -> None:
        self.what = what
        self.timeout = timeout
        self.last = last
        self.error = error
        seen = f"last value seen: {_repr.repr(last)}"
        if error is not None:
            seen += f"; last error: {type(error).__name__}: {error}"
        super().__init__(f"{what} never happened within {timeout:g} s ({seen})")


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    *,
    until: Callable[[T], object] = bool,
    ignoring: tuple[type[Exception], ...] = (),
    interval: float = 0.01,
) -> T:
    """Call ``condition`` every ``interval`` seconds until ``until(value)`` holds; return that value.

    ``what`` names the awaited event ("the slave to catch up"). Exceptions of the ``ignoring``
    types count as "not yet" (a broker still starting refuses connections). The condition is
    always tried once more after the deadline, so a slow condition still gets its last look.
    Raises :class:`WaitTimeout` with the last value (and the last ignored error) seen.
    """
    if timeout < 0:
        raise ValueError(f"timeout must be 0 or more seconds, not {timeout!r}")
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        expired = time.monotonic() >= deadline
        try:
            value = condition()
        except ignoring as exc:
            error = exc
        else:
            if until(value):
                return value
            last, error = value, None
        if expired:
            raise WaitTimeout(what, timeout, last, error)
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def seconds_until(
    condition: Callable[[], object],
    timeout: float,
    what: str,
    *,
    ignoring: tuple[type[Exception], ...] = (),
    interval: float = 0.01,
) -> float:
    """:func:`wait_for` that returns how many seconds the wait took (failover and route times)."""
    started = time.monotonic()
    wait_for(condition, timeout, what, ignoring=ignoring, interval=interval)
    return time.monotonic() - started
