"""What wakes long-polling receives: stored messages and invisible times running out (the
server is one of the broker's arrival listeners), and acks."""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Wakeup"]


class Wakeup:
    """A generation counter receivers wait on. Read ``generation`` before looking for messages and
    pass it to ``wait``: a notification between the look and the wait is not missed.

    A send stored on the event loop's own thread notifies directly: a counter increment, and an
    event set only when a receiver waits. Other threads go through the loop (one self-pipe wake-up
    per burst)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # built on the loop's thread
        self.generation = 0
        self._event = asyncio.Event()
        self._waiting = 0
        self._pending = False
        self._lock = threading.Lock()

    def notify(self) -> None:
        """Wake every waiter (event-loop thread only)."""
        if self._pending:
            with self._lock:
                self._pending = False
        self.generation += 1
        if self._waiting:
            self._event.set()
            self._event = asyncio.Event()

    def notify_threadsafe(self) -> None:
        """Wake every waiter from any thread; bursts from other threads collapse into one wake-up."""
        if threading.get_ident() == self._loop_thread:
            self.notify()
            return
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
        self._waiting += 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1
