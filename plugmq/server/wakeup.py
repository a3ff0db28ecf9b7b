"""What wakes long-polling receives: stored messages, acks, and invisible times running out."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from plugmq.core import hookimpl
from plugmq.core.clock import Clock
from plugmq.core.message import StoredMessage

__all__ = ["DeadlineTimer", "StoredObserver", "Wakeup"]


class Wakeup:
    """A generation counter receivers wait on. Read ``generation`` before looking for messages and
    pass it to ``wait``: a notification between the look and the wait is not missed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.generation = 0
        self._event = asyncio.Event()
        self._pending = False
        self._lock = threading.Lock()

    def notify(self) -> None:
        """Wake every waiter (event-loop thread only)."""
        with self._lock:
            self._pending = False
        self.generation += 1
        self._event.set()
        self._event = asyncio.Event()

    def notify_threadsafe(self) -> None:
        """Wake every waiter from any thread; bursts collapse into one wake-up."""
        with self._lock:
            if self._pending:
                return
            self._pending = True
        try:
            self._loop.call_soon_threadsafe(self.notify)
        except RuntimeError:
            pass  # loop closed: nobody is waiting any more

    async def wait(self, generation: int, timeout: float) -> None:
        if generation != self.generation or timeout <= 0:
            return
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass


class StoredObserver:
    """A hook implementation registered on the broker: every stored message wakes receivers
    (sends, delayed messages coming due, committed transactions, DLQ copies)."""

    def __init__(self, wakeup: Wakeup) -> None:
        self._wakeup = wakeup

    @hookimpl
    def plugmq_message_stored(self, broker_name: str, message: StoredMessage) -> None:
        self._wakeup.notify_threadsafe()


class DeadlineTimer:
    """One broker-clock timer at the earliest invisible deadline; ``fire`` runs when it passes.

    Later deadlines than the armed one need no timer: when it fires, ``fire`` returns the next one.
    """

    def __init__(self, clock: Clock, fire: Callable[[], None]) -> None:
        self._clock = clock
        self._fire = fire
        self._lock = threading.Lock()
        self._armed: int | None = None
        self._closed = False

    def arm(self, deadline_ms: int | None) -> None:
        if deadline_ms is None:
            return
        with self._lock:
            if self._closed or (self._armed is not None and self._armed <= deadline_ms):
                return
            self._armed = deadline_ms
        self._clock.call_at(deadline_ms / 1000, lambda: self._due(deadline_ms))

    def _due(self, deadline_ms: int) -> None:
        with self._lock:
            if self._closed or self._armed != deadline_ms:
                return  # superseded by an earlier deadline, whose firing re-arms
            self._armed = None
        self._fire()

    def close(self) -> None:
        with self._lock:
            self._closed = True
