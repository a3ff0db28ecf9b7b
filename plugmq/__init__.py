"""plugmq: a message-queue broker framework (RocketMQ / Metaq / QMQ lineage) built from plugins.

This package is what an application needs: assemble a :class:`Broker` from plugin names or a
config, send :class:`Message` values with a producer, consume them with a push, pull or simple
consumer, settle transactions, configure redelivery. Plugin authors import from ``plugmq.core``
(hook specs, contracts, value types of the store and delay families).
"""

from plugmq.core.api import allocate, compile_filter
from plugmq.core.broker import Broker
from plugmq.core.clock import ManualClock, SystemClock
from plugmq.core.consumer import PullConsumer, PushConsumer
from plugmq.core.contracts import TransactionDecision
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
    ReceiptHandleError,
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
from plugmq.core.modes import ConsumeFrom, ConsumeStatus, MessageModel, OrderlyStatus
from plugmq.core.policy import GroupPolicy, RedeliveryPolicy
from plugmq.core.pop import ReceivedMessage
from plugmq.core.producer import Producer, QueueSelector
from plugmq.core.simple import FilterExpression, SimpleConsumer
from plugmq.core.transactions import LocalTransaction, TransactionProducer, TransactionSendResult

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "Broker",
    "ClientError",
    "ConfigError",
    "ConsumeFrom",
    "ConsumeStatus",
    "CorruptRecordError",
    "DelayError",
    "DelayUnsupportedError",
    "FilterError",
    "FilterEvaluationError",
    "FilterExpression",
    "FilterSyntaxError",
    "GroupPolicy",
    "InvalidNameError",
    "LocalTransaction",
    "ManualClock",
    "Message",
    "MessageModel",
    "MessageQueue",
    "MessageTooLargeError",
    "OrderlyStatus",
    "PluginCardinalityError",
    "PluginError",
    "PlugmqError",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueSelector",
    "ReceiptHandleError",
    "ReceivedMessage",
    "RedeliveryPolicy",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "StoreError",
    "StoreFullError",
    "StoredMessage",
    "SystemClock",
    "TopicError",
    "TransactionDecision",
    "TransactionError",
    "TransactionProducer",
    "TransactionSendResult",
    "ValidationError",
    "allocate",
    "compile_filter",
]
