"""The one error hierarchy of plugmq.

Every error plugmq raises on purpose derives from :class:`PlugmqError`, so a caller can catch
everything the broker reports with one ``except``. Messages say what was wrong and how to fix it.

::

    PlugmqError
     +-- ConfigError                 a broker config (file or mapping) is invalid
     +-- PluginError                 a plugin cannot be loaded, is unknown, or breaks a rule
     |    +-- PluginCardinalityError     too many / too few plugins of one family
     +-- ValidationError             a value crossing the API boundary is invalid (nothing was written)
     |    +-- InvalidNameError           topic or group name breaks the RocketMQ name rule
     |    +-- MessageTooLargeError       body or batch above the configured limit
     +-- StoreError                  the message store failed or refused a write
     |    +-- StoreFullError             disk use above the critical watermark; writes refused
     |    +-- CorruptRecordError         a stored record failed its magic / size / CRC check
     |    +-- DescriptorLimitError       the process's open-file limit is reached (names it and the fix)
     +-- TopicError                  unknown topic, or a system topic used by a producer
     +-- FilterError
     |    +-- FilterSyntaxError          the expression does not compile (position + expectation)
     |    +-- FilterEvaluationError      a compiled expression failed on one message's properties
     +-- AllocationError             an allocation strategy rejected its input
     +-- DelayError                  a delayed send cannot be honoured by the configured strategy
     |    +-- DelayUnsupportedError      no delay plugin, or the strategy cannot express the delay
     +-- TransactionError            a transactional send or decision is invalid
     +-- ClientError                 a producer / consumer was used wrongly (closed, not started, ...)
     |    +-- ReceiptHandleError         a receipt handle is malformed, stale, or its message is done
     +-- ClusterError                the cluster's name service cannot be reached or refused a registration
     +-- ReplicationError            master / slave replication refused or failed (peer, format, offsets)
          +-- ReadOnlyBrokerError        a write reached a slave; only its master takes writes
          +-- FencedError                a master that cannot be sure it still leads refused to ack or serve
          +-- NotEnoughReplicasError     a sync_master's in-sync set is below min_in_sync_replicas: not stored
"""

from __future__ import annotations

__all__ = [
    "AllocationError",
    "ClientError",
    "ClusterError",
    "ConfigError",
    "CorruptRecordError",
    "DelayError",
    "DelayUnsupportedError",
    "DescriptorLimitError",
    "FencedError",
    "FilterError",
    "FilterEvaluationError",
    "FilterSyntaxError",
    "InvalidNameError",
    "MessageTooLargeError",
    "NotEnoughReplicasError",
    "PluginCardinalityError",
    "PluginError",
    "PlugmqError",
    "RateLimitedError",
    "ReadOnlyBrokerError",
    "ReceiptHandleError",
    "ReplicationError",
    "RequestTimeoutError",
    "StoreError",
    "StoreFullError",
    "TopicError",
    "TransactionError",
    "ValidationError",
]


class PlugmqError(Exception):
    """Root of every error plugmq raises on purpose."""


class ConfigError(PlugmqError):
    """A broker configuration is invalid; the message names the key path and the fix.

    One error may report several problems of one file (``problems``, one line each; the message
    is those lines).
    """

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


class PluginError(PlugmqError):
    """A plugin is unknown, failed to load, or implements something the core does not know."""


class PluginCardinalityError(PluginError):
    """A plugin family has too many (or, for storage, no) plugins in one broker."""


class ValidationError(PlugmqError, ValueError):
    """A value crossing the public API is invalid. Nothing was written."""


class InvalidNameError(ValidationError):
    """A topic or group name breaks the rule ``[%|a-zA-Z0-9_-]{1,127}``."""


class MessageTooLargeError(ValidationError):
    """A message body (or a batch) is larger than the broker allows."""


class StoreError(PlugmqError):
    """The message store failed, or refused a write."""


class StoreFullError(StoreError):
    """Disk use is above the critical watermark; the store refuses writes until space is freed."""


class CorruptRecordError(StoreError):
    """A stored record failed its magic, size or CRC check."""


class DescriptorLimitError(StoreError):
    """A file could not be opened: the process's open-file limit (RLIMIT_NOFILE) is reached.

    The message names the limit, how many descriptors are open and how to raise it; nothing
    stored was lost, and the operation works again once descriptors are free.
    """


class TopicError(PlugmqError):
    """A topic does not exist (and auto-creation is off) or may not be used this way."""


class FilterError(PlugmqError):
    """Base of the filter errors."""


class FilterSyntaxError(FilterError):
    """A filter expression does not compile.

    ``position`` is the 0-based character offset of the offending token (or None when the
    error is about the expression as a whole); ``expected`` describes what would have fit.
    """

    def __init__(self, message: str, *, expression: str = "", position: int | None = None,
                 expected: str | None = None) -> None:
        super().__init__(message)
        self.expression = expression
        self.position = position
        self.expected = expected


class FilterEvaluationError(FilterError):
    """A compiled filter failed on one message (e.g. a property that is not a number).

    ``Filter.matches`` treats it as "no match"; ``Filter.evaluate`` raises it.
    """


class AllocationError(PlugmqError, ValueError):
    """An allocation strategy rejected its input (the message matches RocketMQ's)."""


class DelayError(PlugmqError):
    """Base of the delay errors."""


class DelayUnsupportedError(DelayError):
    """The broker cannot honour this delay: no delay plugin, or the strategy cannot express it."""


class TransactionError(PlugmqError):
    """A transactional send or end-transaction request is invalid."""


class ClientError(PlugmqError):
    """A producer or consumer was used wrongly (closed, not started, bad listener result...)."""


class ReceiptHandleError(ClientError):
    """A receipt handle names no message in flight for the group: malformed, issued by another
    broker, superseded by a newer delivery or invisible-time change, or its message was acked or
    dead-lettered already. The message says which."""


class RateLimitedError(ClientError):
    """A send or receive over a configured rate limit (a topic's, a group's or an account's).
    ``retry_after_ms`` says when the same request would pass."""

    def __init__(self, message: str, *, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class RequestTimeoutError(ClientError):
    """A request (``Producer.request``) got no reply within its timeout."""


class ClusterError(PlugmqError):
    """The cluster's name service (e.g. ZooKeeper) cannot be reached, or refused a registration."""


class ReplicationError(PlugmqError):
    """Master / slave replication refused or failed: an unreachable or incompatible peer (store
    format, broker name), offsets that do not line up, a role without a replication plugin."""


class ReadOnlyBrokerError(ReplicationError):
    """A send (or anything that writes the store) reached a slave broker; send to its master."""


class FencedError(ReplicationError):
    """A master could not be sure it is still the master of its name (its name-service session is
    suspended or its lease lapsed, or a newer master was elected): it took no write and served no
    read. The message says which; clients retry, and reach the current master."""


class NotEnoughReplicasError(ReplicationError):
    """A ``sync_master`` refused a send before storing it: its in-sync set holds fewer brokers than
    ``min_in_sync_replicas`` (RocketMQ 5's IN_SYNC_REPLICAS_NOT_ENOUGH). Nothing was stored, so
    a retry stores it once."""
