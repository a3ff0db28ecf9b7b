"""What wakes long-polling receives: stored messages, acks, and invisible times running out
(the broker's pop service calls its deadline listeners)."""

from __future__ import annotations

import asyncio
import threading

from plugmq.core import hookimpl
from plugmq.core.message import StoredMessage

__all__ = ["StoredObserver", "Wakeup"]


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
