"""Service state as records in the commit log (RocketMQ keeps its op records and pop checkpoints there).

Every stateful service of a broker - consumer offsets, pop progress, the transaction op log,
delay bookkeeping - writes its changes as records of its own system topic
(``rmq_sys_state_<service>``, queue 0) through a :class:`Journal`, instead of a file of its own.
What that buys, all from the one commit log:

* one order: a prefix of the log is a consistent cut of messages *and* state, so a slave that
  holds a prefix holds a state its master really had;
* one confirmed offset: a ``sync_master``'s slave confirms state records with the messages, and
  a service waits for it (:meth:`Journal.settle`) where its promise needs it (a settled
  transaction, an ack);
* one cut: ``truncate_log`` removes a returning old master's unconfirmed messages and the state
  that went with them together;
* one durability: a record is as durable as a message (the store's flush mode), also after a
  ``kill -9``.

A service keeps its state in memory, appends a record *before* the change takes effect, and
rebuilds at start with :meth:`Journal.replay`: the latest complete snapshot, then every record
written after it. A snapshot is one batch of parts (a head part saying how many, then the rest),
written under the service's lock so no record of the service falls inside it; a snapshot torn by
a crash is incomplete and replay falls back to the one before (records never depend on a
snapshot being there: a snapshot equals the state the records before it built). The retention
floor keeps the latest complete snapshot and everything after it (:meth:`Journal.floor`); a
service writes a new snapshot when its records since the last one grew large
(:attr:`Journal.bytes_since_snapshot`) and the broker asks for one when the old snapshot holds
retention back too long (:meth:`Journal.snapshot_lag`).

On a slave the store is written by the replication stream only: a journal there is read-only
(:attr:`Journal.writable` is False) and a service follows its master's records as they arrive
(:meth:`Journal.follow`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from plugmq.core.clock import Clock
from plugmq.core.contracts import (
    SYSTEM_RECORD_HEADROOM,
    JournalReplay,
    LogPositioned,
    MessageStore,
    QueuePreparing,
    has_capability,
)
from plugmq.core.errors import CorruptRecordError, PlugmqError, ReadOnlyBrokerError
from plugmq.core.logs import get_logger
from plugmq.core.message import AppendRequest, AppendResult, SendStatus, StoredMessage
from plugmq.core.names import validate_topic
from plugmq.core.retention import RetentionFloor

__all__ = ["DEFAULT_SNAPSHOT_LAG_BYTES", "JOURNAL_TOPIC_PREFIX", "SNAPSHOT_PART_BYTES", "Journal", "JournalSet", "journal_topic"]

log = get_logger(__name__)

JOURNAL_TOPIC_PREFIX = "rmq_sys_state_"
_QUEUE = 0
# The consume-queue tag field says what an entry is, so scans never read the commit log.
_RECORD = 0
_SNAPSHOT_HEAD = 1
_SNAPSHOT_PART = 2
_PARTS = "STATE_SNAPSHOT_PARTS"
_PAGE = 4096
#: A snapshot is stored in parts of at most this many bytes: within the headroom every store
#: accepts above the client limit, so a part fits however small ``max_message_size`` is set.
SNAPSHOT_PART_BYTES = SYSTEM_RECORD_HEADROOM // 2
#: A snapshot further behind the log end than this holds retention back: a new one is due.
DEFAULT_SNAPSHOT_LAG_BYTES = 256 * 1024 * 1024
#: A snapshot older than this (clock ms) with log written after it: a new one is due, so the
#: journal never holds retention back by more than about this long.
DEFAULT_SNAPSHOT_AGE_MS = 60_000

Settle = Callable[[int], SendStatus]


@attrs.frozen
class _Held:
    """What a journal holds against retention: from ``floor`` (a snapshot's head, or the first
    record) to ``end`` (past the snapshot), written at ``store_ms``."""

    floor: int
    end: int
    store_ms: int


def journal_topic(service: str) -> str:
    """The system topic holding ``service``'s records."""
    return validate_topic(JOURNAL_TOPIC_PREFIX + service)


