"""Lifecycle: a broker open or closed, the consumers it shuts down, and the order it closes in.

Closing runs every step even when one fails (say, a full disk while the offsets are persisted):
the failure is logged and kept, the store is always closed last, and the first failure is raised
at the end. A start that fails closes the services built so far the same way, then the store,
and raises its own error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from plugmq.client.ports import Stoppable
from plugmq.core.contracts import MessageStore
from plugmq.core.errors import ClientError
from plugmq.core.logs import get_logger

__all__ = ["SERVICE_ORDER", "STATE_ORDER", "Closing", "Lifecycle"]

log = get_logger(__name__)

#: What a closing broker persists once its consumers are shut down (not on a failed start).
STATE_ORDER = ("broker_stopping hooks", "consumer offsets", "groups")
#: The order services close in, the store after them. Replication first: no slave waits on, or
#: writes into, a closing store. The cluster session before the rest: routes stop naming this
#: broker before its services stop.
SERVICE_ORDER = ("replication", "retention", "cluster", "pop", "transactions", "delay")

Action = Callable[[], object]


class Closing:
    """Runs the steps of closing: a failure is logged and kept, and closing goes on."""

    def __init__(self, broker_name: str) -> None:
        self._name = broker_name
        self.failures: list[Exception] = []

    def step(self, what: str, action: Action) -> None:
        try:
            action()
        except Exception as exc:  # reported; raise_first decides what the caller sees
            log.exception("a step of closing the broker failed; closing goes on", broker=self._name, step=what)
            self.failures.append(exc)

    def raise_first(self) -> None:
        if self.failures:
            raise self.failures[0]


class Lifecycle:
    """Whether the broker is open, what to shut down when it closes, and in which order. Thread-safe."""

    def __init__(self, broker_name: str, store: MessageStore) -> None:
        self._name = broker_name
        self._store = store
        self._lock = threading.Lock()
        self.closed = False  # set once, under the lock; read without it (the send path reads it per send)
        self._consumers: list[Stoppable] = []
        self._steps: dict[str, Action] = {}

    def check_open(self) -> None:
        """ClientError once the broker is closed."""
        if self.closed:
            raise ClientError(f"broker {self._name!r} is closed")

    def on_close(self, what: str, action: Action) -> None:
        """Run ``action`` as step ``what`` (one of STATE_ORDER or SERVICE_ORDER) when closing."""
        if what not in STATE_ORDER and what not in SERVICE_ORDER:
            raise ValueError(f"{what!r} is no step of closing a broker")
        self._steps[what] = action

    def register_consumer(self, consumer: Stoppable) -> None:
        """Shut ``consumer`` down when the broker closes."""
        with self._lock:
            self._consumers.append(consumer)

    def unregister_consumer(self, consumer: Stoppable) -> None:
        with self._lock:
            if consumer in self._consumers:
                self._consumers.remove(consumer)

    def _run(self, order: tuple[str, ...], closing: Closing) -> None:
        for what in order:
            action = self._steps.get(what)
            if action is not None:
                closing.step(what, action)

    def abort(self) -> None:
        """A start failed: close the services built so far, then the store (failures are logged;
        the caller raises the start's own error)."""
        self._run(SERVICE_ORDER, Closing(self._name))
        self._store.close()

    def close(self) -> None:
        """Shut consumers down, persist state, close services and the store. Idempotent; the first
        failure of a step is raised once every step ran."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            consumers = list(self._consumers)
        closing = Closing(self._name)
        self._run(STATE_ORDER[:1], closing)
        for consumer in consumers:
            closing.step("a consumer's shutdown", consumer.shutdown)
        self._run(STATE_ORDER[1:], closing)
        self._run(SERVICE_ORDER, closing)
        self._store.close()
        closing.raise_first()
        log.info("broker closed", broker=self._name)
