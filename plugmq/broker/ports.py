"""What the server uses of a broker: Protocols the Broker implements.

Like clients (plugmq.client.ports), the gRPC MessagingService is written against these, not
against :class:`plugmq.broker.broker.Broker`; mypy checks that the Broker implements each where
one is handed over.
"""

from __future__ import annotations

from typing import Protocol

from plugmq.broker.pop import PopService
from plugmq.client.ports import Sending, TransactionSending
from plugmq.config.policy import GroupPolicy
from plugmq.core.clock import Clock
from plugmq.core.contracts import DelayScheduler, Filter, FilterCompiler, TransactionService
from plugmq.core.message import SendStatus

__all__ = ["Serving"]


class _Services(Protocol):
    @property
    def delay(self) -> DelayScheduler | None:
        ...

    @property
    def transactions(self) -> TransactionService | None:
        ...

    def group_policy(self, group: str) -> GroupPolicy:
        ...


class Serving(_Services, Sending, TransactionSending, Protocol):
    """What the gRPC MessagingService uses: sends, pop consumption, filters, delay cancels."""

    clock: Clock
    filters: dict[str, FilterCompiler]
    pop: PopService

    def compile_subscription(self, expression_type: str, expression: str) -> Filter:
        ...

    def cancel_delayed(self, msg_id: str) -> bool:
        ...

    def check_writable(self, action: str = ...) -> None:
        """ReadOnlyBrokerError on a slave."""
        ...

    def await_replication(self, end_offset: int | None = None) -> SendStatus:
        """A sync_master's wait for a slave (SEND_OK elsewhere)."""
        ...