class Journal:
    """One service's records on its system topic. Thread-safe; a service serialises its own
    appends with its state lock (a record must not overtake the change it describes)."""

    def __init__(self, store: MessageStore, service: str, *, writable: Callable[[], bool] | None = None,
                 settle: Settle | None = None, broker_name: str = "", clock: Clock | None = None,
                 snapshot_lag_bytes: int = DEFAULT_SNAPSHOT_LAG_BYTES,
                 snapshot_age_ms: int = DEFAULT_SNAPSHOT_AGE_MS) -> None:
        self.store = store
        self.service = service
        self.topic = journal_topic(service)
        self._writable = writable or (lambda: True)
        self._settle = settle
        self._broker_name = broker_name
        self._clock = clock
        self.snapshot_lag_bytes = snapshot_lag_bytes
        self.snapshot_age_ms = snapshot_age_ms
        self._end = 0  # the log offset past this journal's last write (stores without log_end_offset)
        self._lock = threading.Lock()
        self._position = 0  # the next queue offset not applied by the service
        # What replay starts from: the latest snapshot, or the first record while there is none.
        self._held: _Held | None = None
        self.bytes_since_snapshot = 0
        self.records_since_snapshot = 0
        self._log = log.bind(journal=self.topic)

    # ------------------------------------------------------------------------------ writing
    @property
    def writable(self) -> bool:
        """False on a slave: its store takes the master's records only."""
        return self._writable()

    def _request(self, body: bytes, kind: int, properties: dict[str, str] | None = None) -> AppendRequest:
        # Its topic was checked when the journal was made, the rest is ours: no validators per record
        # (every pop ack and offset commit writes one). The store checks what it writes.
        return AppendRequest.trusted(self.topic, _QUEUE, bytes(body), properties or {}, tags_code=kind)

    def _write(self, requests: list[AppendRequest]) -> list[AppendResult]:
        if not self._writable():
            raise ReadOnlyBrokerError(f"broker {self._broker_name!r} is a slave: its {self.service} state follows "
                                      "the master's and cannot be written here")
        results = self.store.append_batch(requests)
        with self._lock:
            if self._held is None:
                first = results[0]
                self._held = _Held(first.commit_log_offset, first.commit_log_offset, first.store_timestamp_ms)
            self._position = max(self._position, results[-1].queue_offset + 1)
            self._end = max(self._end, results[-1].commit_log_offset + results[-1].size)
        return results

    def decode_json(self, record: bytes, what: str) -> Any:
        """A record written as JSON; CorruptRecordError naming this journal and ``what`` it is
        (e.g. "an offset record") when it is not."""
        try:
            return json.loads(record)
        except ValueError as exc:
            raise CorruptRecordError(f"{self.topic}: {what} is not JSON ({exc}); the store holds a damaged "
                                     "record") from exc

    def append(self, bodies: Sequence[bytes]) -> int:
        """Store records (one batch, in order); returns the log offset just past the last one,
        which :meth:`settle` takes. ReadOnlyBrokerError where the journal is not writable."""
        if not bodies:
            raise ValueError("a journal append needs at least one record")
        last = self._write([self._request(body, _RECORD) for body in bodies])[-1]
        with self._lock:
            self.bytes_since_snapshot += sum(len(b) for b in bodies)
            self.records_since_snapshot += len(bodies)
        return last.commit_log_offset + last.size

    def append_located(self, body: bytes) -> tuple[int, int]:
        """Store one record; returns its ``(commit-log offset, size)`` (read it back with
        :meth:`read_record`). ReadOnlyBrokerError where the journal is not writable."""
        result = self._write([self._request(body, _RECORD)])[0]
        with self._lock:
            self.bytes_since_snapshot += len(body)
            self.records_since_snapshot += 1
        return result.commit_log_offset, result.size

    def read_record(self, commit_log_offset: int, size: int) -> bytes | None:
        """The body of this journal's record at ``commit_log_offset`` (None: gone, or not one)."""
        message = self.store.read(commit_log_offset, size)
        return message.body if message is not None and message.topic == self.topic else None

    def write_snapshot(self, data: bytes) -> int:
        """Store a snapshot of the whole state (one batch of parts of at most ``SNAPSHOT_PART_BYTES``);
        the caller holds its state lock so nothing of its own comes in between. Returns the log
        offset just past it."""
        parts = [data[i:i + SNAPSHOT_PART_BYTES] for i in range(0, len(data), SNAPSHOT_PART_BYTES)] or [b""]
        requests = [self._request(parts[0], _SNAPSHOT_HEAD, {_PARTS: str(len(parts))})]
        requests += [self._request(part, _SNAPSHOT_PART) for part in parts[1:]]
        results = self._write(requests)
        with self._lock:
            head, last = results[0], results[-1]
            self._held = _Held(head.commit_log_offset, last.commit_log_offset + last.size, head.store_timestamp_ms)
            self.bytes_since_snapshot = 0
            self.records_since_snapshot = 0
        return results[-1].commit_log_offset + results[-1].size

    def settle(self, end_offset: int) -> SendStatus:
        """Wait (on a ``sync_master``) until a slave holds the log up to ``end_offset``; SEND_OK at
        once elsewhere. A record not confirmed stays on this broker: the outcome is logged."""
        if self._settle is None:
            return SendStatus.SEND_OK
        status = self._settle(end_offset)
        if status is not SendStatus.SEND_OK:
            self._log.warning("state record not confirmed by a slave", status=status.value, end_offset=end_offset)
        return status

    # ------------------------------------------------------------------------------ reading
    def _entries(self, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """(queue offset, tags code, commit-log offset, size) of the entries in [start, end)."""
        store = self.store
        offset = start
        while offset < end:
            entries = store.read_queue(self.topic, _QUEUE, offset, min(_PAGE, end - offset))
            if not entries:
                return
            for entry in entries:
                yield entry.queue_offset, entry.tags_code, entry.commit_log_offset, entry.size
            offset = entries[-1].queue_offset + 1

    def _message(self, commit_log_offset: int, size: int, queue_offset: int) -> StoredMessage:
        message = self.store.read(commit_log_offset, size)
        if message is None or message.topic != self.topic or message.queue_offset != queue_offset:
            raise CorruptRecordError(f"{self.topic}: the state record at queue offset {queue_offset} cannot be read "
                                     f"(commit-log offset {commit_log_offset}); the store lost part of its log")
        return message

    def _body(self, commit_log_offset: int, size: int, queue_offset: int) -> bytes:
        return self._message(commit_log_offset, size, queue_offset).body

    def _latest_snapshot(self, low: int, high: int) -> tuple[int, int, _Held] | None:
        """(head queue offset, parts, what it holds) of the latest complete snapshot."""
        store = self.store
        top = high
        while top > low:
            bottom = max(low, top - _PAGE)
            entries = store.read_queue(self.topic, _QUEUE, bottom, top - bottom)
            for index in range(len(entries) - 1, -1, -1):
                entry = entries[index]
                if entry.tags_code != _SNAPSHOT_HEAD:
                    continue
                head = store.read(entry.commit_log_offset, entry.size)
                try:
                    parts = int(head.properties.get(_PARTS, "")) if head is not None else 0
                except ValueError:
                    parts = 0
                end = self._complete(entry.queue_offset, parts, high) if parts >= 1 else None
                if head is not None and end is not None:
                    return entry.queue_offset, parts, _Held(entry.commit_log_offset, end, head.store_timestamp_ms)
                self._log.warning("incomplete snapshot skipped (torn by a crash); replaying from an older one",
                                  queue_offset=entry.queue_offset, parts=parts)
            top = bottom
        return None

    def _complete(self, head: int, parts: int, high: int) -> int | None:
        """The log offset past a snapshot whose parts are all there, else None."""
        if head + parts > high:
            return None
        entries = list(self._entries(head, head + parts))
        if len(entries) != parts or any(kind != _SNAPSHOT_PART for _, kind, _, _ in entries[1:]):
            return None
        _, _, at, size = entries[-1]
        return at + size

    def replay(self) -> JournalReplay:
        """The latest complete snapshot and the records after it; following (and appending)
        continues after them."""
        snapshot, located = self.replay_located()
        return JournalReplay(snapshot, tuple(body for _, _, body in located))

    def replay_located(self) -> tuple[bytes | None, list[tuple[int, int, bytes]]]:
        """As :meth:`replay`, each record with where it lies: ``(commit-log offset, size, body)``,
        for a service whose snapshot points at records instead of copying them."""
        store = self.store
        low, high = store.min_offset(self.topic, _QUEUE), store.max_offset(self.topic, _QUEUE)
        found = self._latest_snapshot(low, high)
        snapshot: bytes | None = None
        start = low
        if found is not None:
            head, parts, _ = found
            snapshot = b"".join(self._body(at, size, q) for q, _, at, size in self._entries(head, head + parts))
            start = head + parts
        elif low > 0:
            self._log.error("journal has no snapshot and its oldest records are gone; the state is rebuilt from "
                            "what is left", first_queue_offset=low)
        records: list[tuple[int, int, bytes]] = []
        held = found[2] if found is not None else None
        size_since = 0
        for queue_offset, kind, at, size in self._entries(start, high):
            if kind == _RECORD:
                message = self._message(at, size, queue_offset)
                if held is None:
                    held = _Held(at, at, message.store_timestamp_ms)
                records.append((at, size, message.body))
                size_since += len(message.body)
        with self._lock:
            self._position = high
            self._held = held
            self.bytes_since_snapshot = size_since
            self.records_since_snapshot = len(records)
        return snapshot, records

    def follow(self) -> list[bytes] | None:
        """Records stored since the last replay, follow or append (a slave applying its master's
        records as they arrive); snapshots are skipped (they equal what the records built).
        None when the log was cut below what was applied: the service must replay afresh."""
        store = self.store
        high = store.max_offset(self.topic, _QUEUE)
        with self._lock:
            position = self._position
        if high == position:
            return []
        if high < position:
            return None
        records: list[bytes] = []
        for queue_offset, kind, at, size in self._entries(max(position, store.min_offset(self.topic, _QUEUE)), high):
            if kind == _RECORD:
                message = self._message(at, size, queue_offset)
                records.append(message.body)
                with self._lock:
                    if self._held is None:
                        self._held = _Held(at, at, message.store_timestamp_ms)
                    self.bytes_since_snapshot += len(message.body)
                    self.records_since_snapshot += 1
            elif kind == _SNAPSHOT_HEAD:
                head = self._message(at, size, queue_offset)
                with self._lock:
                    # Whole or not (a torn one is followed by no parts), it holds from here on.
                    self._held = _Held(at, at + size, head.store_timestamp_ms)
                    self.bytes_since_snapshot = self.records_since_snapshot = 0
            elif kind == _SNAPSHOT_PART:
                with self._lock:
                    if self._held is not None:
                        self._held = attrs.evolve(self._held, end=at + size)
        with self._lock:
            self._position = high
        return records

    def apply_followed(self, apply: Callable[[bytes], None], rebuild: Callable[[], None]) -> bool:
        """:meth:`follow` for a service (under its state lock): each new record goes to ``apply``;
        a cut below what was applied calls ``rebuild`` (replay afresh). True if anything changed."""
        records = self.follow()
        if records is None:
            rebuild()
            return True
        for record in records:
            apply(record)
        return bool(records)

    # ------------------------------------------------------------------------------ retention
    def floor(self) -> int | None:
        """The lowest commit-log offset replay needs: the latest complete snapshot's head (or the
        first record when there is no snapshot yet); None for an empty journal."""
        with self._lock:
            return None if self._held is None else self._held.floor

    def _log_end(self) -> int:
        return self.store.log_end_offset() if has_capability(self.store, LogPositioned) else self._end

    def snapshot_lag(self) -> int:
        """How far (bytes of commit log) the latest snapshot (or the first record, with none yet)
        lies behind the log end: what it holds back from retention. 0 for an empty journal."""
        held = self.floor()
        return 0 if held is None else max(0, self._log_end() - held)

    def snapshot_due(self) -> bool:
        """Whether a new snapshot is wanted to release retention: the latest one (or the first
        record) holds more than ``snapshot_lag_bytes`` of log, or it is older than
        ``snapshot_age_ms`` and something was written after it."""
        if not self.writable:
            return False
        with self._lock:
            held = self._held
        if held is None:
            return False
        end = self._log_end()
        if end - held.floor > self.snapshot_lag_bytes:
            return True
        now = self._clock.now_ms() if self._clock is not None else None
        return now is not None and now - held.store_ms >= self.snapshot_age_ms and end > held.end

    def sync(self) -> None:
        """Flush the store: every record written so far is durable."""
        self.store.flush()

    @property
    def position(self) -> int:
        """The next queue offset of the journal topic not yet replayed, followed or written."""
        with self._lock:
            return self._position


class JournalSet:
    """A broker's journals: one per service, each holding the retention floor at its latest
    snapshot, and a retention participant that asks a service for a new snapshot when its
    latest one holds retention back too long."""

    def __init__(self, store: MessageStore, *, writable: Callable[[], bool], settle: Settle | None,
                 broker_name: str, floor: RetentionFloor | None, clock: Clock,
                 snapshot_lag_bytes: int = DEFAULT_SNAPSHOT_LAG_BYTES,
                 snapshot_age_ms: int = DEFAULT_SNAPSHOT_AGE_MS) -> None:
        self._store = store
        self._clock = clock
        self._snapshot_age_ms = snapshot_age_ms
        self._writable = writable
        self._settle = settle
        self._broker_name = broker_name
        self._floor = floor
        self._snapshot_lag_bytes = snapshot_lag_bytes
        self._journals: dict[str, Journal] = {}
        self._compactors: dict[str, Callable[[], None]] = {}

    def open(self, service: str, *, compact: Callable[[], None] | None = None) -> Journal:
        """The journal of ``service`` (one per name). ``compact`` writes the service's snapshot;
        without it the service watches :meth:`Journal.snapshot_due` itself."""
        if service in self._journals:
            raise ValueError(f"the journal of {service!r} is open already")
        journal = Journal(self._store, service, writable=self._writable, settle=self._settle,
                          broker_name=self._broker_name, clock=self._clock,
                          snapshot_lag_bytes=self._snapshot_lag_bytes, snapshot_age_ms=self._snapshot_age_ms)
        self._journals[service] = journal
        if isinstance(self._store, QueuePreparing) and journal.writable:
            try:  # now, while descriptors are to be had (a full table later never stops a state record)
                self._store.prepare_queue(journal.topic, _QUEUE)
            except PlugmqError as exc:
                log.warning("cannot prepare the state journal's file at start; its first record makes it",
                            service=service, error=str(exc))
        if compact is not None:
            self._compactors[service] = compact
        if self._floor is not None:
            self._floor.hold(f"{service} state", journal.floor)
        return journal

    def compact_with(self, service: str, compact: Callable[[], None]) -> None:
        """``compact`` writes the snapshot of ``service``, whose journal is open (for a service
        built over its journal: it can only name its ``compact`` once it exists)."""
        if service not in self._journals:
            raise ValueError(f"the journal of {service!r} is not open")
        self._compactors[service] = compact

    def journals(self) -> dict[str, Journal]:
        return dict(self._journals)

    def clean_expired(self, now_ms: int) -> int:
        """Snapshot the services whose latest snapshot holds retention back; returns how many."""
        del now_ms  # each journal reads the clock itself
        done = 0
        for service, compact in list(self._compactors.items()):
            journal = self._journals[service]
            if journal.snapshot_due():
                compact()
                done += 1
                log.info("state snapshot written to release retention", journal=journal.topic)
        return done
