"""Delay family: the strategy that holds delayed messages until due (``plugmq_make_delay_scheduler``).

Zero or one per broker. The scheduler gets a :class:`DelayContext` (the store, the write-back
``deliver`` / ``deliver_batch``, ``was_delivered`` to settle a delivery in doubt after a crash,
and a state journal) and declares :class:`DelayCapabilities`: what delays it can express, whether
it cancels, its resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from plugmq.core.contracts.declaration import PluginContext
from plugmq.core.contracts.journal import StateJournal
from plugmq.core.contracts.storage import MessageStore
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
)

__all__ = [
    "DelayCapabilities",
    "DelayContext",
    "DelayScheduler",
    "Deliver",
    "DeliverBatch",
    "ReschedulableDelay",
    "WasDelivered",
]


Deliver = Callable[[AppendRequest], AppendResult]
"""The broker's write-back: stores a due message as a normal message on its real topic/queue."""

DeliverBatch = Callable[[Sequence[AppendRequest]], Sequence[AppendResult]]
"""The broker's batched write-back: stores several due messages (any topics and queues) in one
store batch; results in request order (a store's columns, built when read, where it answers so).
Raises like ``Deliver``; after a crash any prefix of the batch may be stored, which
``WasDelivered`` settles message by message."""


@attrs.frozen
class DelayCapabilities:
    """What a delay strategy can express.

    ``levels_ms``: the fixed level delays (level n = ``levels_ms[n-1]``) for level-based
    strategies, None for arbitrary-delay ones. ``max_delay_ms``: the longest delay accepted
    (None = unbounded). ``clamps``: a too-long delay is clamped to the maximum instead of refused.
    ``resolution_ms``: one tick; lateness on ManualClock stays within it.
    """

    cancel: bool
    arbitrary_delay: bool
    levels_ms: tuple[int, ...] | None = None
    max_delay_ms: int | None = None
    clamps: bool = False
    resolution_ms: int = 1000
    no_duplicates_after_restart: bool = True


WasDelivered = Callable[[AppendRequest], bool]
"""Whether a message with this request's unique id (``Prop.UNIQ_KEY``) is already on its real
topic: lets a strategy settle a delivery that was in doubt when the process died."""


