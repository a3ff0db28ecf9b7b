"""SendMessage's work: messages checked and stored with as few store calls as possible.

A SendWorker thread (plugmq.server.sendworker) takes the calls (one hop off the event loop per
call); a Sender stores the messages of all calls waiting at that moment, checked first
(plugmq.server.sendcheck). Normal messages that go to one queue are stored
as one store batch (``Broker.put_batch``), up to the broker's size limit per batch; delayed and
transactional messages go one by one to their services. Each message's failure is its own entry
status; the others are stored regardless. On a ``sync_master`` the worker stores everything of the
round first and then waits once for a slave to confirm it all (RocketMQ's GroupTransferService):
one replication round trip answers every call of the round.

Where nothing can wait (no sync flush, no replication, only normal and FIFO messages) and the
thread holds no call, a call is stored on the event loop instead (``SendWorker.stores_on_loop``);
both ways go through the same Sender: the account's rate limit, dedup windows, RecentSends and
the broker's own checks (a slave's refusal, fencing) apply alike, also to calls that front-end
worker processes check and hand over (plugmq.server.handoff).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import attrs

from plugmq.broker.ports import Serving
from plugmq.core.message import (
    AppendStatus,
    Message,
    SendResult,
    SendResults,
    SendStatus,
    StoredMessage,
    message_group_queue,
)
from plugmq.server.auth import Authenticator
from plugmq.server.convert import Outgoing
from plugmq.server.dedupe import RecentSends
from plugmq.server.protocol import Code, MessageType, service_pb2
from plugmq.server.sendcheck import (
    CheckedSend,
    SendRequest,
    check_message,
    check_messages,
    check_send,
    failed_entry,
)
from plugmq.server.status import RpcFailure, ok, overall
from plugmq.server.telemetry import Sessions, txn_group

# The checks live in plugmq.server.sendcheck (a front-end process checks without a broker); they
# are named here too, where the servicer and the hand-off have always imported them from.
__all__ = ["CheckedSend", "SendRequest", "Sender", "check_message", "check_messages", "check_send"]

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


@attrs.define
class _Batch:
    """Messages for one queue, in request order (``entries``: their response entries), with the
    columns the store takes (``messages``, ``extras``, ``message_ids``: one per item)."""

    entries: list[service_pb2.SendResultEntry] = attrs.field(factory=list)
    items: list[Outgoing] = attrs.field(factory=list)
    messages: list[Message] = attrs.field(factory=list)
    extras: list[Mapping[str, str]] = attrs.field(factory=list)
    message_ids: list[str] = attrs.field(factory=list)
    size: int = 0

    def add(self, out: Outgoing, entry: service_pb2.SendResultEntry) -> None:
        self.entries.append(entry)
        self.items.append(out)
        self.messages.append(out.message)
        self.extras.append(out.extra)
        self.message_ids.append(out.message_id)
        self.size += len(out.message.body)


class Sender:
    """Stores the messages of SendMessage calls (on the SendWorker thread, or on the event loop
    while that thread holds no call)."""

    def __init__(self, broker: Serving, sessions: Sessions, auth: Authenticator, max_batch_bytes: int) -> None:
        self._broker = broker
        self._max_batch_bytes = max_batch_bytes
        self._sessions = sessions
        self._auth = auth
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._recent = RecentSends(broker.clock, lambda: broker.promoted_at, self._stored_copy)

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

    def send(self, requests: Sequence[SendRequest | CheckedSend]) -> list[service_pb2.SendMessageResponse]:
        """Each request's response, one entry per message in request order. Normal messages of all
        the requests that go to one queue share store batches."""
        checked = [r if type(r) is CheckedSend else check_send(r, self._auth, self._max_batch_bytes)  # type: ignore[arg-type]
                   for r in requests]
        return self.store(checked)

    def store(self, requests: Sequence[CheckedSend]) -> list[service_pb2.SendMessageResponse]:
        """Store checked calls: each request's response, one entry per message in request order.

        The entries are added to their response first and filled in place as their messages are
        stored (no entry built apart and copied in)."""
        responses: list[service_pb2.SendMessageResponse] = []
        batches: dict[tuple[str, int, str | None], list[_Batch]] = {}  # an account's rate limit: its own batches
        round_ = _Round()
        for request in requests:
            response = service_pb2.SendMessageResponse()
            responses.append(response)
            picked: dict[str, int] = {}
            if self._place_plain(request, response, picked, batches):
                continue
            add = response.entries.add
            for out in request.items:
                entry = add()
                if type(out) is not Outgoing:
                    entry.CopyFrom(out)
                    round_.mixed = True
                    continue
                try:
                    self._place(out, entry, request, picked, batches, round_)
                except Exception as exc:  # noqa: BLE001 - answered as this entry's status
                    entry.CopyFrom(_failed_out(out, exc))
                    round_.mixed = True
        for (_topic, queue_id, account), queue_batches in batches.items():
            for batch in queue_batches:
                self._store(batch, queue_id, account, round_)
        self._await_slave(responses, None if round_.mixed else round_.stored)
        return responses

    def _place_plain(self, request: CheckedSend, response: service_pb2.SendMessageResponse, picked: dict[str, int],
                     batches: dict[tuple[str, int, str | None], list[_Batch]]) -> bool:
        """The common call placed in one step, as :meth:`_place` would place it message by message:
        every message a plain one (normal: neither delayed nor in a message group) for one topic,
        none of them a retry, all of them fitting one store batch. False when it is not that call:
        then nothing was placed (a queue picked is in ``picked``, for :meth:`_place`)."""
        plain = request.plain  # None for one message too: _place is as short
        if plain is None or self._recent.may_know(plain.message_ids):
            return False
        items = request.items
        topic, size, limit = plain.topic, plain.size, self._max_batch_bytes
        if size > limit:
            return False
        try:
            queue_id = self._queue_for(topic, None, picked)
        except Exception:  # noqa: BLE001 - no such topic...: each message answers it, as _place does
            return False
        queue_batches = batches.setdefault((topic, queue_id, request.account), [])
        batch = queue_batches[-1] if queue_batches else None
        if batch is None or batch.size + size > limit:
            if batch is not None and batch.size + len(items[0].message.body) <= limit:
                return False  # message by message, the call would be split across two batches
            batch = _Batch()
            queue_batches.append(batch)
        add = response.entries.add
        batch.entries.extend([add() for _ in items])
        batch.items.extend(items)  # a plain call: every item is an Outgoing
        batch.messages.extend(plain.messages)
        batch.extras.extend(plain.extras)
        batch.message_ids.extend(plain.message_ids)
        batch.size += size
        return True

    def _place(self, out: Outgoing, entry: service_pb2.SendResultEntry, request: CheckedSend, picked: dict[str, int],
               batches: dict[tuple[str, int, str | None], list[_Batch]], round_: _Round) -> None:
        """Store a transactional or delayed message now; add any other to its queue's batch."""
        topic = out.message.topic
        queue_id = self._queue_for(topic, out.message_group, picked)
        if out.kind == MessageType.TRANSACTION:
            round_.mixed = True  # its entry's status is the transaction service's
            self._prepare(out, entry, queue_id, request.client_id)
            return
        deliver_at = out.message.deliver_at_ms
        if deliver_at is not None and deliver_at > self._broker.clock.now_ms():
            round_.mixed = True  # its entry's status is the delay service's
            self._delay(out, entry, queue_id, request.account)
            return
        if deliver_at is not None:  # already due: a normal message
            out = attrs.evolve(out, message=attrs.evolve(out.message, deliver_at_ms=None))
        retried = self._recent.find(out.message_id, topic)
        if retried is not None:  # stored by an earlier try: answered with it, not stored again
            self._broker.count_duplicate(topic)
            _fill_ok(entry, out.message_id, retried)
            round_.stored.append(entry)
            return
        queue_batches = batches.setdefault((topic, queue_id, request.account), [])
        if not queue_batches or queue_batches[-1].size + len(out.message.body) > self._max_batch_bytes:
            queue_batches.append(_Batch())
        queue_batches[-1].add(out, entry)

    def _await_slave(self, responses: Sequence[service_pb2.SendMessageResponse],
                     stored: list[service_pb2.SendResultEntry] | None) -> None:
        """One wait for a slave covering every message this round stored (SEND_OK elsewhere than on
        a sync_master); what it could not confirm answers FLUSH_SLAVE_TIMEOUT or
        SLAVE_NOT_AVAILABLE. Then each response's overall status.

        ``stored``: every entry of the round, all stored OK (then no entry's status is read
        back); None: the statuses are read from the entries."""
        if stored is None:
            stored, all_ok = _stored_entries(responses)
        else:
            all_ok = [True] * len(responses)
        replica = self._broker.await_replication() if stored else SendStatus.SEND_OK
        if replica is not SendStatus.SEND_OK:
            for entry in stored:
                _set_status(entry, replica)
            all_ok = [False] * len(responses)
        elif stored:
            self._broker.count_acked(len(stored))
        for response, fine in zip(responses, all_ok, strict=True):
            if fine:
                response.status.CopyFrom(_OK)
            else:
                response.status.CopyFrom(overall([entry.status for entry in response.entries]))

    def _store(self, batch: _Batch, queue_id: int, account: str | None, round_: _Round) -> None:
        items = batch.items
        status: SendStatus | None
        try:
            if len(items) == 1:
                out = items[0]
                result = self._broker.put(out.message, queue_id, extra_properties=out.extra, await_slave=False,
                                          account=account)
                results: Sequence[SendResult] = (result,)
                offsets, status = [result.queue_offset], result.status
            else:
                results = self._broker.put_batch(batch.messages, queue_id, extra_properties=batch.extras,
                                                 await_slave=False, account=account)
                offsets, status = _columns(results)
        except Exception as exc:  # noqa: BLE001 - answered as each entry's status
            for entry, out in zip(batch.entries, items, strict=True):
                entry.CopyFrom(_failed_out(out, exc))
            round_.mixed = True
            return
        message_ids = batch.message_ids
        if status is SendStatus.SEND_OK:
            merge = _MERGE_ENTRY  # _fill_ok inlined: no call per entry
            for entry, message_id, offset in zip(batch.entries, message_ids, offsets, strict=True):
                merge(entry, _OK_ENTRY)
                entry.message_id = message_id
                entry.offset = offset
            round_.stored.extend(batch.entries)
        else:  # a flush that timed out (all of the batch, or some of a batch stored one by one)
            for entry, message_id, result in zip(batch.entries, message_ids, results, strict=True):
                _fill(entry, message_id, result)
            round_.mixed = True
        self._recent.stored_many(message_ids, offsets)

    def _delay(self, out: Outgoing, entry: service_pb2.SendResultEntry, queue_id: int, account: str | None) -> None:
        result = self._broker.put(out.message, queue_id, extra_properties=out.extra, await_slave=False,
                                  account=account)
        _fill(entry, out.message_id, result)
        entry.recall_handle = f"{result.msg_id}:{out.message_id}"

    def _prepare(self, out: Outgoing, entry: service_pb2.SendResultEntry, queue_id: int, client_id: str) -> None:
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
        entry.message_id, entry.transaction_id, entry.offset = out.message_id, stored.msg_id, stored.queue_offset
        _set_status(entry, SendStatus.SEND_OK if stored.status is AppendStatus.PUT_OK else SendStatus.FLUSH_DISK_TIMEOUT)


