"""wait_for: the one way tests, benchmarks and chaos runs wait for another real thread or process."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

from plugmq.core.errors import PlugmqError
from plugmq.testing import WaitTimeout, seconds_until, wait_for


def test_returns_the_first_value_that_holds() -> None:
    calls = itertools.count(1)
    assert wait_for(lambda: next(calls), 5, "the third call", until=lambda n: n >= 3) == 3


def test_a_truthy_value_is_returned_as_it_is() -> None:
    values = iter([[], [], ["m"]])
    assert wait_for(lambda: next(values), 5, "a message") == ["m"]


def test_waits_for_another_thread() -> None:
    done = threading.Event()
    threading.Thread(target=done.set).start()
    assert wait_for(done.is_set, 5, "the thread to set the event") is True


def test_the_timeout_names_what_never_happened_and_the_last_value() -> None:
    calls = itertools.count(1)
    with pytest.raises(WaitTimeout) as caught:
        wait_for(lambda: next(calls), 0.05, "the slave to catch up", until=lambda n: n < 0)
    error = caught.value
    assert isinstance(error, AssertionError) and isinstance(error, PlugmqError)
    assert error.what == "the slave to catch up" and error.timeout == 0.05
    assert isinstance(error.last, int) and error.last >= 2, "polled more than once"
    assert str(error) == f"the slave to catch up never happened within 0.05 s (last value seen: {error.last})"


def test_a_zero_timeout_still_looks_once() -> None:
    assert wait_for(lambda: "ready", 0, "the value") == "ready"
    with pytest.raises(WaitTimeout, match=r"never happened within 0 s \(last value seen: ''\)"):
        wait_for(lambda: "", 0, "a non-empty string")


def test_ignored_errors_count_as_not_yet_and_are_reported() -> None:
    answers: Iterator[Exception | str] = iter([ConnectionRefusedError("not listening yet"), "up"])

    def probe() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for(probe, 5, "the broker to answer", ignoring=(ConnectionError,)) == "up"

    def refused() -> str:
        raise ConnectionRefusedError("not listening yet")

    with pytest.raises(WaitTimeout, match="last error: ConnectionRefusedError: not listening yet"):
        wait_for(refused, 0.02, "the broker to answer", ignoring=(ConnectionError,))


def test_other_errors_propagate_at_once() -> None:
    def broken() -> bool:
        raise KeyError("status")

    with pytest.raises(KeyError):
        wait_for(broken, 5, "the status", ignoring=(ConnectionError,))


def test_a_long_last_value_is_shortened() -> None:
    with pytest.raises(WaitTimeout) as caught:
        wait_for(lambda: "x" * 10_000, 0, "a short string", until=lambda s: len(s) < 10)
    assert len(str(caught.value)) < 400


def test_a_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout must be 0 or more seconds, not -1"):
        wait_for(lambda: True, -1, "anything")


def test_seconds_until_measures_the_wait() -> None:
    calls = itertools.count(1)
    took = seconds_until(lambda: next(calls) >= 3, 5, "the third call", interval=0.01)
    assert took >= 0.02, "two pauses of 10 ms before the third call"
