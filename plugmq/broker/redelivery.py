"""Redelivery: a message a consumer gave up on goes to ``%RETRY%<group>`` later, or is dead-lettered.

The group's :class:`RedeliveryPolicy` decides how often and after what back-off; a copy carries
its lineage (the original topic and message id, the attempt) so every later copy names where it
came from.
"""

from __future__ import annotations

import attrs

from plugmq.broker.events import Events
from plugmq.broker.sending import Sender
from plugmq.broker.services import Services
from plugmq.broker.topics import TopicTable
from plugmq.config.policy import GroupPolicies, GroupPolicy, RedeliveryPolicy
from plugmq.core.clock import Clock
from plugmq.core.logs import get_logger
from plugmq.core.message import Message, SendResult, StoredMessage
from plugmq.core.names import Prop, retry_topic

__all__ = ["Redelivery", "lineage"]

log = get_logger(__name__)


def lineage(message: StoredMessage, reconsume_times: int) -> dict[str, str]:
    """The system properties a retry or dead-letter copy of ``message`` carries."""
    props = {
        Prop.RETRY_TOPIC: message.properties.get(Prop.RETRY_TOPIC, message.topic),
        Prop.ORIGIN_MESSAGE_ID: message.properties.get(Prop.ORIGIN_MESSAGE_ID, message.msg_id),
        Prop.RECONSUME_TIME: str(reconsume_times),
    }
    if message.unique_id:
        props[Prop.UNIQ_KEY] = message.unique_id
    trace_context = message.properties.get(Prop.TRACE_CONTEXT)
    if trace_context:
        props[Prop.TRACE_CONTEXT] = trace_context
    return props


@attrs.frozen
class Redelivery:
    """Sends messages back for a later attempt, or to the dead-letter topic."""

    _policies: GroupPolicies
    _topics: TopicTable
    _sender: Sender
    _services: Services
    _clock: Clock
    _events: Events

    def group_policy(self, group: str) -> GroupPolicy:
        """The group's policy from ``[groups]`` (redelivery, FIFO), or the configured defaults."""
        return self._policies.policy(group)

    def send_back(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """A consumer gave up on ``message`` for now: retry it later, or dead-letter it.

        ``policy`` (default: the group's) decides: the delivery that failed was attempt
        ``reconsume_times + 1``; if that was the last, the message goes to the dead-letter topic,
        else a copy goes to ``%RETRY%<group>`` after the policy's back-off for that attempt, with
        ``reconsume_times + 1``. With the default back-off these are RocketMQ's delay levels
        ``3 + reconsume_times`` (10 s, 30 s, 1 min, ... 2 h), which every delay plugin can express.
        """
        policy = policy if policy is not None else self.group_policy(group).redelivery
        failed_attempt = message.reconsume_times + 1
        if policy.exhausted(failed_attempt):
            return self.dead_letter(message, group, policy)
        topic = retry_topic(group)
        self._topics.ensure(topic, 1)
        delay_ms = policy.backoff_ms(failed_attempt)
        level = self._delay_level_of(delay_ms)
        copy = Message(topic, message.body, tags=message.tags, keys=message.keys,
                       properties=message.user_properties, delay_level=level,
                       deliver_at_ms=None if level is not None else self._clock.now_ms() + delay_ms)
        result = self._sender.put(copy, 0, allow_system_topic=True, reconsume_times=failed_attempt,
                                  extra_properties=lineage(message, failed_attempt))
        self._events.retried(group, message, failed_attempt)
        return result

    def _delay_level_of(self, delay_ms: int) -> int | None:
        """The delay level (1-based) lasting exactly ``delay_ms`` with this broker's delay plugin."""
        levels = self._services.delay_levels_ms()
        try:
            return levels.index(delay_ms) + 1
        except ValueError:
            return None

    def dead_letter(self, message: StoredMessage, group: str, policy: RedeliveryPolicy | None = None) -> SendResult:
        """Move ``message`` to the group's dead-letter topic (``%DLQ%<group>`` unless ``policy``
        names another); stored there as a normal message, never dropped."""
        policy = policy if policy is not None else self.group_policy(group).redelivery
        topic = policy.dead_letter_topic_for(group)
        self._topics.ensure(topic, 1)
        copy = Message(topic, message.body, tags=message.tags, keys=message.keys, properties=message.user_properties)
        result = self._sender.put(copy, 0, allow_system_topic=True, reconsume_times=message.reconsume_times,
                                  extra_properties=lineage(message, message.reconsume_times))
        log.warning("message dead-lettered", group=group, topic=message.topic, msg_id=message.msg_id,
                    reconsume_times=message.reconsume_times, dead_letter_topic=topic)
        self._events.dead_lettered(group, message)
        return result
