"""Dedup windows: a send whose key was stored on its topic within the window is not stored again.

A topic with ``[topics.<t>] dedup = true`` keeps, for ``dedup_window_s``, the key of every message
stored on it (its unique id, which an official client's retry sends again, or with ``dedup_by =
"keys"`` its business keys) and where the first copy went. A send with a key in the window is
answered with the first copy's msg id, queue and offset, and nothing is stored; on a
``sync_master`` the answer still waits until a slave holds the first copy.

The window is rebuilt from the log, so it is as durable and as replicated as the messages: a
message *is* its dedup record. At start (and when a slave is promoted) every queue of a dedup
topic is read from the first message stored within the window. Delayed messages are not on their
topic until due, so each delayed send in a dedup topic also writes a record to the ``dedup``
journal (``rmq_sys_state_dedup``), read back the same way. Costs: one dict lookup per send of a
topic without dedup; with dedup, a lookup and an insert per send plus the memory of the window's
keys (about 200 bytes each), and a start-up read of the messages stored within the window.

Concurrent sends of one key: the first reserves it; the others wait for its outcome (its copy, or
its failure, after which one of them stores).
"""

from __future__ import annotations

import collections
import struct
import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple

from plugmq.broker.journal import Journal
from plugmq.config.topics import TopicSettings, TopicSettingsTable
from plugmq.core.clock import Clock
from plugmq.core.contracts import MessageStore, read_entries
from plugmq.core.errors import CorruptRecordError
from plugmq.core.logs import get_logger
from plugmq.core.message import AppendRequest, Message, StoredMessage
from plugmq.core.names import Prop, is_system_topic

__all__ = ["Copy", "DedupWindows", "dedup_key"]

log = get_logger(__name__)

_RECORD = struct.Struct(">qqiqHHHH")  # store ms, end offset, queue id, queue offset, 4 lengths
_LENGTH = struct.Struct(">I")  # a record's length in a snapshot
_COMPACT_BYTES = 1 << 20


class Copy(NamedTuple):
    """Where the first copy of a key went: what a duplicate is answered with.

    A named tuple, not an attrs class: one is made per send on a dedup topic, and a tuple is the
    cheapest value to build there (the window's cost per send is what its users pay)."""

    msg_id: str
    unique_id: str
    queue_id: int
    queue_offset: int
    end_offset: int  # commit-log offset past it (a sync_master's duplicate waits for a slave up to it)
    stored_ms: int


def dedup_key(settings: TopicSettings, message: Message, request: AppendRequest) -> str | None:
    """The key a send is deduplicated by on a topic with ``settings`` (None: not deduplicated)."""
    if settings.dedup_by == "keys":
        return " ".join(message.keys) or None
    return request.properties.get(Prop.UNIQ_KEY)


def _stored_key(settings: TopicSettings, message: StoredMessage) -> str | None:
    if settings.dedup_by == "keys":
        return message.properties.get(Prop.KEYS) or None
    return message.unique_id


class _Window:
    """One topic's keys in store order; expired from the old end as time passes."""

    def __init__(self, settings: TopicSettings) -> None:
        self.settings = settings
        self.copies: dict[str, Copy] = {}
        self.order: collections.deque[tuple[int, str]] = collections.deque()

    def add(self, key: str, copy: Copy) -> None:
        self.copies[key] = copy
        self.order.append((copy.stored_ms, key))

    def expire(self, now_ms: int) -> None:
        oldest = now_ms - self.settings.dedup_window_ms
        order, copies = self.order, self.copies
        while order and order[0][0] < oldest:
            stored, key = order.popleft()
            found = copies.get(key)
            if found is not None and found.stored_ms == stored:
                del copies[key]


