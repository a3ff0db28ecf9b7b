"""The hand-off between front-end worker processes and the process that owns the store.

With ``[server] workers = N``, N front-end processes accept the clients' connections on the port
(SO_REUSEPORT) and check SendMessage calls; they hand the checked messages to the owner over a
Unix socket, every call that arrived in one event-loop turn in one frame. The owner stores them
(the log keeps one writer: the owner's) and answers each call with its serialized
SendMessageResponse, which the front-end returns as it is.

A frame is a 4-byte big-endian length and a ``marshal`` dump of ``(frame id, [call, ...])``;
an answer frame is ``(frame id, [response bytes, ...])``. A call travels as columns of plain
values, not as objects: the message ids, topics, bodies and tags of its common messages (normal,
no keys, properties, delay, group or priority) in lists of their own, every other message as one
tuple of its fields, and each failed message as its entry's bytes. marshal reads plain values
only (it runs no code, unlike pickle), and the socket lives in a directory only the server's
user may enter (mode 0700) that only the owner's own children connect to.
"""

from __future__ import annotations

import asyncio
import itertools
import marshal
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from plugmq.core.logs import get_logger
from plugmq.core.message import Message
from plugmq.core.names import Prop
from plugmq.server.convert import Outgoing
from plugmq.server.protocol import Code, MessageType, service_pb2
from plugmq.server.send import CheckedSend
from plugmq.server.status import RpcFailure

__all__ = ["HandoffClient", "decode_call", "encode_call", "serve_handoff"]

log = get_logger(__name__)

_FRAME = struct.Struct(">I")
_MAX_FRAME = 1 << 31  # the length field's own limit; frames are bounded by the calls' own limits
_MARSHAL_VERSION = 4
# client id, account (its rate limit), then the call's messages as columns (see encode_call)
_Call = tuple[str, str | None, list[str], list[str], list[bytes], list[str | None], dict[int, tuple[Any, ...]],
              dict[int, bytes]]
StoreCalls = Callable[[list[CheckedSend]], list[bytes] | Awaitable[list[bytes]]]
_UNIQ_KEY = str(Prop.UNIQ_KEY)
_NORMAL = int(MessageType.NORMAL)


def _common(item: Outgoing) -> bool:
    """Whether a message travels in the columns: normal, its extra properties only its id."""
    m = item.message
    return (item.kind == _NORMAL and not m.keys and not m.properties and m.deliver_at_ms is None
            and m.message_group is None and m.priority is None and m.delay_level is None and len(item.extra) == 1)


def encode_call(checked: CheckedSend) -> _Call:
    """A checked call as columns of plain values: the ids, topics, bodies and tags of its common
    messages, every other message's fields by its position, and each failed one's entry bytes."""
    ids: list[str] = []
    topics: list[str] = []
    bodies: list[bytes] = []
    tags: list[str | None] = []
    rare: dict[int, tuple[Any, ...]] = {}
    failed: dict[int, bytes] = {}
    for index, item in enumerate(checked.items):
        if not isinstance(item, Outgoing):
            failed[index] = item.SerializeToString()
            continue
        m = item.message
        if _common(item):
            ids.append(item.message_id)
            topics.append(m.topic)
            bodies.append(m.body)
            tags.append(m.tags)
        else:
            rare[index] = (m.topic, m.body, m.tags, m.keys, dict(m.properties) if m.properties else None,
                           m.deliver_at_ms, m.priority, dict(item.extra), item.kind, item.message_group,
                           item.message_id)
    return checked.client_id, checked.account, ids, topics, bodies, tags, rare, failed


def decode_call(call: _Call) -> CheckedSend:
    """The inverse of :func:`encode_call`. Each Message is built (and so checked) again."""
    client_id, account, ids, topics, bodies, tags, rare, failed = call
    out: list[Outgoing | service_pb2.SendResultEntry] = []
    common = 0
    for index in range(len(ids) + len(rare) + len(failed)):
        if index in failed:
            out.append(service_pb2.SendResultEntry.FromString(failed[index]))
        elif index in rare:
            topic, body, tag, keys, properties, deliver_at, priority, extra, kind, group, message_id = rare[index]
            out.append(Outgoing(Message(topic, body, tag, keys, properties, None, deliver_at, group, priority), extra,
                                kind, group, message_id))
        else:
            message_id = ids[common]
            out.append(Outgoing(Message(topics[common], bodies[common], tags[common]), {_UNIQ_KEY: message_id},
                                _NORMAL, None, message_id))
            common += 1
    return CheckedSend(out, client_id, account)


def _frame(value: Any) -> bytes:
    payload = marshal.dumps(value, _MARSHAL_VERSION)
    if len(payload) >= _MAX_FRAME:
        raise RpcFailure(Code.MESSAGE_BODY_TOO_LARGE, f"a hand-off frame of {len(payload):,} bytes is too large")
    return _FRAME.pack(len(payload)) + payload