_OK = ok()  # copied into each entry: protobuf messages are copied when set, never shared
# Parsed into an empty entry: its status is _OK's (MergeFrom would serialize the template each time).
_OK_ENTRY = service_pb2.SendResultEntry(status=_OK).SerializeToString()
_MERGE_ENTRY = service_pb2.SendResultEntry.MergeFromString


@attrs.define
class _Round:
    """What one store round knows of its entries as it fills them."""

    #: Entries stored and answered OK so far (those a slave must confirm on a sync_master).
    stored: list[service_pb2.SendResultEntry] = attrs.field(factory=list)
    #: Whether some entry may be anything but stored OK (a failure, a flush timeout, a delayed or
    #: transactional message): then the statuses are read back from the entries.
    mixed: bool = False


def _columns(results: Sequence[SendResult]) -> tuple[list[int], SendStatus | None]:
    """Each result's queue offset and the status they all share (None: they differ), read from
    the store's columns where it wrote them (no SendResult built per message)."""
    if type(results) is SendResults:
        return results.queue_offsets(), results.shared_status()
    statuses = {result.status for result in results}
    return [result.queue_offset for result in results], statuses.pop() if len(statuses) == 1 else None


def _stored_entries(responses: Sequence[service_pb2.SendMessageResponse]
                    ) -> tuple[list[service_pb2.SendResultEntry], list[bool]]:
    """The entries answered OK, and per response whether all of its entries are."""
    stored: list[service_pb2.SendResultEntry] = []
    all_ok: list[bool] = []
    for response in responses:
        entries = response.entries
        before = len(stored)
        stored.extend(entry for entry in entries if entry.status.code == Code.OK)
        all_ok.append(len(stored) - before == len(entries))
    return stored, all_ok


def _fill_ok(entry: service_pb2.SendResultEntry, message_id: str, queue_offset: int) -> None:
    """An empty entry answered OK (_store inlines the same three steps for a stored batch)."""
    _MERGE_ENTRY(entry, _OK_ENTRY)
    entry.message_id = message_id
    entry.offset = queue_offset


def _fill(entry: service_pb2.SendResultEntry, message_id: str, result: SendResult) -> None:
    """An entry of its response filled with what storing its message answered."""
    entry.message_id = message_id
    entry.offset = result.queue_offset
    _set_status(entry, result.status)


def _set_status(entry: service_pb2.SendResultEntry, status: SendStatus) -> None:
    if status is SendStatus.SEND_OK:
        entry.status.CopyFrom(_OK)
    else:
        entry.status.code, entry.status.message = _NOT_PERSISTED[status]


def _failed_out(out: Outgoing, exc: BaseException) -> service_pb2.SendResultEntry:
    return failed_entry(out.message.topic, out.message_id, exc)
