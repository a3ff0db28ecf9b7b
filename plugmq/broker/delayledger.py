"""Delayed messages that survive a failover: each one is also an intent record in the commit log.

A delay plugin keeps its pending messages in files of its own, which replication does not copy.
With replication on, the broker therefore also writes every delayed message the plugin accepts as
a record of its ``delay`` journal (``rmq_sys_state_delay``: the whole request, its deliver time and
the plugin's msg id), and the send is acknowledged (on a ``sync_master``: once a slave holds it)
only after that; a cancel is a record too. There is no "done" record: a delivery is itself a
message in the same log, so a slave that holds a prefix of the log knows exactly which of the
intents in that prefix its master delivered (``was_delivered``: the message's unique key on its
real topic).

When a slave is promoted, :meth:`DelayLedger.load` replays the journal (the latest snapshot,
then the intents after it) and :meth:`DelayLedger.schedule_taken_over` schedules every intent not
delivered yet with its own deliver time: nothing is lost, nothing is delivered early, and nothing the old master delivered is
delivered again. The broker's write-back also skips a message whose unique key is no longer
pending and is already on its topic (a plugin that held a copy from an earlier mastership).

A snapshot holds only pointers (commit-log offset and size of each pending intent record), and
the ledger holds retention at its oldest pending intent, so snapshots stay small however many
messages are pending.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable

import attrs

from plugmq.broker.journal import Journal
from plugmq.core.contracts import DelayScheduler, WasDelivered
from plugmq.core.errors import CorruptRecordError
from plugmq.core.logs import get_logger
from plugmq.core.message import AppendRequest, AppendResult
from plugmq.core.names import Prop
from plugmq.kit.kvstore.codec import decode_properties, encode_properties

__all__ = ["DelayIntent", "DelayLedger", "decode_intent", "encode_intent"]

log = get_logger(__name__)

# A record is a kind byte and its payload. An intent: deliver at (ms), delay level (-1: none),
# queue id, reconsume times, sys flag, tags code, born timestamp (ms), then the lengths of topic,
# born host, the delay plugin's msg id, properties, body. A cancel: the unique key.
_INTENT, _CANCEL = b"I", b"C"
_HEAD = struct.Struct(">qiiiiqqHHHII")
_POINTER = struct.Struct(">qi")

DelayIntent = tuple[AppendRequest, int, "int | None"]
"""A pending delayed message: its request (delay properties included), deliver time, level."""


def encode_intent(request: AppendRequest, deliver_at_ms: int, delay_level: int | None, msg_id: str) -> bytes:
    topic, host, ident = request.topic.encode(), request.born_host.encode(), msg_id.encode()
    props = encode_properties(request.properties)
    head = _HEAD.pack(deliver_at_ms, -1 if delay_level is None else delay_level, request.queue_id,
                      request.reconsume_times, request.sys_flag, request.tags_code, request.born_timestamp_ms,
                      len(topic), len(host), len(ident), len(props), len(request.body))
    return b"".join((_INTENT, head, topic, host, ident, props, request.body))


def decode_intent(data: bytes) -> tuple[DelayIntent, str]:
    """The intent in a record, and the delay plugin's msg id for it."""
    try:
        if data[:1] != _INTENT:
            raise ValueError(f"kind {data[:1]!r} is not an intent")
        (deliver_at, level, queue_id, reconsume, sys_flag, tags_code, born_ms,
         topic_len, host_len, id_len, props_len, body_len) = _HEAD.unpack_from(data, 1)
        pos = 1 + _HEAD.size
        fields = []
        for length in (topic_len, host_len, id_len):
            fields.append(data[pos:pos + length].decode())
            pos += length
        topic, host, msg_id = fields
        props = decode_properties(data[pos:pos + props_len])
        pos += props_len
        body = data[pos:pos + body_len]
        if pos + body_len != len(data):
            raise ValueError(f"{len(data) - pos - body_len} bytes left over")
        request = AppendRequest(topic, queue_id, body, props, tags_code=tags_code, born_timestamp_ms=born_ms,
                                born_host=host, reconsume_times=reconsume, sys_flag=sys_flag)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"a delay intent record cannot be decoded ({exc})") from exc
    return (request, deliver_at, None if level < 0 else level), msg_id


