"""plugmq: a message-queue broker framework (RocketMQ / Metaq / QMQ lineage) built from plugins.

This package is what an application needs: assemble a :class:`Broker` from plugin names or a
config, send :class:`Message` values with a producer, consume them with a push, pull or simple
consumer, settle transactions, configure redelivery. Plugin authors import from ``plugmq.core``
(hook specs, contracts, value types of the store and delay families).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugmq.broker.api import allocate, compile_filter
    from plugmq.broker.broker import Broker
    from plugmq.client.consumer import PullConsumer, PushConsumer
    from plugmq.client.producer import Producer, QueueSelector
    from plugmq.client.simple import FilterExpression, SimpleConsumer
    from plugmq.client.transactions import LocalTransaction, TransactionProducer, TransactionSendResult
    from plugmq.client.values import ReceivedMessage
    from plugmq.config.policy import GroupPolicy, RedeliveryPolicy
    from plugmq.core.clock import ManualClock, SystemClock
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


# The public names load on first use (PEP 562): ``import plugmq.cli`` or ``import plugmq.core`` pays for
# what it imports, not for this whole API (``plugmq serve`` starts faster that way).
_MODULES = {
    "plugmq.broker.api": "allocate compile_filter",
    "plugmq.broker.broker": "Broker",
    "plugmq.core.clock": "ManualClock SystemClock",
    "plugmq.client.consumer": "PullConsumer PushConsumer",
    "plugmq.core.contracts": "TransactionDecision",
    "plugmq.core.errors": "AllocationError ClientError ConfigError CorruptRecordError DelayError DelayUnsupportedError "
                          "FilterError FilterEvaluationError FilterSyntaxError InvalidNameError MessageTooLargeError "
                          "PluginCardinalityError PluginError PlugmqError ReceiptHandleError StoreError StoreFullError "
                          "TopicError TransactionError ValidationError",
    "plugmq.core.message": "Message MessageQueue PullResult PullStatus SendResult SendStatus StoredMessage",
    "plugmq.core.modes": "ConsumeFrom ConsumeStatus MessageModel OrderlyStatus",
    "plugmq.config.policy": "GroupPolicy RedeliveryPolicy",
    "plugmq.client.values": "ReceivedMessage",
    "plugmq.client.producer": "Producer QueueSelector",
    "plugmq.client.simple": "FilterExpression SimpleConsumer",
    "plugmq.client.transactions": "LocalTransaction TransactionProducer TransactionSendResult",
}
_SOURCES = {name: module for module, names in _MODULES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        if name == "core":  # ``import plugmq; plugmq.core.X`` worked when this package imported everything
            return importlib.import_module("plugmq.core")
        raise AttributeError(f"module 'plugmq' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_SOURCES})
