"""Transaction family: half messages, decisions and check-back (``plugmq_make_transaction_service``).

Zero or one per broker. The service (:class:`TransactionService`) gets a
:class:`TransactionContext` (the store, the write-back, a state journal for its op log) and
declares :class:`TransactionCapabilities`, including the check-back schedule it keeps.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from plugmq.core.contracts.declaration import PluginContext
from plugmq.core.contracts.delay import Deliver
from plugmq.core.contracts.journal import StateJournal
from plugmq.core.contracts.storage import MessageStore
from plugmq.core.message import (
    AppendRequest,
    AppendResult,
    StoredMessage,
)

__all__ = [
    "TransactionCapabilities",
    "TransactionChecker",
    "TransactionContext",
    "TransactionDecision",
    "TransactionService",
]


class TransactionDecision(enum.Enum):
    """The outcome of a local transaction (RocketMQ's LocalTransactionState)."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


@attrs.frozen
class TransactionCapabilities:
    """What a transaction service does, and the check-back schedule it keeps.

    ``check_immunity``: the per-message check-immunity time (``Prop.CHECK_IMMUNITY_SECONDS``)
    replaces ``transaction_timeout`` for that message's first check, without counting checks.
    ``delayed_transactions``: a delayed message may be sent in a transaction (else refused).
    ``persistent_check_count``: checks already made survive a restart (``check_max`` holds
    across crashes). ``transaction_timeout_ms`` / ``check_interval_ms`` / ``check_max``: first
    check this long after the half was stored, then one per interval, at most ``check_max``
    checks; the message goes to the discard topic at the next due time after the last check.
    ``schedule_resolution_ms``: how late (virtual time) a check or discard may come.
    """

    check_immunity: bool = True
    delayed_transactions: bool = False
    persistent_check_count: bool = True
    transaction_timeout_ms: int = 6_000
    check_interval_ms: int = 30_000
    check_max: int = 15
    schedule_resolution_ms: int = 0


@attrs.frozen
class TransactionContext(PluginContext):
    """PluginContext plus the store (half messages may live in it) and the write-back.

    ``deliver`` makes a committed message visible on its real topic/queue (and moves a
    discarded one to the discard topic); every effect of a decision goes through it.
    ``journal`` (in a broker): where the service keeps its op log, so decisions and counted
    checks travel to a slave with the half messages (see :class:`StateJournal`).
    """

    store: MessageStore | None = None
    deliver: Deliver | None = None
    journal: StateJournal | None = None


TransactionChecker = Callable[[StoredMessage], TransactionDecision]
"""A producer group's check listener: given the half message (with its real topic and queue, the
transaction id as ``msg_id``), the state of its local transaction now."""


@runtime_checkable
class TransactionService(Protocol):
    """Half messages, decisions (an op log) and the check-back service.

    The rules ``plugmq.conformance.transactions`` checks, in a broker, on a ManualClock (clause
    names in brackets):

    - A half message is invisible to consumers until committed — also while the local
      transaction runs and while it is UNKNOWN; a committed one appears once on its real topic
      and queue with its body, tags, keys, properties and unique id [invisible_until_commit,
      unknown_stays_invisible_and_is_never_on_the_real_topic_early]. A rollback is never
      visible and never checked [rollback_never_visible_never_checked]; a local transaction that
      raises or answers nothing counts as UNKNOWN and is checked after the timeout
      [exception_or_no_answer_in_local_transaction_counts_as_unknown].
    - Check-back follows the declared schedule: the first check ``transaction_timeout_ms``
      after the half was stored, then one per ``check_interval_ms``, each within
      ``schedule_resolution_ms``, at most ``check_max`` checks; then the message moves to
      ``TRANS_DISCARD_TOPIC`` (``Prop.REAL_TOPIC`` set, unique id kept) with a warning logged,
      and is never checked again [check_schedule_timeout_interval_max_then_discard]. The
      listener gets the half message with its real topic, keys, properties and the transaction
      id as ``msg_id`` [check_listener_sees_the_real_topic_and_the_transaction_id]; its COMMIT
      or ROLLBACK settles the transaction [check_answer_settles].
    - ``Prop.CHECK_IMMUNITY_SECONDS`` (with ``check_immunity``) delays the first check without
      counting checks [check_immunity_delays_first_check_without_burning_counts]; checks of a
      group without a live listener wait uncounted and come due within one interval of a
      listener registering [group_without_live_checker_waits_uncounted].
    - A decision is durable before it takes effect and takes effect at most once: a second
      COMMIT or ROLLBACK of the same transaction changes nothing and returns False, also when
      several threads commit at once (exactly one True each) [decision_twice_has_no_second_effect,
      concurrent_commits_apply_once].
    - Restarts: a clean restart keeps open transactions (checked again) and settled ones (never
      checked again) [clean_restart_keeps_open_and_settled_transactions]; a SIGKILL at any step
      of a transaction's life — in the local transaction, before or after a commit became
      visible, after a rollback, during a check, before a check's commit or a discard became
      visible — ends, after recovery, with the message visible exactly once, discarded exactly
      once or gone, as its decision says, and with checks already made still counted when
      ``persistent_check_count`` [restart_after_kill].
    """

    @property
    def capabilities(self) -> TransactionCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def prepare(self, request: AppendRequest, producer_group: str) -> AppendResult:
        """Store a half message for ``request`` (its real topic/queue), invisible to consumers.

        The returned ``msg_id`` is the transaction id that ``end`` takes. Raises TransactionError
        for a request the service cannot hold — a delayed one without ``delayed_transactions``
        — and then stores nothing, not even on the half topic
        [delayed_transactional_message_refused].
        """

    def end(self, msg_id: str, decision: TransactionDecision, *, from_check: bool = False) -> bool:
        """Record and apply a decision; False if the transaction was already settled.

        UNKNOWN records nothing (the check-back will ask) and returns whether it is still open.
        Raises TransactionError for an id that names no half message
        [unknown_transaction_id_is_an_error].
        """

    def register_checker(self, producer_group: str, checker: TransactionChecker) -> None:
        """Add a live check listener of a producer group (any live one may be asked).

        Checks of a group with no live listener wait without being counted; registering one
        makes the waiting checks due.
        """

    def unregister_checker(self, producer_group: str, checker: TransactionChecker) -> None:
        """Remove a listener added with ``register_checker`` (its producer shut down)."""

    def pending(self) -> int:
        """How many transactions have no decision yet."""

    def metrics(self) -> Mapping[str, float]:
        """Counters (prepared, committed, rolled_back, checks, discarded, ...)."""

    def clean_expired(self, now_ms: int) -> int:
        """Remove files no longer needed (op-log records of settled transactions); return how
        many were removed. Never removes anything an open or undelivered transaction needs.

        Called by the broker every few seconds of its clock. Half messages live in the store: the
        service keeps open ones from the store's retention through ``context.retention``.
        """

    def start(self) -> None:
        """Recover (finish recorded decisions, reload open transactions) and start checking."""

    def close(self) -> None:
        """Stop checking and persist state. Idempotent."""