class DedupWindows:
    """Every dedup topic's window; thread-safe."""

    def __init__(self, settings: TopicSettingsTable, clock: Clock, store: MessageStore, journal: Journal | None,
                 topics: Callable[[], dict[str, int]], floor: Callable[[str, int], int] | None = None) -> None:
        self._settings = settings
        self._floor = floor  # where a deleted topic's queue starts again (plugmq.broker.deletedtopics)
        self._clock = clock
        self._store = store
        self.journal = journal
        self._topics = topics
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # a pending key was stored or failed
        self._windows: dict[str, _Window] = {}
        self._pending: set[tuple[str, str]] = set()  # keys being stored by a claimant
        self._waiting = 0  # sends waiting for a claimant's outcome (notified only when some are)
        self._delayed: dict[tuple[str, str], Copy] = {}  # journaled: delayed sends within their window

    def settings_for(self, topic: str) -> TopicSettings | None:
        """The topic's settings when it deduplicates (None, cheaply, when it does not)."""
        return self._settings.dedup(topic)

    # ------------------------------------------------------------------------------ sends
    def claim(self, topic: str, key: str) -> Copy | None:
        """The first copy of ``key`` on ``topic`` within the window, or None: then the caller
        stores it and must call :meth:`stored` or :meth:`failed` for the key."""
        with self._lock:
            while True:
                window = self._window(topic)
                window.expire(self._clock.now_ms())
                found = window.copies.get(key)
                if found is not None:
                    return found
                if (topic, key) not in self._pending:
                    self._pending.add((topic, key))
                    return None
                # Another send of the key is being stored: its outcome decides (its copy in the
                # window, or the key free again for this send to store).
                self._waiting += 1
                try:
                    self._settled.wait()
                finally:
                    self._waiting -= 1

    def stored(self, topic: str, key: str, copy: Copy, *, delayed: bool = False) -> None:
        """The claimed key's message is stored (or scheduled: ``delayed``, journaled as well)."""
        if delayed and self.journal is not None:
            self.journal.append([_encode(topic, key, copy)])
        with self._lock:
            self._window(topic).add(key, copy)
            if delayed:
                self._delayed[(topic, key)] = copy
            self._pending.discard((topic, key))
            if self._waiting:
                self._settled.notify_all()
        if delayed and self.journal is not None and self.journal.bytes_since_snapshot >= _COMPACT_BYTES:
            self.compact()

    def failed(self, topic: str, key: str) -> None:
        """The claimed key's send failed: the next send of it stores it."""
        with self._lock:
            self._pending.discard((topic, key))
            if self._waiting:
                self._settled.notify_all()

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: its stored copies are below the queue floors and never served
        again, so a send of one of their keys is a new message. Delayed sends still pending keep
        their keys (they are delivered when due, to the topic created again)."""
        with self._lock:
            if self._windows.pop(topic, None) is None:
                return
            pending = sorted((copy.stored_ms, key, copy) for (t, key), copy in self._delayed.items() if t == topic)
            if pending:
                window = self._windows[topic] = _Window(self._settings.settings(topic))
                for _, key, copy in pending:
                    window.add(key, copy)

    def _window(self, topic: str) -> _Window:
        window = self._windows.get(topic)
        if window is None:
            settings = self._settings.settings(topic)
            window = self._windows[topic] = _Window(settings)
        return window

    def __len__(self) -> int:
        with self._lock:
            return sum(len(w.copies) for w in self._windows.values())

    # ------------------------------------------------------------------------------ rebuilding
    def load(self) -> int:
        """Rebuild every window from the log (at start, and when a slave is promoted): the
        messages stored within the window, then the delayed sends the journal holds. Returns
        how many keys are in the windows."""
        now = self._clock.now_ms()
        windows: dict[str, _Window] = {}
        for topic, queue_count in sorted(self._topics().items()):
            settings = self._settings.dedup(topic)
            if settings is None or is_system_topic(topic):
                continue
            window = windows[topic] = _Window(settings)
            for copy, key in sorted(self._scan(topic, queue_count, settings, now), key=lambda found: found[0].stored_ms):
                window.add(key, copy)
        delayed: dict[tuple[str, str], Copy] = {}
        for topic, key, copy in self._journaled():
            settings = self._settings.dedup(topic)
            if settings is not None and copy.stored_ms >= now - settings.dedup_window_ms:
                windows.setdefault(topic, _Window(settings)).add(key, copy)
                delayed[(topic, key)] = copy
        for window in windows.values():
            window.order = collections.deque(sorted(window.order))
        with self._lock:
            self._windows = windows
            self._delayed = delayed
        keys = sum(len(w.copies) for w in windows.values())
        if windows:
            log.info("dedup windows rebuilt from the log", topics=len(windows), keys=keys)
        return keys

    def _scan(self, topic: str, queue_count: int, settings: TopicSettings, now: int) -> Iterable[tuple[Copy, str]]:
        store = self._store
        since = now - settings.dedup_window_ms
        for queue_id in range(queue_count):
            floor = self._floor(topic, queue_id) if self._floor is not None else 0
            offset = max(store.offset_for_timestamp(topic, queue_id, since), store.min_offset(topic, queue_id), floor)
            high = store.max_offset(topic, queue_id)
            while offset < high:
                entries = store.read_queue(topic, queue_id, offset, min(1024, high - offset))
                if not entries:
                    break
                for entry, message in zip(entries, read_entries(store, entries)):
                    if message is None or message.store_timestamp_ms < since:
                        continue
                    key = _stored_key(settings, message)
                    if key:
                        yield Copy(message.msg_id, message.unique_id or "", queue_id, message.queue_offset,
                                   entry.commit_log_offset + entry.size, message.store_timestamp_ms), key
                offset = entries[-1].queue_offset + 1

    def _journaled(self) -> Iterable[tuple[str, str, Copy]]:
        if self.journal is None:
            return
        replay = self.journal.replay()
        bodies = list(_split_snapshot(replay.snapshot or b"")) + list(replay.records)
        for body in bodies:
            try:
                yield _decode(body)
            except CorruptRecordError as exc:
                log.error("a dedup record cannot be decoded; skipped", error=str(exc))

    def compact(self) -> None:
        """Write the ``dedup`` journal's snapshot: the delayed sends still within their window."""
        if self.journal is None or not self.journal.writable:
            return
        now = self._clock.now_ms()
        with self._lock:
            live = {}
            for (topic, key), copy in self._delayed.items():
                settings = self._settings.dedup(topic)
                if settings is not None and copy.stored_ms >= now - settings.dedup_window_ms:
                    live[(topic, key)] = copy
            self._delayed = live
            records = [_encode(topic, key, copy) for (topic, key), copy in live.items()]
            self.journal.write_snapshot(b"".join(_LENGTH.pack(len(r)) + r for r in records))


def _split_snapshot(data: bytes) -> Iterable[bytes]:
    pos = 0
    while pos + _LENGTH.size <= len(data):
        (length,) = _LENGTH.unpack_from(data, pos)
        pos += _LENGTH.size
        yield data[pos:pos + length]
        pos += length


def _encode(topic: str, key: str, copy: Copy) -> bytes:
    texts = [topic.encode(), key.encode(), copy.msg_id.encode(), copy.unique_id.encode()]
    return _RECORD.pack(copy.stored_ms, copy.end_offset, copy.queue_id, copy.queue_offset,
                        *(len(t) for t in texts)) + b"".join(texts)


def _decode(body: bytes) -> tuple[str, str, Copy]:
    try:
        stored, end, queue_id, queue_offset, *lengths = _RECORD.unpack_from(body)
        pos = _RECORD.size
        texts = []
        for length in lengths:
            texts.append(body[pos:pos + length].decode())
            pos += length
        if pos != len(body):
            raise ValueError(f"{len(body) - pos} bytes left over")
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"dedup record: {exc}") from exc
    topic, key, msg_id, unique_id = texts
    return topic, key, Copy(msg_id, unique_id, queue_id, queue_offset, end, stored)
