"""SendMessage's work: messages checked and stored with as few store calls as possible.

A SendWorker thread takes the calls (one hop off the event loop per call); a Sender stores the
messages of all calls waiting at that moment. Normal messages that go to one queue are stored
as one store batch (``Broker.put_batch``), up to the broker's size limit per batch; delayed and
transactional messages go one by one to their services. Each message's failure is its own entry
status; the others are stored regardless. On a ``sync_master`` the worker stores everything of the
round first and then waits once for a slave to confirm it all (RocketMQ's GroupTransferService):
one replication round trip answers every call of the round.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Sequence

import attrs

from plugmq.broker.ports import Serving
from plugmq.core.message import AppendStatus, SendResult, SendStatus, StoredMessage, message_group_queue
from plugmq.core.names import is_system_topic
from plugmq.server.auth import Authenticator
from plugmq.server.convert import Outgoing, outgoing
from plugmq.server.dedupe import RecentSends
from plugmq.server.options import Account
from plugmq.server.protocol import Code, MessageType, definition_pb2, service_pb2
from plugmq.server.status import RpcFailure, ok, status_of
from plugmq.server.telemetry import Sessions, txn_group

__all__ = ["SendRequest", "SendWorker", "Sender"]

# A send that is stored but not as durable as asked, as RocketMQ 5's proxy answers it
# (SendMessageActivity): the message is on the master; a retry by the client may store it twice.
_NOT_PERSISTED = {
    SendStatus.FLUSH_DISK_TIMEOUT: (
        Code.MASTER_PERSISTENCE_TIMEOUT,
        "the message is stored but was not flushed to disk in time; a retry by the client may store it twice"),
    SendStatus.FLUSH_SLAVE_TIMEOUT: (
        Code.SLAVE_PERSISTENCE_TIMEOUT,
        "the message is stored on the master but no slave confirmed it in time (sync_master); a retry by the "
        "client may store it twice"),
    SendStatus.SLAVE_NOT_AVAILABLE: (
        Code.HA_NOT_AVAILABLE,
        "the message is stored on the master but its in-sync set fell below min_in_sync_replicas before a slave "
        "confirmed it (sync_master); start or reconnect a slave; a retry by the client may store it twice"),
}


@attrs.frozen
class SendRequest:
    """One SendMessage call's messages and who sent them."""

    messages: Sequence[definition_pb2.Message]
    account: Account | None
    client_id: str


@attrs.define
class _Batch:
    """Messages for one queue, in request order (``slots`` index the response entries)."""

    slots: list[int] = attrs.field(factory=list)
    items: list[Outgoing] = attrs.field(factory=list)
    size: int = 0