class DelayLedger:
    """The intents of the delayed messages a master accepted and has not delivered yet.

    Thread-safe. ``journal`` is the broker's ``delay`` journal; ``was_delivered`` answers whether
    a request's message is already on its real topic.
    """

    def __init__(self, journal: Journal, was_delivered: WasDelivered) -> None:
        self.journal = journal
        self._was_delivered = was_delivered
        self._lock = threading.RLock()  # re-entered by a plugin that writes back inside schedule()
        # unique key -> (offset, size) of its intent record, and the delay plugin's msg id
        self._pending: dict[str, tuple[int, int, str]] = {}
        self._ids: dict[str, str] = {}  # the delay plugin's msg id -> unique key (for cancels)
        self._accepting: str | None = None  # the unique key being scheduled right now
        self._written_back_early = False

    # ------------------------------------------------------------------------------ master
    def accept(self, request: AppendRequest, deliver_at_ms: int, delay_level: int | None,
               schedule: Callable[[], AppendResult]) -> AppendResult:
        """Hand a delayed message to the delay plugin (``schedule``), then write its intent. A
        message the plugin refuses leaves no intent; the write-back waits for the intent (same
        lock), so an intent is pending exactly while its message is not delivered."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        with self._lock:
            self._accepting, self._written_back_early = unique, False
            try:
                result = schedule()
            finally:
                self._accepting = None
            at, size = self.journal.append_located(encode_intent(request, deliver_at_ms, delay_level, result.msg_id))
            if unique and not self._written_back_early:
                self._pending[unique] = (at, size, result.msg_id)
                self._ids[result.msg_id] = unique
        return result

    def cancelled(self, msg_id: str) -> None:
        """The delay plugin cancelled ``msg_id``: a cancel record, so no later master delivers it."""
        with self._lock:
            unique = self._ids.pop(msg_id, None)
            if unique is None or self._pending.pop(unique, None) is None:
                return
            self.journal.append_located(_CANCEL + unique.encode())

    def rescheduled(self, msg_id: str, deliver_at_ms: int,
                    move: Callable[[], AppendResult | None]) -> AppendResult | None:
        """Move the delayed message ``msg_id`` with the delay plugin (``move``), then write its
        intent again with the new time and id: a later intent of a unique key replaces the
        earlier one, so a later master delivers it at the new time. Under the ledger's lock, so a
        write-back of the moved message waits for the intent, as in :meth:`accept`."""
        with self._lock:
            result = move()
            unique = self._ids.pop(msg_id, None)
            pending = self._pending.get(unique) if unique is not None else None
            if result is None or unique is None or pending is None:
                return result
            body = self.journal.read_record(pending[0], pending[1])
            if body is None:
                log.error("the intent of a rescheduled delayed message is gone from the log; a later master "
                          "would deliver it at its old time", journal=self.journal.topic, msg_id=msg_id)
                return result
            (request, _old, _level), _ = decode_intent(body)
            request = attrs.evolve(request, properties={
                **{k: v for k, v in request.properties.items() if k != Prop.DELAY_LEVEL},
                Prop.DELIVER_AT_MS: str(deliver_at_ms)})
            at, size = self.journal.append_located(encode_intent(request, deliver_at_ms, None, result.msg_id))
            self._pending[unique] = (at, size, result.msg_id)
            self._ids[result.msg_id] = unique
        return result

    def take_pending(self, request: AppendRequest) -> bool:
        """Called before a delayed message is written back: True (and no longer pending) when its
        intent was pending here. False means the broker must check the topic before writing: the
        plugin may hold a copy from an earlier mastership that another master delivered since."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        if not unique:
            return True
        with self._lock:
            if unique == self._accepting:  # written back inside schedule(): never pending
                self._written_back_early = True
                return True
            pending = self._pending.pop(unique, None)
            if pending is None:
                return False
            self._ids.pop(pending[2], None)
            return True

    def compact(self) -> None:
        """Write a snapshot: pointers to the pending intent records (the journal asks when due)."""
        with self._lock:
            data = b"".join(_POINTER.pack(at, size) for at, size, _ in self._pending.values())
            self.journal.write_snapshot(data)

    def floor(self) -> int | None:
        """The oldest pending intent record: retention keeps it (the snapshot only points at it)."""
        with self._lock:
            return min((at for at, _, _ in self._pending.values()), default=None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    # ------------------------------------------------------------------------------ start, promotion
    def load(self) -> list[DelayIntent]:
        """Rebuild the pending intents from the journal (at start, and when a slave is promoted);
        returns them, oldest deliver time first. Intents the log shows delivered or cancelled are
        dropped."""
        snapshot, records = self.journal.replay_located()
        located: list[tuple[int, int, bytes | None]] = []
        if snapshot:
            located += [(at, size, self.journal.read_record(at, size)) for at, size in _POINTER.iter_unpack(snapshot)]
        located += records
        found: dict[str, tuple[int, int, DelayIntent, str]] = {}
        anonymous: list[DelayIntent] = []
        lost = damaged = 0
        for at, size, body in located:
            if body is None:
                lost += 1
            elif body[:1] == _CANCEL:
                found.pop(body[1:].decode(errors="replace"), None)
            else:
                try:
                    intent, msg_id = decode_intent(body)
                except CorruptRecordError:
                    damaged += 1  # the store checked the record's CRC: a bug or a foreign writer
                    continue
                unique = intent[0].properties.get(Prop.UNIQ_KEY)
                if unique:
                    found[unique] = (at, size, intent, msg_id)
                else:
                    anonymous.append(intent)
        if lost:
            log.error("delay intents pointed at by the snapshot are gone from the log (retention removed them)",
                      journal=self.journal.topic, lost=lost)
        if damaged:
            log.error("delay intent records that cannot be decoded were skipped", journal=self.journal.topic,
                      damaged=damaged)
        # was_delivered looks for the message on its real topic, which the intent names.
        live = {u: f for u, f in found.items() if not self._was_delivered(f[2][0])}
        with self._lock:
            self._pending = {u: (at, size, msg_id) for u, (at, size, _, msg_id) in live.items()}
            self._ids = {msg_id: u for u, (_, _, _, msg_id) in live.items()}
        intents = [*(f[2] for f in live.values()), *(i for i in anonymous if not self._was_delivered(i[0]))]
        intents.sort(key=lambda intent: intent[1])
        return intents

    def schedule_taken_over(self, delay: DelayScheduler, intents: list[DelayIntent]) -> None:
        """A promoted slave hands the old master's pending intents (from :meth:`load`) to its
        started delay service, each with its own deliver time; cancels then take this plugin's ids."""
        for request, deliver_at_ms, level in intents:
            result = delay.schedule(request, deliver_at_ms=deliver_at_ms, delay_level=level)
            unique = request.properties.get(Prop.UNIQ_KEY)
            with self._lock:
                pending = self._pending.get(unique) if unique else None
                if unique and pending is not None:
                    self._pending[unique] = (pending[0], pending[1], result.msg_id)
                    self._ids[result.msg_id] = unique
        log.warning("delayed messages taken over from the previous master", count=len(intents),
                    journal=self.journal.topic)
