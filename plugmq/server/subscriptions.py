"""The subscriptions receives name, compiled once and kept within a byte budget.

A compiled SQL92 filter holds about 250-330 bytes per character of its expression (its syntax
tree and the closures compiled from it; more while compiling), so a cache bounded by entries alone
lets a client that sends thousands of long expressions hold gigabytes. Here an expression longer
than :data:`MAX_EXPRESSION_CHARS` is refused (ILLEGAL_FILTER_EXPRESSION), and the cache evicts the
least recently used subscriptions once their estimated size passes ``max_bytes``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from plugmq.broker.ports import Serving
from plugmq.core.contracts import Filter
from plugmq.core.logs import get_logger
from plugmq.server.protocol import Code, FilterType, definition_pb2
from plugmq.server.status import RpcFailure

__all__ = ["MAX_EXPRESSION_CHARS", "Subscriptions", "estimated_bytes"]

log = get_logger(__name__)

MAX_EXPRESSION_CHARS = 16 * 1024
_BYTES_PER_CHAR = 400  # measured 250-330 for SQL92 (tracemalloc), rounded up
_BASE_BYTES = 4096
_FILTER_TYPES = {FilterType.TAG: "TAG", FilterType.SQL: "SQL92"}
_PLUGINS = {"TAG": "filter_tag", "SQL92": "filter_sql"}


def estimated_bytes(text: str) -> int:
    """What a compiled subscription of ``text`` is taken to hold."""
    return _BASE_BYTES + _BYTES_PER_CHAR * len(text)


class Subscriptions:
    """Compiled subscriptions of one server, least recently used out first past ``max_bytes``."""

    def __init__(self, broker: Serving, broker_name: str, max_bytes: int) -> None:
        self._broker = broker
        self._broker_name = broker_name
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._compiled: OrderedDict[tuple[str, str], tuple[Filter, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._compiled)

    @staticmethod
    def _key(expression: definition_pb2.FilterExpression) -> tuple[str, str] | None:
        """(kind, text); None for no filter; ILLEGAL_FILTER_EXPRESSION for an unknown type or a too long text."""
        if expression.type == FilterType.FILTER_TYPE_UNSPECIFIED and not expression.expression:
            return None
        kind = _FILTER_TYPES.get(expression.type)
        if kind is None:
            raise RpcFailure(Code.ILLEGAL_FILTER_EXPRESSION,
                             f"filter type {expression.type} is unknown; use TAG or SQL92")
        text = expression.expression or ("*" if kind == "TAG" else "")
        if len(text) > MAX_EXPRESSION_CHARS:
            raise RpcFailure(Code.ILLEGAL_FILTER_EXPRESSION,
                             f"the {kind} expression is {len(text):,} characters; the limit is "
                             f"{MAX_EXPRESSION_CHARS:,}: split the subscription, or filter on fewer properties")
        return kind, text

    def cached(self, expression: definition_pb2.FilterExpression) -> tuple[bool, Filter | None]:
        """(True, the subscription) when it needs no compiling off the loop: none, or compiled before."""
        key = self._key(expression)
        if key is None:
            return True, None
        with self._lock:
            found = self._compiled.get(key)
            if found is None:
                return False, None
            self._compiled.move_to_end(key)
            return True, found[0]

    def compile(self, expression: definition_pb2.FilterExpression) -> Filter | None:
        """The compiled subscription (FilterError for a bad expression), kept for the next receive."""
        key = self._key(expression)
        if key is None:
            return None
        kind, text = key
        broker = self._broker
        if kind not in broker.filters:
            raise RpcFailure(Code.UNSUPPORTED, f"broker {self._broker_name!r} has no {kind} filter plugin; add "
                                               f"{_PLUGINS[kind]} to broker.plugins")
        compiled = broker.compile_subscription(kind, text)
        cost = estimated_bytes(text)
        with self._lock:
            if key not in self._compiled:
                self._compiled[key] = (compiled, cost)
                self.bytes += cost
            while self.bytes > self._max_bytes and len(self._compiled) > 1:
                _, (_, freed) = self._compiled.popitem(last=False)
                self.bytes -= freed
        return compiled