class Sender:
    """Stores the messages of SendMessage calls (called from the SendWorker thread only)."""

    def __init__(self, broker: Serving, sessions: Sessions, auth: Authenticator, max_batch_bytes: int) -> None:
        self._broker = broker
        self._max_batch_bytes = max_batch_bytes
        self._sessions = sessions
        self._auth = auth
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._recent = RecentSends(broker.name, broker.clock, lambda: broker.promoted_at, self._stored_copy)

    def _stored_copy(self, topic: str, message_id: str, since_ms: int) -> StoredMessage | None:
        found = self._broker.query_by_key(topic, message_id, max_results=1, begin_ms=since_ms)
        return found[0] if found else None

    def _queue_for(self, topic: str, message_group: str | None, picked: dict[str, int]) -> int:
        """A message group's own queue; otherwise one queue per topic for all of a request's
        messages (``picked``), round robin across requests, as RocketMQ's proxy sends a batch."""
        if message_group is None:
            queue_id = picked.get(topic)
            if queue_id is not None:
                return queue_id
        count = len(self._broker.topic_queues(topic))
        if message_group is not None:
            return message_group_queue(message_group, count)  # one message group, one queue
        counter = self._round_robin.get(topic)
        if counter is None:
            counter = self._round_robin.setdefault(topic, itertools.count())
        queue_id = picked[topic] = next(counter) % count
        return queue_id

    def send(self, requests: Sequence[SendRequest]) -> list[list[service_pb2.SendResultEntry]]:
        """Each request's entries, one per message in request order. Normal messages of all the
        requests that go to one queue share store batches."""
        protos = [proto for request in requests for proto in request.messages]
        entries: list[service_pb2.SendResultEntry | None] = [None] * len(protos)
        batches: dict[tuple[str, int, Account | None], list[_Batch]] = {}  # an account's rate limit: its own batches
        limit = self._max_batch_bytes
        slot = 0
        for request in requests:
            picked: dict[str, int] = {}
            for proto in request.messages:
                try:
                    out = self._check(proto, request.account)
                    topic = out.message.topic
                    queue_id = self._queue_for(topic, out.message_group, picked)
                    if out.kind == MessageType.TRANSACTION:
                        entries[slot] = self._prepare(out, queue_id, request.client_id)
                        slot += 1
                        continue
                    deliver_at = out.message.deliver_at_ms
                    if deliver_at is not None and deliver_at > self._broker.clock.now_ms():
                        entries[slot] = self._delay(out, queue_id, request.account)
                        slot += 1
                        continue
                    if deliver_at is not None:  # already due: a normal message
                        out = attrs.evolve(out, message=attrs.evolve(out.message, deliver_at_ms=None))
                    retried = self._recent.find(out.message_id, topic)
                    if retried is not None:  # stored by an earlier try: answered with it, not stored again
                        self._broker.count_duplicate(topic)
                        entries[slot] = _entry(out.message_id, attrs.evolve(retried, status=SendStatus.SEND_OK))
                        slot += 1
                        continue
                except Exception as exc:  # noqa: BLE001 - answered as this entry's status
                    entries[slot] = _failed(proto, exc)
                    slot += 1
                    continue
                queue_batches = batches.setdefault((topic, queue_id, request.account), [])
                body = len(out.message.body)
                if not queue_batches or queue_batches[-1].size + body > limit:
                    queue_batches.append(_Batch())
                batch = queue_batches[-1]
                batch.slots.append(slot)
                batch.items.append(out)
                batch.size += body
                slot += 1
        for (_topic, queue_id, account), queue_batches in batches.items():
            for batch in queue_batches:
                self._store(batch, queue_id, entries, protos, account)
        self._await_slave(entries)
        answers: list[list[service_pb2.SendResultEntry]] = []
        start = 0
        for request in requests:
            end = start + len(request.messages)
            answers.append([entry for entry in entries[start:end] if entry is not None])
            start = end
        return answers

    def _await_slave(self, entries: Sequence[service_pb2.SendResultEntry | None]) -> None:
        """One wait for a slave covering every message this round stored (SEND_OK elsewhere than on
        a sync_master); what it could not confirm answers FLUSH_SLAVE_TIMEOUT or
        SLAVE_NOT_AVAILABLE."""
        stored = [entry for entry in entries if entry is not None and entry.status.code == Code.OK]
        if not stored:
            return
        replica = self._broker.await_replication()
        if replica is not SendStatus.SEND_OK:
            for entry in stored:
                _set_status(entry, replica)
        else:
            self._broker.count_acked(len(stored))

    def _check(self, proto: definition_pb2.Message, account: Account | None) -> Outgoing:
        out = outgoing(proto, self._max_batch_bytes)
        topic = out.message.topic
        self._auth.require(account, "publish", topic)
        if is_system_topic(topic):
            raise RpcFailure(Code.ILLEGAL_TOPIC, f"topic {topic!r} is a system topic; producers may not send to it")
        return out

    def _store(self, batch: _Batch, queue_id: int, entries: list[service_pb2.SendResultEntry | None],
               protos: Sequence[definition_pb2.Message], account: Account | None) -> None:
        name = account.access_key if account is not None else None
        try:
            if len(batch.items) == 1:
                out = batch.items[0]
                results = [self._broker.put(out.message, queue_id, extra_properties=out.extra, await_slave=False,
                                            account=name)]
            else:
                results = self._broker.put_batch([out.message for out in batch.items], queue_id,
                                                 extra_properties=[out.extra for out in batch.items], await_slave=False,
                                                 account=name)
        except Exception as exc:  # noqa: BLE001 - answered as each entry's status
            for slot in batch.slots:
                entries[slot] = _failed(protos[slot], exc)
            return
        for slot, out, result in zip(batch.slots, batch.items, results, strict=True):
            entries[slot] = _entry(out.message_id, result)
            self._recent.stored(out.message_id, result)

    def _delay(self, out: Outgoing, queue_id: int, account: Account | None) -> service_pb2.SendResultEntry:
        result = self._broker.put(out.message, queue_id, extra_properties=out.extra, await_slave=False,
                                  account=account.access_key if account is not None else None)
        entry = _entry(out.message_id, result)
        entry.recall_handle = f"{result.msg_id}:{out.message_id}"
        return entry

    def _prepare(self, out: Outgoing, queue_id: int, client_id: str) -> service_pb2.SendResultEntry:
        self._broker.check_writable("take transactional messages")
        service = self._broker.transactions
        topic = out.message.topic
        if service is None:
            raise RpcFailure(Code.UNSUPPORTED, f"broker {self._broker.name!r} has no transaction plugin; add 'txn' "
                                               "to broker.plugins to accept transactional messages")
        session = self._sessions.get(client_id)
        if session is not None:
            self._sessions.answer_transactions(session, topic, proven=True)
        request = self._broker.build_request(out.message, queue_id, extra_properties=out.extra)
        stored = service.prepare(request, txn_group(topic))
        entry = service_pb2.SendResultEntry(message_id=out.message_id, transaction_id=stored.msg_id,
                                            offset=stored.queue_offset)
        _set_status(entry, SendStatus.SEND_OK if stored.status is AppendStatus.PUT_OK else SendStatus.FLUSH_DISK_TIMEOUT)
        return entry