@attrs.frozen
class DelayContext(PluginContext):
    """PluginContext plus the store (for strategies that keep messages in it) and the write-back.

    ``deliver`` writes a due message to its real topic/queue. ``deliver_batch`` (optional; the
    broker always passes it) writes many at once: a burst of due messages costs one store batch,
    one stored-event pass and one consumer wake-up instead of one each; a strategy falls back to
    ``deliver`` per message when it is None. ``was_delivered`` answers, after a crash, whether a
    delivery whose completion was not recorded did reach the store, so a restart neither loses nor
    duplicates it. ``journal`` (in a broker): where the strategy keeps state that must follow the
    messages to a slave (see :class:`StateJournal`).
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None
    was_delivered: WasDelivered | None = None
    journal: StateJournal | None = None
    deliver_batch: DeliverBatch | None = None


@runtime_checkable
class DelayScheduler(Protocol):
    """Holds delayed messages until due, then writes them back through ``context.deliver``.

    The rules ``plugmq.conformance.delay`` checks (clause names in brackets):

    - Timing only through the context's clock (timers via ``clock.call_at``). Never early; late
      by at most ``capabilities.resolution_ms`` (a tick, in milliseconds), checked after every
      step of a ManualClock [never_early_and_late_by_at_most_one_tick]; a burst due at one moment
      goes out completely within that tick, in sending order
      [a_burst_due_at_once_goes_out_within_one_tick_in_order].
    - The write-back is the original message: its real topic and queue, body, every property
      except the delay ones, tags code, reconsume times, born timestamp and host, sys flag; each
      accepted message is written back exactly once.
    - Order: equal deliver times keep sending order (within one level for level strategies); a
      message whose tick is earlier is written back first [order_within_a_level_or_tick].
    - Restarts lose and repeat nothing: a clean close/reopen keeps ``pending()`` and delivers
      nothing again [clean_restart_loses_and_repeats_nothing]; after a SIGKILL while scheduling,
      while dispatching, or right after a write-back returned and before the strategy recorded
      it, every accepted message is written back exactly once and nothing never accepted is
      [restart_after_kill_mid_schedule, restart_after_kill_mid_dispatch,
      kill_right_after_a_write_back (which may land in the middle of a ``deliver_batch``)] —
      ``context.was_delivered`` settles the in-doubt ones.
    - Overdue at start: ``start()`` returns before delivering; what came due while the broker
      was down goes out on the clock's thread right after, oldest first, within one resolution;
      ``metrics()`` reports ``overdue_at_start`` and a ``*late*max`` figure holding that
      lateness [overdue_at_start_oldest_first_and_in_metrics].
    - Cancel answers False for an id of another broker or of no message and raises
      ValidationError for something that is not a message id [cancel_of_unknown_and_malformed_ids].
    - Three simulated days with a restart, ``clean_expired`` after every step, match a reference
      heap [three_simulated_days_match_a_reference_model].
    """

    @property
    def capabilities(self) -> DelayCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``, with default
        options. Consistent: ``resolution_ms >= 1``; an arbitrary-delay strategy has no
        ``levels_ms``; a level strategy lists positive levels and ``max_delay_ms`` is the
        longest [declares_consistent_capabilities]."""

    def schedule(self, request: AppendRequest, *, deliver_at_ms: int, delay_level: int | None) -> AppendResult:
        """Accept a delayed message durably. ``delay_level`` is set for a level request.

        Raises DelayUnsupportedError when the strategy cannot express the delay: a delay above
        ``max_delay_ms`` (unless it ``clamps``: then it is delivered at the maximum delay)
        [delay_above_max_clamped_or_refused_as_declared]; any non-level request to a strategy
        without ``arbitrary_delay``, even one equal to a level
        [arbitrary_delay_refused_by_level_strategy]. A refused request leaves nothing behind.
        The returned msg_id is what ``cancel`` takes.
        """

    def start(self) -> None:
        """Begin dispatching and return promptly: what came due while the broker was down is
        delivered by clock timers right after, oldest first, not inside this call."""

    def cancel(self, msg_id: str) -> bool:
        """Cancel a not-yet-due message; True if it will not be delivered (also across a
        restart), False if it was already delivered or moved by a reschedule [cancel_honoured]. Strategies without the
        ``cancel`` capability raise DelayUnsupportedError and keep the message scheduled
        [cancel_refused_where_not_declared]."""

    def pending(self) -> int:
        """How many accepted messages are not delivered (or cancelled) yet."""

    def metrics(self) -> Mapping[str, float]:
        """Counters and lateness figures: at least ``delivered``, ``overdue_at_start`` and a
        maximum lateness whose key contains ``late`` and ends with ``max`` (e.g. ``late_ms_max``)."""

    def clean_expired(self, now_ms: int) -> int:
        """Remove the strategy's own files (delay logs, segments, dispatch logs) whose every
        message is delivered or cancelled and whose time is past ``now_ms``; return how many
        files were removed. Never removes anything still needed to deliver a pending message or
        to avoid a duplicate after a restart.

        Called by the broker every few seconds of its clock (RocketMQ's cleanResourceInterval);
        cheap when there is nothing to remove.
        """

    def close(self) -> None:
        """Stop timers and persist state. Idempotent."""


@runtime_checkable
class ReschedulableDelay(Protocol):
    """A delay strategy that can move a pending message to another deliver time (an optional
    capability: the broker and the conformance suite check it with ``isinstance``).

    Auctions extending their end, a reminder pushed back: the message keeps its body, properties
    and unique key; only its deliver time changes. The rules ``plugmq.conformance.delay`` checks:

    - A pending message moves: it is written back once, at the new time (never early, late by at
      most one tick), never at the old one, and the write-back is the original message
      [reschedule_moves_a_pending_message]. A deliver time at or before now means "now".
    - The returned result carries the message's new msg_id; the old id is spent: a second
      reschedule of it answers None (one message is never moved into two) and a cancel of it
      False (the message is still coming) [reschedule_of_spent_unknown_and_malformed_ids].
    - None (nothing changed) for a message delivered, being delivered, cancelled or moved
      already, and for another broker's id or an id of no message; ValidationError for something
      that is not a message id [reschedule_of_spent_unknown_and_malformed_ids].
    - Limits as in ``schedule``: a deliver time beyond ``max_delay_ms`` is refused with
      DelayUnsupportedError (the message keeps its old time) or clamped, as ``clamps`` says
      [reschedule_beyond_the_maximum_clamped_or_refused].
    - A move is atomic: a clean restart keeps the new time, and after a SIGKILL in the middle of
      reschedules every message is written back exactly once, at its old or its new time
      [restart_after_kill_mid_reschedule].
    """

    def reschedule(self, msg_id: str, deliver_at_ms: int) -> AppendResult | None:
        """Move the pending message ``msg_id`` to ``deliver_at_ms`` (epoch ms); its new
        AppendResult, or None when there is no pending message of that id to move."""
