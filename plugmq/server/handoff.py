"""The hand-off between front-end worker processes and the process that owns the store.

With ``[server] workers = N``, N front-end processes accept the clients' connections on the port
(SO_REUSEPORT) and check SendMessage calls; they hand the checked messages to the owner over a
Unix socket, every call that arrived in one event-loop turn in one frame. The owner stores them
(the log keeps one writer: the owner's) and answers each call with its serialized
SendMessageResponse, which the front-end returns as it is.

A frame is a 4-byte big-endian length and a pickle of ``(frame id, [call, ...])``; an answer frame
is ``(frame id, [response bytes, ...])``. The socket lives in a directory only the server's user
may enter (mode 0700) and only the owner's own children connect to it, so pickle is never read
from a stranger.
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from plugmq.core.logs import get_logger
from plugmq.core.message import Message
from plugmq.server.convert import Outgoing
from plugmq.server.protocol import Code, service_pb2
from plugmq.server.send import CheckedSend
from plugmq.server.status import RpcFailure

__all__ = ["HandoffClient", "decode_call", "encode_call", "serve_handoff"]

log = get_logger(__name__)

_FRAME = struct.Struct(">I")
_MAX_FRAME = 1 << 31  # the length field's own limit; frames are bounded by the calls' own limits
_Call = tuple[str, list[Any]]  # client id, per message a tuple (checked) or bytes (its failed entry)
StoreCalls = Callable[[list[CheckedSend]], Awaitable[list[bytes]]]


def encode_call(checked: CheckedSend) -> _Call:
    """A checked call as plain values: per message its fields, or its failed entry's bytes."""
    items: list[Any] = []
    for item in checked.items:
        if isinstance(item, Outgoing):
            m = item.message
            items.append((m.topic, m.body, m.tags, m.keys, dict(m.properties) if m.properties else None,
                          m.deliver_at_ms, item.extra, item.kind, item.message_group, item.message_id))
        else:
            items.append(item.SerializeToString())
    return checked.client_id, items


def decode_call(call: _Call) -> CheckedSend:
    """The inverse of :func:`encode_call`. Each Message is built (and so checked) again."""
    client_id, items = call
    out: list[Outgoing | service_pb2.SendResultEntry] = []
    for item in items:
        if type(item) is bytes:
            out.append(service_pb2.SendResultEntry.FromString(item))
        else:
            topic, body, tags, keys, properties, deliver_at, extra, kind, group, message_id = item
            out.append(Outgoing(Message(topic, body, tags, keys, properties, None, deliver_at), extra, kind, group,
                                message_id))
    return CheckedSend(out, client_id)


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    return pickle.loads(await reader.readexactly(size))


def _frame(value: Any) -> bytes:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    if len(payload) >= _MAX_FRAME:
        raise RpcFailure(Code.MESSAGE_BODY_TOO_LARGE, f"a hand-off frame of {len(payload):,} bytes is too large")
    return _FRAME.pack(len(payload)) + payload


async def serve_handoff(path: str, store: StoreCalls) -> asyncio.Server:
    """The owner's end: a Unix socket server that stores each frame's calls with ``store`` (which
    returns one serialized SendMessageResponse per call) and answers the frame."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pending: set[asyncio.Task[None]] = set()

        async def answer(frame_id: int, calls: list[_Call]) -> None:
            responses = await store([decode_call(call) for call in calls])
            writer.write(_frame((frame_id, responses)))

        try:
            while True:
                frame_id, calls = await _read_frame(reader)
                task = asyncio.ensure_future(answer(frame_id, calls))  # frames may overlap (sync flush)
                pending.add(task)
                task.add_done_callback(pending.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front-end went away
        except Exception:
            log.exception("hand-off connection failed; the front-end will reconnect or exit")
        finally:
            for task in list(pending):
                await asyncio.gather(task, return_exceptions=True)
            writer.close()

    return await asyncio.start_unix_server(connection, path=path)


class HandoffClient:
    """A front-end's end: ``await client.send(checked)`` hands one call over and returns its
    serialized SendMessageResponse. Calls made in one event-loop turn travel in one frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._queued: list[tuple[asyncio.Future[bytes], _Call]] = []
        self._waiting: dict[int, list[asyncio.Future[bytes]]] = {}
        self._flush_scheduled = False
        self._broken: BaseException | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reading = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, path: str) -> HandoffClient:
        reader, writer = await asyncio.open_unix_connection(path)
        return cls(reader, writer)

    def send(self, checked: CheckedSend) -> asyncio.Future[bytes]:
        if self._broken is not None:
            raise RpcFailure(Code.INTERNAL_SERVER_ERROR, "the broker's store process cannot be reached; send again "
                                                         "once the server is back")
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._queued.append((future, encode_call(checked)))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        if not queued or self._broken is not None:
            self._fail([future for future, _call in queued])
            return
        frame_id = next(self._ids)
        self._waiting[frame_id] = [future for future, _call in queued]
        self._writer.write(_frame((frame_id, [call for _future, call in queued])))

    async def _read(self) -> None:
        try:
            while True:
                frame_id, responses = await _read_frame(self._reader)
                for future, response in zip(self._waiting.pop(frame_id), responses, strict=True):
                    if not future.done():
                        future.set_result(response)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._broken = exc
        except Exception as exc:
            log.exception("hand-off answers could not be read")
            self._broken = exc
        finally:
            if self._broken is None:
                self._broken = ConnectionError("hand-off closed")
            for futures in self._waiting.values():
                self._fail(futures)
            self._waiting.clear()
            if not self.closed.done():
                self.closed.set_result(None)

    def _fail(self, futures: Sequence[asyncio.Future[bytes]]) -> None:
        for future in futures:
            if not future.done():
                future.set_exception(RpcFailure(Code.INTERNAL_SERVER_ERROR, "the broker's store process went away "
                                                                            "before it answered; the message may "
                                                                            "or may not be stored"))

    async def close(self) -> None:
        self._writer.close()
        self._reading.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)
