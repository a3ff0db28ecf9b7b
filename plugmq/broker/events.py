"""What the broker tells others: event hooks for observers, wake-ups for waiting consumers.

Each event hook is emitted in one place, here: the stored, delivered, acked, invisible-changed,
retried, dead-lettered and re-driven events of every way of sending and consuming. :class:`Arrivals` wakes consumers that wait for
messages (long polling) and the arrival listeners (``plugmq serve``'s wake-up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from plugmq.broker.traffic import Traffic
from plugmq.client.values import ReceivedMessage
from plugmq.core.contracts import MessageStore, SystemTopicWriter
from plugmq.core.errors import ValidationError
from plugmq.core.message import AppendRequest, AppendResult, StoredMessage
from plugmq.core.pluginmanager import LoadedPlugins

__all__ = ["Arrivals", "Events", "HandedOut"]

# What the acked and invisible-changed events may keep of delivered messages, so that an observer
# of acks (the trace plugin) costs no store read per ack: bodies of up to this many bytes in all.
HANDED_OUT_BYTES = 32 << 20


class Arrivals:
    """Wakes consumers when messages are stored or become visible again. Thread-safe."""

    def __init__(self) -> None:
        # Called (in the storing thread) whenever consumers are woken. Cheaper than a
        # message_stored hook for who only needs to know that (plugmq serve).
        self.listeners: list[Callable[[], None]] = []
        self._arrived = threading.Condition()
        # One token per consumer in wait() not woken yet: a wake-up clears it, so the puts after it
        # (until a consumer waits again) find nobody to wake and do no locking.
        self._sleeping: list[object] = []

    @property
    def watchers(self) -> tuple[list[Callable[[], None]], list[object]]:
        """The listeners and the consumers not yet woken: while both lists are empty,
        :meth:`wake` has nothing to do (a compiled put skips the call then). Both are changed in
        place only."""
        return self.listeners, self._sleeping

    @property
    def sleeping(self) -> int:
        """How many consumers wait in :meth:`wait` and were not woken yet."""
        return len(self._sleeping)

    def wake(self) -> None:
        """Tell waiting consumers and every listener that messages arrived or became visible."""
        for listener in self.listeners:
            listener()
        if self._sleeping:  # consumers wait only in wait(), which lists them
            with self._arrived:
                self._sleeping.clear()
                self._arrived.notify_all()

    def wait(self, timeout: float) -> None:
        """Block until messages arrive or ``timeout`` real seconds passed."""
        token = object()
        with self._arrived:
            self._sleeping.append(token)
            try:
                self._arrived.wait(timeout)
            finally:
                if token in self._sleeping:  # timed out: no wake-up cleared it
                    self._sleeping.remove(token)


class HandedOut:
    """Messages recently handed to consumers, by commit-log offset, within a budget of body bytes. Thread-safe.

    An ack names a message by its offset only; reading it back from the store to tell an observer
    costs a decode per ack. Acks come soon after deliveries, so the delivered objects (alive until
    the consumer is done with them anyway) answer most of them. The oldest go first when the
    budget is spent; a miss reads the store as before.
    """

    def __init__(self, budget_bytes: int = HANDED_OUT_BYTES) -> None:
        self._budget = budget_bytes
        self._held = 0
        self._messages: dict[int, StoredMessage] = {}
        self._lock = threading.Lock()

    def keep(self, messages: Sequence[StoredMessage]) -> None:
        with self._lock:
            held, kept = self._held, self._messages
            for message in messages:
                if message.commit_log_offset not in kept:
                    kept[message.commit_log_offset] = message
                    held += len(message.body)
            while held > self._budget and kept:
                held -= len(kept.pop(next(iter(kept))).body)
            self._held = held

    def get(self, commit_log_offset: int) -> StoredMessage | None:
        """The message handed out at ``commit_log_offset``, if still kept (other groups may ask too)."""
        return self._messages.get(commit_log_offset)  # a dict read: atomic


class Events:
    """The broker's event hooks, and the traffic counters of what consumers were handed."""

    def __init__(self, broker_name: str, plugins: LoadedPlugins, store: MessageStore, traffic: Traffic) -> None:
        self._name = broker_name
        self._plugins = plugins
        self._hooks = plugins.hooks
        self._store = store
        self._traffic = traffic
        self._handed_out = HandedOut()

    @property
    def observing_stored(self) -> bool:
        """Whether a plugin observes stored messages (callers skip building their events if not)."""
        return bool(self._hooks.observers.message_stored)

    def on_plugins_changed(self, listener: Callable[[], None]) -> bool:
        """Call ``listener()`` when observers may have come or gone; False when that is not told
        (then read :attr:`observing_stored` on every send)."""
        return self._hooks.on_plugins_changed(listener)

    def stored(self, result: AppendResult, request: AppendRequest) -> None:
        """``request`` was stored as ``result``: the message_stored event."""
        if self._hooks.observers.message_stored:
            try:  # built from what was sent and where it landed, not read back from the store
                stored: StoredMessage | None = StoredMessage.from_append(request, result)
            except ValidationError:  # a store whose ids are not offset message ids
                stored = self._store.read(result.commit_log_offset, result.size)
            if stored is not None:
                self._hooks.message_stored(self._name, stored)

    def stored_all(self, results: Sequence[AppendResult], requests: Sequence[AppendRequest]) -> None:
        """A batch was stored: one message_stored event per message."""
        if self._hooks.observers.message_stored:
            for result, request in zip(results, requests, strict=True):
                self.stored(result, request)

    def delivered(self, group: str, messages: Sequence[StoredMessage], client_id: str = "") -> None:
        """``group`` was handed ``messages`` (pulled, popped or redelivered) by client ``client_id``."""
        if group and messages:
            self._traffic.delivered(group, messages)
        observers = self._hooks.observers
        if group and messages and (observers.message_acked or observers.message_invisible_changed):
            self._handed_out.keep(messages)
        if group and messages and observers.message_delivered:
            for message in messages:  # a pop redelivery knows its attempt; a pulled message is its first try
                attempt = (message.delivery_attempt if type(message) is ReceivedMessage
                           else message.reconsume_times + 1)
                self._hooks.message_delivered(self._name, group, message, client_id, attempt)

    def acked(self, group: str, messages: Sequence[StoredMessage], client_id: str = "") -> None:
        """A consumer of ``group`` consumed ``messages`` successfully (a push listener's success)."""
        if self._hooks.observers.message_acked:
            for message in messages:
                self._hooks.message_acked(self._name, group, message, client_id)

    def pop_acked(self, group: str, commit_log_offset: int, size: int, client_id: str = "") -> None:
        """A pop consumer acked the message at ``commit_log_offset`` (read back only for an observer)."""
        if self._hooks.observers.message_acked:
            message = self._handed_out_or_read(commit_log_offset, size)
            if message is not None:
                self._hooks.message_acked(self._name, group, message, client_id)

    def invisible_changed(self, group: str, commit_log_offset: int, size: int, client_id: str,
                          invisible_ms: int, gave_up: bool) -> None:
        """A pop consumer changed a message's invisible time (read back only for an observer)."""
        if self._hooks.observers.message_invisible_changed:
            message = self._handed_out_or_read(commit_log_offset, size)
            if message is not None:
                self._hooks.message_invisible_changed(self._name, group, message, client_id, invisible_ms, gave_up)

    def _handed_out_or_read(self, commit_log_offset: int, size: int) -> StoredMessage | None:
        message = self._handed_out.get(commit_log_offset)
        if message is None:
            message = self._store.read(commit_log_offset, size)
        return message

    def retried(self, group: str, message: StoredMessage, reconsume_times: int) -> None:
        """A consumer of ``group`` gave up on ``message`` for now; it comes back later."""
        self._hooks.message_retried(self._name, group, message, reconsume_times)

    def dead_lettered(self, group: str, message: StoredMessage) -> None:
        self._hooks.message_dead_lettered(self._name, group, message)

    def redriven(self, group: str, message: StoredMessage, copy_msg_id: str, topic: str) -> None:
        """An operator sent ``group``'s dead letter ``message`` back; its copy ``copy_msg_id`` is on ``topic``."""
        self._hooks.message_redriven(self._name, group, message, copy_msg_id, topic)

    def started(self, system_writer: SystemTopicWriter) -> None:
        """The broker is built and started; observers may write their system topics with ``system_writer``."""
        self._hooks.broker_started(self._name, system_writer)

    def stopping(self) -> None:
        self._hooks.broker_stopping(self._name)

    def add_observer(self, observer: object, name: str) -> None:
        """Register ``observer``'s event hook implementations (a metrics exporter) as ``name``."""
        self._plugins.pm.register(observer, name=name)

    def remove_observer(self, name: str) -> None:
        """Unregister the observer registered as ``name``; nothing if there is none."""
        if self._plugins.pm.has_plugin(name):
            self._plugins.pm.unregister(name=name)