class _Frames(asyncio.Protocol):
    """Frames out of a byte stream, handed to ``received`` as they complete: every frame that one
    read completed in one call (no task per frame: a read costs a few function calls on the loop)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        frames = []
        while len(buffer) - start >= _FRAME.size:
            (size,) = _FRAME.unpack_from(buffer, start)
            end = start + _FRAME.size + size
            if len(buffer) < end:
                break
            frames.append(marshal.loads(memoryview(buffer)[start + _FRAME.size:end]))
            start = end
        if start:
            del buffer[:start]
        if frames:
            self.received(frames)

    def received(self, frames: list[Any]) -> None:
        raise NotImplementedError


class _OwnerEnd(_Frames):
    """The owner's side of one front-end's connection.

    The frames that one read brings are stored together, with one ``store`` call: when the owner
    falls behind (busy front-ends, a store that waits), a read holds several frames, and their
    calls then share the store's batches (one put per queue) and one answer write, so the owner's
    cost per call falls as its load rises. Order is kept: the calls are stored and answered in
    the order they came."""

    def __init__(self, store: StoreCalls) -> None:
        super().__init__()
        self._store = store
        self._pending: set[asyncio.Future[None]] = set()

    def received(self, frames: list[Any]) -> None:
        shape = [(frame_id, len(calls)) for frame_id, calls in frames]
        try:
            answer = self._store([decode_call(call) for _frame_id, calls in frames for call in calls])
        except Exception as exc:
            log.exception("a hand-off frame could not be stored")
            status = {"code": Code.INTERNAL_SERVER_ERROR, "message": f"the broker could not take the call: {exc}"}
            failed = service_pb2.SendMessageResponse(status=status).SerializeToString()
            self._answer(shape, [failed] * sum(count for _frame_id, count in shape))
            return
        if isinstance(answer, list):  # stored on the loop already
            self._answer(shape, answer)
            return
        task = asyncio.ensure_future(self._later(shape, answer))  # frames may overlap (sync flush)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _later(self, shape: list[tuple[int, int]], answer: Awaitable[list[bytes]]) -> None:
        self._answer(shape, await answer)

    def _answer(self, shape: list[tuple[int, int]], responses: list[bytes]) -> None:
        """Each frame's answers (``shape``: its id and how many calls it held), in one write."""
        if self.transport is None or self.transport.is_closing():
            return
        parts, start = [], 0
        for frame_id, count in shape:
            parts.append(_frame((frame_id, responses[start:start + count])))
            start += count
        self.transport.write(b"".join(parts))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None  # answers of frames still being stored have nobody to go to


async def serve_handoff(path: str, store: StoreCalls) -> asyncio.AbstractServer:
    """The owner's end: a Unix socket server that stores each frame's calls with ``store`` and
    answers the frame. ``store`` returns one serialized SendMessageResponse per call, or an
    awaitable of them when the calls must wait (a sync flush, the send thread)."""
    return await asyncio.get_running_loop().create_unix_server(lambda: _OwnerEnd(store), path=path)


class HandoffClient(_Frames):
    """A front-end's end: ``await client.send(checked)`` hands one call over and returns its
    serialized SendMessageResponse. Calls made in one event-loop turn travel in one frame."""

    def __init__(self) -> None:
        super().__init__()
        self._ids = itertools.count()
        self._queued: list[tuple[asyncio.Future[bytes], _Call]] = []
        self._waiting: dict[int, list[asyncio.Future[bytes]]] = {}
        self._flush_scheduled = False
        self._broken = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(cls, path: str) -> HandoffClient:
        _transport, client = await asyncio.get_running_loop().create_unix_connection(cls, path)
        return client

    def send(self, checked: CheckedSend) -> asyncio.Future[bytes]:
        if self._broken:
            raise RpcFailure(Code.INTERNAL_SERVER_ERROR, "the broker's store process cannot be reached; send again "
                                                         "once the server is back")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._queued.append((future, encode_call(checked)))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        if not queued:
            return
        if self._broken or self.transport is None:
            _fail([future for future, _call in queued])
            return
        frame_id = next(self._ids)
        self._waiting[frame_id] = [future for future, _call in queued]
        self.transport.write(_frame((frame_id, [call for _future, call in queued])))

    def received(self, frames: list[Any]) -> None:
        for frame_id, responses in frames:
            for future, response in zip(self._waiting.pop(frame_id), responses, strict=True):
                if not future.done():
                    future.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken = True
        for futures in self._waiting.values():
            _fail(futures)
        self._waiting.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        await asyncio.shield(self.closed)


def _fail(futures: Sequence[asyncio.Future[bytes]]) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(RpcFailure(Code.INTERNAL_SERVER_ERROR, "the broker's store process went away before "
                                                                        "it answered; the message may or may not be "
                                                                        "stored"))
