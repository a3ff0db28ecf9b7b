"""What wakes long-polling receives: stored messages and invisible times running out (the
server is one of the broker's arrival listeners), and acks."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Wakeup"]


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

