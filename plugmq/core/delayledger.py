"""Delayed messages that survive a failover: each one is also an intent record in the commit log.

A delay plugin keeps its pending messages in files of its own, which replication does not copy.
With replication on, the broker therefore writes every delayed message it accepts as a record of
its ``delay`` journal (``rmq_sys_state_delay``: the whole request and its deliver time) before
handing it to the plugin, and the send is acknowledged (on a ``sync_master``: once a slave holds
it) only after that. There is no "done" record: a delivery is itself a message in the same log,
so a slave that holds a prefix of the log knows exactly which of the intents in that prefix its
master delivered (``was_delivered``: the message's unique key on its real topic).

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

from plugmq.core.contracts import DelayScheduler, WasDelivered
from plugmq.core.errors import CorruptRecordError
from plugmq.core.journal import Journal
from plugmq.core.kvstore.codec import decode_properties, encode_properties
from plugmq.core.logs import get_logger
from plugmq.core.message import AppendRequest
from plugmq.core.names import Prop

__all__ = ["DelayIntent", "DelayLedger", "decode_intent", "encode_intent"]

log = get_logger(__name__)

# deliver at (ms), delay level (-1: none), queue id, reconsume times, sys flag, tags code,
# born timestamp (ms), then the lengths of topic, born host, properties, body.
_HEAD = struct.Struct(">qiiiiqqHHII")
_POINTER = struct.Struct(">qi")

DelayIntent = tuple[AppendRequest, int, "int | None"]
"""A pending delayed message: its request (delay properties included), deliver time, level."""


def encode_intent(request: AppendRequest, deliver_at_ms: int, delay_level: int | None) -> bytes:
    topic, host = request.topic.encode(), request.born_host.encode()
    props = encode_properties(request.properties)
    head = _HEAD.pack(deliver_at_ms, -1 if delay_level is None else delay_level, request.queue_id,
                      request.reconsume_times, request.sys_flag, request.tags_code, request.born_timestamp_ms,
                      len(topic), len(host), len(props), len(request.body))
    return b"".join((head, topic, host, props, request.body))


def decode_intent(data: bytes) -> DelayIntent:
    try:
        (deliver_at, level, queue_id, reconsume, sys_flag, tags_code, born_ms,
         topic_len, host_len, props_len, body_len) = _HEAD.unpack_from(data)
        pos = _HEAD.size
        topic = data[pos:pos + topic_len].decode()
        pos += topic_len
        host = data[pos:pos + host_len].decode()
        pos += host_len
        props = decode_properties(data[pos:pos + props_len])
        pos += props_len
        body = data[pos:pos + body_len]
        if pos + body_len != len(data):
            raise ValueError(f"{len(data) - pos - body_len} bytes left over")
        request = AppendRequest(topic, queue_id, body, props, tags_code=tags_code, born_timestamp_ms=born_ms,
                                born_host=host, reconsume_times=reconsume, sys_flag=sys_flag)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"a delay intent record cannot be decoded ({exc})") from exc
    return request, deliver_at, None if level < 0 else level


class DelayLedger:
    """The intents of the delayed messages a master accepted and has not delivered yet.

    Thread-safe. ``journal`` is the broker's ``delay`` journal; ``was_delivered`` answers whether
    a request's message is already on its real topic.
    """

    def __init__(self, journal: Journal, was_delivered: WasDelivered) -> None:
        self.journal = journal
        self._was_delivered = was_delivered
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[int, int]] = {}  # unique key -> (offset, size) of its intent record

    # ------------------------------------------------------------------------------ master
    def record(self, request: AppendRequest, deliver_at_ms: int, delay_level: int | None) -> None:
        """Write the intent of an accepted delayed message (before the delay plugin gets it)."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        with self._lock:  # record and pending entry in one order with compact()'s snapshot
            where = self.journal.append_located(encode_intent(request, deliver_at_ms, delay_level))
            if unique:
                self._pending[unique] = where

    def take_pending(self, request: AppendRequest) -> bool:
        """Called before a delayed message is written back: True (and no longer pending) when its
        intent was pending here. False means the broker must check the topic before writing: the
        plugin may hold a copy from an earlier mastership that another master delivered since."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        if not unique:
            return True
        with self._lock:
            return self._pending.pop(unique, None) is not None

    def compact(self) -> None:
        """Write a snapshot: pointers to the pending intent records (the journal asks when due)."""
        with self._lock:
            data = b"".join(_POINTER.pack(at, size) for at, size in self._pending.values())
            self.journal.write_snapshot(data)

    def floor(self) -> int | None:
        """The oldest pending intent record: retention keeps it (the snapshot only points at it)."""
        with self._lock:
            return min((at for at, _ in self._pending.values()), default=None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    # ------------------------------------------------------------------------------ start, promotion
    def load(self) -> list[DelayIntent]:
        """Rebuild the pending intents from the journal (at start, and when a slave is promoted);
        returns them, oldest deliver time first. Intents the log shows delivered are dropped."""
        snapshot, records = self.journal.replay_located()
        located: list[tuple[int, int, bytes | None]] = []
        if snapshot:
            for at, size in _POINTER.iter_unpack(snapshot):
                located.append((at, size, self.journal.read_record(at, size)))
        located += [(at, size, body) for at, size, body in records]
        pending: dict[str, tuple[int, int]] = {}
        intents: list[DelayIntent] = []
        lost = 0
        for at, size, body in located:
            if body is None:
                lost += 1
                continue
            intent = decode_intent(body)
            unique = intent[0].properties.get(Prop.UNIQ_KEY)
            if unique in pending or self._was_delivered(intent[0]):  # it names its real topic
                continue
            if unique:
                pending[unique] = (at, size)
            intents.append(intent)
        if lost:
            log.error("delay intents pointed at by the snapshot are gone from the log (retention removed them)",
                      journal=self.journal.topic, lost=lost)
        with self._lock:
            self._pending = pending
        intents.sort(key=lambda intent: intent[1])
        return intents

    def schedule_taken_over(self, delay: DelayScheduler, intents: list[DelayIntent]) -> None:
        """A promoted slave hands the old master's pending intents (from :meth:`load`) to its
        started delay service, each with its own deliver time."""
        for request, deliver_at_ms, level in intents:
            delay.schedule(request, deliver_at_ms=deliver_at_ms, delay_level=level)
        log.warning("delayed messages taken over from the previous master", count=len(intents),
                    journal=self.journal.topic)