_OK = ok()  # copied into each entry: protobuf messages are copied when set, never shared


def _entry(message_id: str, result: SendResult) -> service_pb2.SendResultEntry:
    if result.status is SendStatus.SEND_OK:
        return service_pb2.SendResultEntry(message_id=message_id, offset=result.queue_offset, status=_OK)
    entry = service_pb2.SendResultEntry(message_id=message_id, offset=result.queue_offset)
    _set_status(entry, result.status)
    return entry


def _set_status(entry: service_pb2.SendResultEntry, status: SendStatus) -> None:
    if status is SendStatus.SEND_OK:
        entry.status.CopyFrom(_OK)
    else:
        entry.status.code, entry.status.message = _NOT_PERSISTED[status]


def _failed(proto: definition_pb2.Message, exc: BaseException) -> service_pb2.SendResultEntry:
    return service_pb2.SendResultEntry(status=status_of(exc, action=f"send to topic {proto.topic.name!r}"),
                                       message_id=proto.system_properties.message_id)


class SendWorker:
    """One thread that stores what SendMessage calls hand it: one hop off the event loop per call.

    Calls that arrive while the thread is storing wait together and are stored together (group
    commit): their messages for one queue become one store batch, and all their answers go back
    to the event loop in one callback.
    """

    def __init__(self, sender: Sender, loop: asyncio.AbstractEventLoop) -> None:
        self._sender = sender
        self._loop = loop
        self._queue: queue.SimpleQueue[tuple[asyncio.Future[list[service_pb2.SendResultEntry]], SendRequest] | None] \
            = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="plugmq-serve-send", daemon=True)
        self._thread.start()

    @property
    def sender(self) -> Sender:
        return self._sender

    def submit(self, request: SendRequest) -> asyncio.Future[list[service_pb2.SendResultEntry]]:
        """Queue a call's messages (event-loop thread); the future holds their entries."""
        if self._closed:
            raise RpcFailure(Code.INTERNAL_SERVER_ERROR, "the server is shutting down; send to it again once it "
                                                         "is back")
        future: asyncio.Future[list[service_pb2.SendResultEntry]] = self._loop.create_future()
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

    def _store(self, work: list[tuple[asyncio.Future[list[service_pb2.SendResultEntry]], SendRequest]]) -> None:
        try:
            answers: list[list[service_pb2.SendResultEntry]] | BaseException = self._sender.send(
                [request for _future, request in work])
        except Exception as exc:  # noqa: BLE001 - every waiting call is answered with it
            answers = exc
        try:
            self._loop.call_soon_threadsafe(_answer, [future for future, _request in work], answers)
        except RuntimeError:
            pass  # the loop is closed: nobody waits for these answers any more

    def close(self) -> None:
        """Store what is queued, then stop the thread (event-loop thread)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join()


def _answer(futures: list[asyncio.Future[list[service_pb2.SendResultEntry]]],
            answers: list[list[service_pb2.SendResultEntry]] | BaseException) -> None:
    for i, future in enumerate(futures):
        if future.done():
            continue  # the call was cancelled (client gone)
        if isinstance(answers, BaseException):
            future.set_exception(answers)
        else:
            future.set_result(answers[i])
