"""The delay and transaction services of a broker: built from its plugins, run on a master only.

A slave's store is written by the replication stream alone, so no delay or transaction service
of its own may deliver into it: they are built (not started) at assembly, started when the broker
is (or becomes) master, and closed and built anew when it is demoted.
"""

from __future__ import annotations

from collections.abc import Sequence

from plugmq.broker.delayledger import DelayLedger
from plugmq.broker.retention import RetentionSchedule
from plugmq.core.contracts import (
    DelayContext,
    DelayScheduler,
    Family,
    ReschedulableDelay,
    TransactionContext,
    TransactionService,
)
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.core.errors import DelayUnsupportedError, ValidationError
from plugmq.core.message import AppendResult
from plugmq.core.pluginmanager import LoadedPlugins, installed_of_family

__all__ = ["Services"]


class Services:
    """The broker's delay scheduler and transaction service (each None without its plugin)."""

    def __init__(self, broker_name: str, plugins: LoadedPlugins, retention: RetentionSchedule, *,
                 delay_context: DelayContext | None, txn_context: TransactionContext | None) -> None:
        self._name = broker_name
        self._plugins = plugins
        self._retention = retention
        self._delay_context = delay_context
        self._txn_context = txn_context
        self.delay: DelayScheduler | None = None
        self.transactions: TransactionService | None = None

    def build(self) -> None:
        """Build the services (not started: a master starts them)."""
        hooks = self._plugins.hooks
        if self._delay_context is not None:
            self.delay = hooks.make_delay_scheduler(self._delay_context)
        if self._txn_context is not None:
            self.transactions = hooks.make_transaction_service(self._txn_context)

    def _clean_with_retention(self) -> None:
        self._retention.add("delay", self.delay)
        self._retention.add("transactions", self.transactions)

    def start(self) -> None:
        """Start both (a master's): they replay their state and deliver what is due."""
        if self.delay is not None:
            self.delay.start()
        if self.transactions is not None:
            self.transactions.start()
        self._clean_with_retention()

    def stop(self) -> None:
        """Close both (a demoted master's) and build them anew, not started, for a later promotion."""
        self.close_transactions()
        self.close_delay()
        self.build()
        self._clean_with_retention()

    def close_transactions(self) -> None:
        if self.transactions is not None:
            self.transactions.close()

    def close_delay(self) -> None:
        if self.delay is not None:
            self.delay.close()

    # ------------------------------------------------------------------------------ delay
    def delay_levels_ms(self) -> Sequence[int]:
        """The delay plugin's levels (RocketMQ's 18 when it has none, or there is no plugin)."""
        return (self.delay.capabilities.levels_ms if self.delay is not None else None) or DEFAULT_DELAY_LEVELS_MS

    def require_delay(self, topic: str) -> DelayScheduler:
        """The delay scheduler, or DelayUnsupportedError for a delayed message to ``topic``."""
        if self.delay is None:
            serving = installed_of_family(Family.DELAY)
            raise DelayUnsupportedError(
                f"message to {topic!r} asks for a delay but broker {self._name!r} has no delay plugin; "
                f"add one of {', '.join(serving) or 'delay_level, delay_wheel, delay_schedule'} to broker.plugins"
            )
        return self.delay

    def cancel_delayed(self, msg_id: str, ledger: DelayLedger | None) -> bool:
        """Cancel a not-yet-due delayed message by the msg_id its send returned."""
        if self.delay is None:
            raise DelayUnsupportedError(f"broker {self._name!r} has no delay plugin; nothing to cancel")
        if not self.delay.capabilities.cancel:
            plugin = self._plugins.with_family(Family.DELAY)[0]
            raise DelayUnsupportedError(
                f"delay plugin {plugin!r} cannot cancel delayed messages; use delay_wheel or delay_schedule"
            )
        cancelled = self.delay.cancel(msg_id)
        if cancelled and ledger is not None:
            ledger.cancelled(msg_id)  # no later master delivers it either
        return cancelled

    def reschedule_delayed(self, msg_id: str, deliver_at_ms: int, ledger: DelayLedger | None) -> AppendResult | None:
        """Move a not-yet-due delayed message to ``deliver_at_ms``: its new result (the msg_id
        to use from now on), or None when no pending message has that id."""
        delay = self.delay
        if delay is None:
            raise DelayUnsupportedError(f"broker {self._name!r} has no delay plugin; nothing to reschedule")
        if not isinstance(delay, ReschedulableDelay):
            plugin = self._plugins.with_family(Family.DELAY)[0]
            raise DelayUnsupportedError(
                f"delay plugin {plugin!r} cannot reschedule delayed messages (a level is a queue read in deliver "
                "order, so a message cannot move within it); use delay_wheel or delay_schedule"
            )
        if not isinstance(deliver_at_ms, int) or isinstance(deliver_at_ms, bool) or deliver_at_ms < 0:
            raise ValidationError(f"deliver_at_ms must be a non-negative int (epoch ms), got {deliver_at_ms!r}")
        if ledger is not None:
            return ledger.rescheduled(msg_id, deliver_at_ms, lambda: delay.reschedule(msg_id, deliver_at_ms))
        return delay.reschedule(msg_id, deliver_at_ms)
