"""The history of a chaos run: every operation with its outcome and times, as JSON lines.

Times are seconds since the run began (``t0`` when an operation was invoked, ``t1`` when its
outcome came). One line per event, ``{"kind": ..., fields...}``:

* ``send``: a producer's send of a unique ``body`` (``producer`` thread, its ``seq``); ``ok``
  with the receipt's ``msg_id``, ``offset`` and the ``broker`` that acked it, or the ``error``;
* ``receive``: one receive call of a consumer of ``group`` (``count`` messages, or an error);
* ``delivery``: one message a receive handed out: ``queue``, ``offset`` and delivery ``attempt``;
* ``ack``: the ack of one delivery, ``ok`` or the error;
* ``fault``: a fault's window (``t0`` injected, ``t1`` healed) with its name, round and target;
* ``role``: what a broker said it was (``role``, ``epoch``) at ``t``;
* ``readback``: one message drained through the current master after the run.

:func:`load_history` reads such a file back (the checker runs on it as on a live history).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import attrs

from plugmq.core.clock import Clock, SystemClock

__all__ = ["Ack", "Delivery", "Event", "FaultWindow", "History", "Readback", "Receive", "RoleSample", "Send",
           "load_history"]


@attrs.frozen
class Send:
    t0: float
    t1: float
    producer: str
    seq: int
    body: str
    ok: bool
    msg_id: str | None = None
    queue: int | None = None
    offset: int | None = None
    error: str | None = None
    broker: str = ""  # the broker the send went to (its name in the run, or its endpoint)


@attrs.frozen
class Receive:
    t0: float
    t1: float
    consumer: str
    group: str
    ok: bool
    count: int = 0
    error: str | None = None


@attrs.frozen
class Delivery:
    t0: float  # the receive call that handed it out was invoked
    t1: float  # ... and answered
    consumer: str
    group: str
    body: str
    msg_id: str
    queue: int | None
    offset: int | None
    attempt: int
    endpoint: str = ""


@attrs.frozen
class Ack:
    t0: float
    t1: float
    consumer: str
    group: str
    body: str
    msg_id: str
    queue: int | None  # the delivery's position (which stored copy was acked)
    offset: int | None
    ok: bool
    error: str | None = None


@attrs.frozen
class FaultWindow:
    t0: float  # injected
    t1: float  # healed
    name: str
    round: int
    target: str
    detail: str = ""


@attrs.frozen
class RoleSample:
    """A broker's role and epoch as sampled; ``acked``: the sends it answered OK itself so far, by
    the epoch it held (str keys), when its status says (brokers that forward clients to their
    master make the broker a client addressed a poor guess of who acked)."""

    t: float
    broker: str
    role: str
    epoch: int | None = None
    acked: dict[str, int] | None = None


@attrs.frozen
class Readback:
    t: float
    body: str
    msg_id: str
    queue: int | None
    offset: int | None


Event = Send | Receive | Delivery | Ack | FaultWindow | RoleSample | Readback
_KINDS: dict[str, type[Any]] = {"send": Send, "receive": Receive, "delivery": Delivery, "ack": Ack,
                                "fault": FaultWindow, "role": RoleSample, "readback": Readback}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


def to_json(event: Event) -> str:
    return json.dumps({"kind": _KIND_OF[type(event)], **attrs.asdict(event)}, separators=(",", ":"))


def from_json(line: str, *, where: str = "<history>") -> Event:
    try:
        fields = json.loads(line)
        kind = fields.pop("kind")
        event: Event = _KINDS[kind](**fields)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{where}: not a chaos history event ({exc}): {line[:200]!r}") from None
    return event


def load_history(path: Path) -> list[Event]:
    """The events of a history file written by :class:`History`, in the order written."""
    with path.open(encoding="utf-8") as file:
        return [from_json(line, where=f"{path}:{number}") for number, line in enumerate(file, 1) if line.strip()]


class History:
    """Records events from many threads; written through to ``path`` (JSON lines) when given."""

    def __init__(self, path: Path | None = None, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._start = self._clock.now()
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._file: IO[str] | None = path.open("w", encoding="utf-8") if path is not None else None

    def now(self) -> float:
        """Seconds since the history began (the time base of every event)."""
        return self._clock.now() - self._start

    def restart_clock(self) -> None:
        """Count times from now on (before any event is recorded: a run's set-up is not its history)."""
        with self._lock:
            if self._events:
                raise RuntimeError("the history already has events; their times would be shifted")
            self._start = self._clock.now()

    def record(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
            if self._file is not None:
                self._file.write(to_json(event) + "\n")

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.record(event)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
