"""plugmq: a message-queue broker framework (RocketMQ / Metaq / QMQ lineage) built from plugins.

The public API is small on purpose: assemble a :class:`Broker` from plugin names or a config,
send :class:`Message` values, pull or consume them; everything else lives in ``plugmq.core``.
"""

from plugmq.core.api import allocate, compile_filter
from plugmq.core.broker import Broker
from plugmq.core.clock import ManualClock, SystemClock
from plugmq.core.errors import (
    AllocationError,
    ClientError,
    ConfigError,
    CorruptRecordError,
    DelayError,
    DelayUnsupportedError,
    FilterError,
    FilterEvaluationError,
    FilterSyntaxError,
    InvalidNameError,
    MessageTooLargeError,
    PluginCardinalityError,
    PluginError,
    PlugmqError,
    StoreError,
    StoreFullError,
    TopicError,
    TransactionError,
    ValidationError,
)
from plugmq.core.message import (
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
    StoredMessage,
)

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "Broker",
    "ClientError",
    "ConfigError",
    "CorruptRecordError",
    "DelayError",
    "DelayUnsupportedError",
    "FilterError",
    "FilterEvaluationError",
    "FilterSyntaxError",
    "InvalidNameError",
    "ManualClock",
    "Message",
    "MessageQueue",
    "MessageTooLargeError",
    "PluginCardinalityError",
    "PluginError",
    "PlugmqError",
    "PullResult",
    "PullStatus",
    "SendResult",
    "SendStatus",
    "StoreError",
    "StoreFullError",
    "StoredMessage",
    "SystemClock",
    "TopicError",
    "TransactionError",
    "ValidationError",
    "allocate",
    "compile_filter",
]
