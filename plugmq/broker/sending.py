"""The put path: a producer's Message becomes a store request, stored or handed to the delay plugin.

One message (:meth:`Sender.put`) or a batch of one topic and queue (:meth:`Sender.put_batch`);
``build_request`` fills in the system properties (also for the transaction plugin's halves). On a
``sync_master`` the answer waits for a slave unless the caller waits itself, once for many sends.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import attrs

from plugmq.broker.dedup import Copy, DedupWindows, dedup_key
from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.events import Arrivals, Events
from plugmq.broker.lifecycle import Lifecycle
from plugmq.broker.ratelimit import RateLimiter
from plugmq.broker.replies import Replies
from plugmq.broker.roles import Roles
from plugmq.broker.services import Services
from plugmq.broker.topics import TopicQueues
from plugmq.broker.traffic import Traffic
from plugmq.config.topics import TopicSettingsTable
from plugmq.core.clock import Clock, SystemClock
from plugmq.core.contracts import ColumnAppending, DirectAppending, MessageStore, has_capability
from plugmq.core.errors import TopicError, ValidationError
from plugmq.core.hashing import tags_code
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    AppendStatus,
    Message,
    MessageQueue,
    SendResult,
    SendResults,
    SendStatus,
    check_body_size,
)
from plugmq.core.names import Prop, is_system_topic
from plugmq.kit import requestcodec
from plugmq.kit.requestcodec import PutPlan, encode_messages, encode_messages_native, put_plan, request_properties

__all__ = ["Sender"]


def _refuse_system_topic(topic: str) -> None:
    if is_system_topic(topic):
        raise TopicError(f"topic {topic!r} is a system topic; producers may not send to it")


def _send_result(result: AppendResult, request: AppendRequest, queue: MessageQueue,
                 replica: SendStatus = SendStatus.SEND_OK) -> SendResult:
    status = SendStatus.SEND_OK if result.status is AppendStatus.PUT_OK else SendStatus.FLUSH_DISK_TIMEOUT
    if replica is not SendStatus.SEND_OK:  # as RocketMQ's handleHA: the slave's verdict comes last
        status = replica
    return SendResult.trusted(status, result.msg_id, request.properties[Prop.UNIQ_KEY], queue, result.queue_offset)


@attrs.frozen(kw_only=True)
class Sender:
    """Stores what producers send: one message, or a batch of one topic on one queue."""

    _max_message_size: int
    _clock: Clock
    _store: MessageStore
    _topics: TopicQueues
    _roles: Roles
    _services: Services
    _ledger: DelayLedger | None
    _events: Events
    _arrivals: Arrivals
    _traffic: Traffic
    _lifecycle: Lifecycle
    _topic_settings: TopicSettingsTable
    _dedup: DedupWindows
    _limits: RateLimiter
    _replies: Replies
    # topic -> its plan for put_one (empty: its sends take the general path); replaced by an empty
    # dict whenever a topic is created, grown or deleted (see _plan)
    _plans: dict[str, PutPlan] = attrs.field(init=False, factory=dict)

    _plans_allowed: bool = attrs.field(init=False, default=False)
    # the store's direct append (DirectAppending) for put_batch, asked for once
    _direct: object | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._topics.table.subscribe(lambda _topic, _count: self._replan())
        # Without word of observers coming and going, every send takes the general path.
        object.__setattr__(self, "_plans_allowed", self._events.on_plugins_changed(self._replan))

    def _replan(self) -> None:
        """A topic was created, grown or deleted, or a plugin came or went: plans are made again."""
        object.__setattr__(self, "_plans", {})  # frozen: the one field a change replaces

    def _plan(self, topic: str) -> PutPlan:
        """``topic``'s plan for put_one, built once and kept until a topic changes; empty when its
        sends take the general path: a system topic, a priority or dedup topic, one not created yet,
        or while a plugin observes stored messages. What else may change at any time (rate limits,
        replies awaited, replication) is checked per send."""
        plans = self._plans  # taken first: a change after this replaces the dict, not this entry
        count = self._topics.table.get(topic)
        settings = self._topic_settings.settings(topic)
        plan: PutPlan = ()
        if (count and self._plans_allowed and not self._events.observing_stored and not is_system_topic(topic)
                and not settings.priority and not settings.dedup):
            clock = self._clock  # the wall clock SystemClock reads: put_one reads it itself
            store = self._store
            # the store's direct append declines, per call, whenever its append would do more than
            # store (a log listener set later, a flush wait): then put_one calls store.append
            direct = store.direct_append() if has_capability(store, DirectAppending) else None
            plan = put_plan(self._max_message_size, "127.0.0.1:0", store.append, self._topics.queues(topic),
                            self._traffic.shared_sends(topic), self._arrivals.wake,
                            now_ms=None if type(clock) is SystemClock else clock.now_ms, direct=direct,
                            watchers=self._arrivals.watchers)
        if count:  # a topic not created is not kept: sends to any names must not grow the table
            plans[topic] = plan
        return plan

    def build_request(self, message: Message, queue_id: int, *, reconsume_times: int = 0,
                      extra_properties: Mapping[str, str] | None = None, sys_flag: int = 0,
                      born_host: str = "127.0.0.1:0") -> AppendRequest:
        """Turn a producer's Message into the store's request (system properties filled in).

        The Message was validated when it was built, so the request is assembled without running
        the validators again (the store checks what it writes); tag codes come from a cache."""
        check_body_size(message.body, self._max_message_size, topic=message.topic)
        if queue_id < 0:
            raise ValidationError(f"queue id must be >= 0, got {queue_id}")
        return AppendRequest.trusted(
            message.topic, queue_id, message.body, request_properties(message, extra_properties),
            tags_code=tags_code(message.tags), born_timestamp_ms=self._clock.now_ms(), born_host=born_host,
            reconsume_times=reconsume_times, sys_flag=sys_flag,
        )

    def _replica(self, await_slave: bool, end_offset: int | None = None) -> SendStatus:
        return self._roles.await_replication(end_offset) if await_slave else SendStatus.SEND_OK

    def put(self, message: Message, queue_id: int, allow_system_topic: bool = False,
            reconsume_times: int = 0, extra_properties: Mapping[str, str] | None = None,
            await_slave: bool = True, account: str | None = None) -> SendResult:
        """Store one message on ``queue_id`` of its topic (delayed ones go to the delay plugin).

        On a ``sync_master`` the answer waits for a slave, unless ``await_slave`` is False: then the
        caller waits itself, once for many sends (``await_replication``), as ``plugmq serve`` does.
        On a priority topic the message goes to its priority's queue, whatever ``queue_id`` says; on
        a dedup topic a key already stored within the window is answered with its first copy.
        ``account``: who sends (plugmq serve's ACL account), for its rate limit. (Arguments may be
        given by position: Broker.put passes them so, which costs less than by keyword.)

        A producer's plain message on a topic whose plan allows it (see :meth:`_plan`) is stored by
        one compiled call (plugmq.kit.requestcodec.put_one); everything else, and whatever that
        call does not take, goes through :meth:`put_general`, which stores the same bytes.
        """
        if self._lifecycle.closed:  # an attribute, not check_open()'s call: read on every send
            self._lifecycle.check_open()
        roles = self._roles
        # a slave (refused by the general path) or a broker with replication: the general path
        if not allow_system_topic and not reconsume_times and roles.replication is None and roles.writable():
            plan = self._plans.get(message.topic)
            if plan is None:
                plan = self._plan(message.topic)
            # Checked per send, one attribute each: what may change at any time for every topic.
            # (requestcodec.put_one read at call time: the compiled kernel, or its twin in tests)
            if plan and not self._limits.limits_sends and not self._replies.waiting:
                sent = requestcodec.put_one(message, queue_id, None, extra_properties, plan)
                if sent is not None:
                    return sent
        return self.put_general(message, queue_id, allow_system_topic=allow_system_topic,
                                reconsume_times=reconsume_times, extra_properties=extra_properties,
                                await_slave=await_slave, account=account)

    def put_general(self, message: Message, queue_id: int, *, allow_system_topic: bool = False,
                    reconsume_times: int = 0, extra_properties: Mapping[str, str] | None = None,
                    await_slave: bool = True, account: str | None = None) -> SendResult:
        """:meth:`put` without its compiled plain path: every case, every check, step by step."""
        self._lifecycle.check_open()
        self._roles.check_writable("store messages")
        self._roles.commit.admit_send()
        if not allow_system_topic and not reconsume_times:
            sent = self._put_plain(message, queue_id, extra_properties, await_slave, account)
            if sent is not None:
                return sent
        if not allow_system_topic:
            _refuse_system_topic(message.topic)
        queue_id = self._placed(message, queue_id)
        queue = self._topics.queue(message.topic, queue_id)
        request = self.build_request(message, queue_id, reconsume_times=reconsume_times,
                                     extra_properties=extra_properties)
        settings = None if allow_system_topic else self._dedup.settings_for(message.topic)
        key = dedup_key(settings, message, request) if settings is not None else None
        if key is not None:
            first = self._dedup.claim(message.topic, key)
            if first is not None:
                return self._duplicate(message.topic, first, await_slave)
        try:
            if not allow_system_topic:
                self._limits.send(message.topic, account, 1, len(message.body))
            result, replica = self._store_one(message, request, await_slave)
        except BaseException:
            if key is not None:
                self._dedup.failed(message.topic, key)
            raise
        if key is not None:
            end = -1 if message.is_delayed else result.commit_log_offset + result.size
            self._dedup.stored(message.topic, key, Copy(result.msg_id, request.properties[Prop.UNIQ_KEY], queue_id,
                                                        result.queue_offset, end, result.store_timestamp_ms),
                               delayed=message.is_delayed)
        return _send_result(result, request, queue, replica)

    def _put_plain(self, message: Message, queue_id: int, extra: Mapping[str, str] | None, await_slave: bool,
                   account: str | None) -> SendResult | None:
        """``put``'s common case in fewer steps - a producer's message, not delayed, no priority, on
        a topic that neither deduplicates nor orders by priority - encoded by the batch encoder;
        None when it is not that case (nothing done yet: ``put``'s general path decides)."""
        topic = message.topic
        if message.priority is not None:
            return None
        settings = self._topic_settings.settings(topic)  # the table DedupWindows.settings_for reads
        if settings.priority or settings.dedup:
            return None
        _refuse_system_topic(topic)
        queue = self._topics.queue(topic, queue_id)
        encoded = encode_messages_native([message], queue_id, self._clock.now_ms(),
                                         None if extra is None else [extra], self._max_message_size)
        if encoded is None:  # delayed, too large, not a plain Message or dict, or no compiled encoder
            return None
        request = encoded[0][0]
        self._limits.send(topic, account, 1, len(message.body))
        result, replica = self._store_one(message, request, await_slave)
        return _send_result(result, request, queue, replica)

    def _store_one(self, message: Message, request: AppendRequest, await_slave: bool
                   ) -> tuple[AppendResult, SendStatus]:
        if message.is_delayed:
            result = self._schedule(message, request)
            self._traffic.sent(message.topic, "delay", 1, len(message.body))
            return result, self._replica(await_slave)
        started = time.perf_counter()
        result = self._store.append(request)
        kind = "fifo" if Prop.SHARDING_KEY in request.properties else "normal"
        self._traffic.sent(message.topic, kind, 1, len(message.body), time.perf_counter() - started)
        replica = self._replica(await_slave, result.commit_log_offset + result.size)
        self._events.stored(result, request)
        self._arrivals.wake()
        if self._replies.waiting:
            self._replies.stored(result, request, self._store.read)
        return result, replica

    def _placed(self, message: Message, queue_id: int) -> int:
        """The queue a message goes to: on a priority topic its priority's (RIP-80: priority p on
        queue min(p, queues - 1), no priority on queue 0), else ``queue_id``."""
        if not self._topic_settings.settings(message.topic).priority:
            if message.priority is not None:
                raise ValidationError(f"message to {message.topic!r} has a priority but the topic is not a priority "
                                      f"topic; set [topics.{message.topic}] priority = true in the broker's config")
            return queue_id
        count = len(self._topics.queues(message.topic))
        return min(message.priority or 0, count - 1)

    def _duplicate(self, topic: str, first: Copy, await_slave: bool) -> SendResult:
        """The answer to a send whose key is in the window: its first copy's, once that is safe."""
        self._traffic.sent(topic, "duplicate", 1, 0)  # answered, not stored: counted apart from what was
        replica = self._replica(await_slave, None if first.end_offset < 0 else first.end_offset)
        status = SendStatus.SEND_OK if replica is SendStatus.SEND_OK else replica
        return SendResult(status=status, msg_id=first.msg_id, unique_id=first.unique_id,
                          queue=self._topics.queue(topic, first.queue_id), queue_offset=first.queue_offset)

    def put_batch(self, messages: Sequence[Message], queue_id: int, *,
                  extra_properties: Sequence[Mapping[str, str] | None] | None = None,
                  await_slave: bool = True, account: str | None = None) -> Sequence[SendResult]:
        """Store several messages of one topic on one queue in one store batch.

        ``extra_properties``: per message, system properties to add (as ``put``'s argument);
        ``await_slave`` and ``account``: as for ``put``. On a priority or dedup topic the messages
        are sent one by one (each to its priority's queue; a duplicate answered by its first copy).
        The batch is checked and encoded in one pass (plugmq.kit.requestcodec, one born time);
        its results are built when read (SendResults).
        """
        self._lifecycle.check_open()
        self._roles.check_writable("store messages")
        self._roles.commit.admit_send()
        fused = self._put_batch_fused(messages, queue_id, extra_properties, await_slave, account)
        if fused is not None:
            return fused
        requests, total = encode_messages(messages, queue_id, self._clock.now_ms(), extra_properties,
                                          self._max_message_size)
        topic = messages[0].topic
        _refuse_system_topic(topic)
        if self._topic_settings.settings(topic).priority or self._dedup.settings_for(topic) is not None:
            extras = extra_properties or [None] * len(messages)
            return [self.put(m, queue_id, extra_properties=x, await_slave=await_slave, account=account)
                    for m, x in zip(messages, extras, strict=True)]
        if any(m.priority is not None for m in messages):
            self._placed(next(m for m in messages if m.priority is not None), queue_id)  # raises: not a priority topic
        queue = self._topics.queue(topic, queue_id)
        self._limits.send(topic, account, len(messages), total)
        started = time.perf_counter()
        store = self._store
        if has_capability(store, ColumnAppending):  # no AppendResult built until one is read
            results: Sequence[AppendResult] = store.append_columns(requests)
        else:
            results = store.append_batch(requests)
        self._traffic.sent(topic, "normal", len(messages), total, time.perf_counter() - started)
        replica = self._replica(await_slave, results[-1].commit_log_offset + results[-1].size)
        self._events.stored_all(results, requests)
        self._arrivals.wake()
        return SendResults(results, requests, queue, replica)

    def _put_batch_fused(self, messages: Sequence[Message], queue_id: int,
                         extras: Sequence[Mapping[str, str] | None] | None, await_slave: bool,
                         account: str | None) -> SendResults | None:
        """put_batch's common case in one compiled call (plugmq.kit.requestcodec.put_batch): a
        plain batch of a topic that neither deduplicates nor orders by priority, nobody observing
        stored messages, encoded and stored with no AppendRequest where the store has a direct
        append (DirectAppending; it declines while its append would also publish, and then its
        append_columns stores). The queue and the rate limit are checked between encoding and
        storing. None when it is not that case: nothing done, the general path decides."""
        store = self._store
        if not messages or not self._plans_allowed or self._events.observing_stored:
            return None
        if not has_capability(store, ColumnAppending):
            return None
        append_columns = store.append_columns
        topic = messages[0].topic
        settings = self._topic_settings.settings(topic) if isinstance(topic, str) else None
        if settings is None or settings.priority or settings.dedup or is_system_topic(topic):
            return None
        direct = self._direct
        if direct is None and has_capability(store, DirectAppending):
            direct = store.direct_append()
            object.__setattr__(self, "_direct", direct)  # frozen: asked once (it declines per call)
        checked: list[tuple[MessageQueue, float]] = []

        def admit(count: int, total: int) -> None:
            queue = self._topics.queue(topic, queue_id)
            self._limits.send(topic, account, count, total)
            checked.append((queue, time.perf_counter()))

        stored = requestcodec.put_batch(messages, queue_id, self._clock.now_ms(), extras, self._max_message_size,
                                        direct, append_columns, admit)
        if stored is None:
            return None
        results, unique_ids, total = stored
        queue, started = checked[0]
        self._traffic.sent(topic, "normal", len(messages), total, time.perf_counter() - started)
        replica = self._replica(await_slave, results.end_offset)  # read from the columns: no result built
        self._arrivals.wake()
        return SendResults.of_unique_ids(results, unique_ids, queue, replica)

    def _schedule(self, message: Message, request: AppendRequest) -> AppendResult:
        """Hand a delayed message to the delay plugin (through the ledger, with replication)."""
        delay = self._services.require_delay(message.topic)
        level = message.delay_level
        if level is not None:
            levels = self._services.delay_levels_ms()
            deliver_at = self._clock.now_ms() + levels[min(level, len(levels)) - 1]
        else:
            assert message.deliver_at_ms is not None
            deliver_at = message.deliver_at_ms
        extra = {Prop.DELAY_LEVEL: str(level)} if level is not None else {Prop.DELIVER_AT_MS: str(deliver_at)}
        request = attrs.evolve(request, properties={**request.properties, **extra})
        if self._ledger is not None:
            return self._ledger.accept(
                request, deliver_at, level, lambda: delay.schedule(request, deliver_at_ms=deliver_at, delay_level=level))
        return delay.schedule(request, deliver_at_ms=deliver_at, delay_level=level)
