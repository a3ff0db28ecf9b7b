"""The thread that stores SendMessage calls whose appends may wait (sync flush, replication)."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Sequence

from plugmq.server.protocol import Code, service_pb2
from plugmq.server.send import Sender
from plugmq.server.sendcheck import CheckedSend, SendRequest
from plugmq.server.status import RpcFailure

__all__ = ["SendWorker"]


class SendWorker:
    """One thread that stores what SendMessage calls hand it: one hop off the event loop per call.

    Calls that arrive while the thread is storing wait together and are stored together (group
    commit): their messages for one queue become one store batch, and all their answers go back
    to the event loop in one callback.
    """

    def __init__(self, sender: Sender, loop: asyncio.AbstractEventLoop) -> None:
        self._sender = sender
        self._loop = loop
        self._queue: queue.SimpleQueue[tuple[asyncio.Future[service_pb2.SendMessageResponse], SendRequest | CheckedSend] | None] \
            = queue.SimpleQueue()
        self._closed = False
        self._unanswered = 0  # calls submitted and not answered yet (event-loop thread only)
        self._thread = threading.Thread(target=self._run, name="plugmq-serve-send", daemon=True)
        self._thread.start()

    @property
    def sender(self) -> Sender:
        return self._sender

    def stores_on_loop(self, calls: Sequence[CheckedSend], sends_wait: bool) -> bool:
        """Whether ``calls`` may be stored on the event loop now (event-loop thread), which costs
        less than the hop to the thread and back. Only when nothing can block the loop and every
        rule holds as on the thread: the broker's sends do not wait (``sends_wait``: no sync flush,
        no replication, so no wait for a slave and no fencing), every message is a normal or FIFO
        one (delayed and transactional ones go to plugins that may wait), and the thread has no
        call unanswered: calls are stored in the order they came, and a client's retry is looked
        up in RecentSends only after its first try was stored."""
        return not sends_wait and self._unanswered == 0 and all(call.on_loop for call in calls)

    def submit(self, request: SendRequest | CheckedSend) -> asyncio.Future[service_pb2.SendMessageResponse]:
        """Queue a call's messages (event-loop thread); the future holds its response."""
        if self._closed:
            raise RpcFailure(Code.INTERNAL_SERVER_ERROR, "the server is shutting down; send to it again once it "
                                                         "is back")
        future: asyncio.Future[service_pb2.SendMessageResponse] = self._loop.create_future()
        self._unanswered += 1
        self._queue.put((future, request))
        return future

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            work = []
            while item is not None:
                work.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if work:
                self._store(work)
            if item is None:
                return

    def _store(self, work: list[tuple[asyncio.Future[service_pb2.SendMessageResponse], SendRequest | CheckedSend]]) -> None:
        try:
            answers: list[service_pb2.SendMessageResponse] | BaseException = self._sender.send(
                [request for _future, request in work])
        except Exception as exc:  # noqa: BLE001 - every waiting call is answered with it
            answers = exc
        try:
            self._loop.call_soon_threadsafe(self._answered, [future for future, _request in work], answers)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for these answers any more

    def _answered(self, futures: list[asyncio.Future[service_pb2.SendMessageResponse]],
                  answers: list[service_pb2.SendMessageResponse] | BaseException) -> None:
        self._unanswered -= len(futures)
        _answer(futures, answers)

    def close(self) -> None:
        """Store what is queued, then stop the thread (event-loop thread)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()


def _answer(futures: list[asyncio.Future[service_pb2.SendMessageResponse]],
            answers: list[service_pb2.SendMessageResponse] | BaseException) -> None:
    for i, future in enumerate(futures):
        if future.done():
            continue  # the call was cancelled (client gone)
        if isinstance(answers, BaseException):
            future.set_exception(answers)
        else:
            future.set_result(answers[i])
