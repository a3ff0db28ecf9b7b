"""The write-back: due delayed messages and committed transactional ones onto their real topics.

The delay and transaction services hand their messages back here (``DelayContext.deliver``,
``deliver_batch``, ``was_delivered``; ``TransactionContext.deliver``), and observers their own
records on a system topic (:class:`~plugmq.core.contracts.SystemTopicWriter`: the trace plugin). With replication, a
delayed message is also an intent in the log (plugmq.broker.delayledger): one whose intent is no
longer pending and which is on its topic already (a copy the plugin kept from an earlier
mastership) is answered with that copy instead of being written twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs

from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.events import Arrivals, Events
from plugmq.broker.roles import Roles
from plugmq.broker.topics import TopicTable
from plugmq.broker.traffic import Traffic
from plugmq.core.clock import Clock
from plugmq.core.contracts import ColumnAppending, MessageStore, has_capability
from plugmq.core.errors import TopicError
from plugmq.core.logs import get_logger
from plugmq.core.message import AppendRequest, AppendResult, AppendStatus, StoredMessage, new_unique_id
from plugmq.core.names import Prop, is_system_topic

__all__ = ["DeliveredCopies", "WriteBack"]

log = get_logger(__name__)


@attrs.frozen
class DeliveredCopies:
    """Finds the message of a request on its real topic: same unique id, same attempt."""

    _store: MessageStore

    def find(self, request: AppendRequest) -> StoredMessage | None:
        """The message of ``request`` on its real topic, if stored."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        if not unique:
            return None
        return next((m for m in self._store.query_by_key(request.topic, unique, max_results=64)
                     if m.unique_id == unique and m.reconsume_times == request.reconsume_times), None)

    def was_delivered(self, request: AppendRequest) -> bool:
        """Whether the message of ``request`` is on its real topic (``WasDelivered``)."""
        return self.find(request) is not None


@attrs.frozen
class WriteBack:
    """Appends what the delay and transaction services deliver, with its events and wake-up; and
    what observers record on system topics, without either."""

    _name: str
    _clock: Clock
    _store: MessageStore
    _topics: TopicTable
    _roles: Roles
    _events: Events
    _arrivals: Arrivals
    _traffic: Traffic
    _ledger: DelayLedger | None
    _copies: DeliveredCopies

    def deliver(self, request: AppendRequest) -> AppendResult:
        """A normal message on its topic (the transaction service's write-back)."""
        self._roles.check_writable("deliver delayed or transactional messages")
        self._topics.ensure(request.topic, request.queue_id + 1)
        started = time.perf_counter()
        result = self._store.append(request)
        self._stored(started, [result], [request])
        return result

    def deliver_delayed(self, request: AppendRequest) -> AppendResult:
        """The delay service's write-back: a message delivered already is not written twice."""
        ledger = self._ledger
        if ledger is not None and not ledger.take_pending(request):
            copy = self._copies.find(request)
            if copy is not None:
                return self._delivered_already(copy)
        return self.deliver(request)

    def deliver_batch(self, requests: Sequence[AppendRequest]) -> Sequence[AppendResult]:
        """Batched write-back of the delay service: one store batch (per run), consumers woken
        once; the results as the store's columns where it answers so (built only when read). As
        in :meth:`deliver_delayed`, a message delivered already - stored before, or earlier in
        this very batch (a copy the plugin kept beside the one the ledger handed it) - is
        answered with that copy instead of being written again."""
        if not requests:
            return []
        self._roles.check_writable("deliver delayed messages")
        if self._ledger is None:
            return self._append_all(requests)
        return self._deliver_pending(requests, self._ledger)

    def _deliver_pending(self, requests: Sequence[AppendRequest], ledger: DelayLedger) -> Sequence[AppendResult]:
        results: list[AppendResult | None] = [None] * len(requests)
        run: list[int] = []  # requests to write, in order
        written: dict[tuple[str, int], int] = {}  # (unique id, attempt) -> its request in this batch
        repeats: dict[int, int] = {}  # request -> the request of this batch it repeats

        def flush() -> None:
            for i, result in zip(run, self._append_all([requests[i] for i in run]), strict=True):
                results[i] = result
            run.clear()

        for i, request in enumerate(requests):
            unique = request.properties.get(Prop.UNIQ_KEY)
            key = (unique or "", request.reconsume_times)
            if not ledger.take_pending(request):
                if unique and key in written:
                    repeats[i] = written[key]
                    continue
                flush()  # what this batch wrote so far is on its topic before the check
                copy = self._copies.find(request)
                if copy is not None:
                    results[i] = self._delivered_already(copy)
                    continue
            if unique:
                written[key] = i
            run.append(i)
        flush()
        for i, original in repeats.items():
            results[i] = results[original]
        return [result for result in results if result is not None]

    def append_system_records(self, topic: str, records: Sequence[tuple[bytes, Sequence[str]]]) -> int:
        """:class:`~plugmq.core.contracts.SystemTopicWriter`: an observer's records on system topic
        ``topic``, queue 0, in one store batch, without events. Open to observers until their
        ``plugmq_broker_stopping`` returned (the store closes after it)."""
        self._roles.check_writable("store an observer's records")
        if not is_system_topic(topic):
            raise TopicError(f"topic {topic!r} is not a system topic; observers write only system topics")
        self._topics.ensure(topic, 1)  # also for no records: an observer makes its topic known when it starts
        if not records:
            return 0
        now = self._clock.now_ms()
        requests = []
        for body, keys in records:
            props = {Prop.UNIQ_KEY: new_unique_id()}
            if keys:
                props[Prop.KEYS] = " ".join(keys)
            requests.append(AppendRequest.trusted(topic, 0, body, props, born_timestamp_ms=now))
        started = time.perf_counter()
        self._store.append_batch(requests)
        self._traffic.appended(time.perf_counter() - started)
        return len(requests)

    def _delivered_already(self, copy: StoredMessage) -> AppendResult:
        log.info("delayed message delivered already (by an earlier master); not written again",
                 broker=self._name, topic=copy.topic, unique_id=copy.unique_id)
        return AppendResult(AppendStatus.PUT_OK, copy.msg_id, copy.queue_offset, copy.commit_log_offset, copy.size,
                            copy.store_timestamp_ms)

    def _append_all(self, requests: Sequence[AppendRequest]) -> Sequence[AppendResult]:
        """``requests`` appended in one store batch: topics ensured, stored events, wake-up. A
        ColumnAppending store answers with columns: a delay burst's write-back reads no result,
        so none is built."""
        if not requests:
            return []
        needed: dict[str, int] = {}
        for request in requests:
            needed[request.topic] = max(needed.get(request.topic, 0), request.queue_id + 1)
        for topic, count in needed.items():
            self._topics.ensure(topic, count)
        store = self._store
        started = time.perf_counter()
        results: Sequence[AppendResult] = (store.append_columns(requests) if has_capability(store, ColumnAppending)
                                           else store.append_batch(requests))
        self._stored(started, results, requests)
        return results

    def _stored(self, started: float, results: Sequence[AppendResult], requests: Sequence[AppendRequest]) -> None:
        """An append that began at ``started`` (perf counter) is done: its latency, events, wake-up."""
        self._traffic.appended(time.perf_counter() - started)
        self._events.stored_all(results, requests)
        self._arrivals.wake()
