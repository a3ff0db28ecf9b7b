"""One thread that runs small broker calls for the event loop and answers them in bursts.

A thread pool wakes one of its threads per call and posts one loop callback per answer; under a
steady load of small calls (a client acks each message with its own AckMessage) those wake-ups
cost more CPU than the calls. Here the thread runs whatever calls queued up while it was busy,
in order, and hands all their answers to the loop in one callback.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from plugmq.server.protocol import Code
from plugmq.server.status import RpcFailure

__all__ = ["LoopWorker"]

T = TypeVar("T")
_Call = tuple[asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]]


class LoopWorker:
    """``await worker.run(fn, *args)`` runs ``fn`` on the worker thread (calls run one at a time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` (event-loop thread); the future holds its result or exception."""
        if self._closed:
            raise RpcFailure(Code.INTERNAL_SERVER_ERROR, "the server is shutting down; call it again once it is "
                                                         "back")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put((future, fn, args))
        return future

    def _serve(self) -> None:
        while True:
            call = self._queue.get()
            answers: list[tuple[asyncio.Future[Any], bool, Any]] = []
            while call is not None:
                future, fn, args = call
                try:
                    answers.append((future, True, fn(*args)))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    answers.append((future, False, exc))
                try:
                    call = self._queue.get_nowait()
                except queue.Empty:
                    break
            if answers:
                try:
                    self._loop.call_soon_threadsafe(_answer, answers)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits for these answers any more
            if call is None:
                return

    def close(self) -> None:
        """Run what is queued, then stop the thread (event-loop thread)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()


def _answer(answers: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in answers:
        if future.done():
            continue  # the call was cancelled (client gone)
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
