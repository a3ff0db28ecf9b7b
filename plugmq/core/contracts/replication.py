"""Replication family: master / slave log shipping (``plugmq_make_replication_service``).

Zero or one per broker (none: no slaves). The service (:class:`ReplicationService`) ships the
store's commit log (the store is a :class:`~plugmq.core.contracts.storage.ReplicableStore`) and
acks ``sync_master`` sends once a slave holds them; :class:`FailoverReplication` is the capability
of a service whose broker changes role when the cluster's election says so. A slave's readers'
progress crosses to its master as a :class:`ConsumerHandover`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from plugmq.core.contracts._checks import non_negative_int
from plugmq.core.contracts.cluster import BrokerRole
from plugmq.core.contracts.declaration import PluginContext
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.contracts.storage import ReplicableStore
from plugmq.core.errors import ValidationError
from plugmq.core.message import (
    SendStatus,
)

__all__ = [
    "ClusterKeys",
    "ConsumerHandover",
    "FailoverReplication",
    "LaneProgress",
    "ReplicaStatus",
    "Replicated",
    "ReplicationCapabilities",
    "ReplicationContext",
    "ReplicationService",
    "ReplicationStatus",
]


@attrs.frozen
class ReplicationCapabilities:
    """What a replication plugin does.

    ``sync_double_write``: a ``sync_master`` acks a send only once a slave holds it.
    ``failover``: it promotes a slave and fences an old master by epoch (the cluster's election).
    ``replicates_state``: besides the commit log, it carries the state of delay, transaction,
    offset and pop services.
    """

    sync_double_write: bool = True
    failover: bool = False
    replicates_state: bool = False


@attrs.frozen
class ReplicaStatus:
    """One slave as its master sees it. ``lag_bytes``: the master's log end minus what the slave
    confirmed; ``lag_messages``: the records in that range (None when not counted)."""

    broker_id: int
    address: str
    confirmed_offset: int
    lag_bytes: int
    lag_messages: int | None = None
    in_sync: bool = True


@attrs.frozen
class ReplicationStatus:
    """A broker's replication as ``plugmq admin`` and metrics show it.

    On a master: ``address`` is where slaves connect, ``end_offset`` the log end,
    ``confirmed_offset`` the highest offset a slave confirmed, ``slaves`` the connected ones. On a
    slave: ``address`` is the master's, ``end_offset`` what it holds, ``master_end_offset`` the
    master's end as last heard, ``connected`` whether the stream is up. ``epoch`` is the master
    epoch the broker works under (0 without failover).
    """

    role: BrokerRole
    broker_id: int
    address: str
    end_offset: int
    confirmed_offset: int
    slaves: tuple[ReplicaStatus, ...] = ()
    master_end_offset: int | None = None
    connected: bool = False
    epoch: int = 0

    @property
    def lag_bytes(self) -> int:
        """The master's end minus what the (best) slave confirmed; on a slave, its own lag."""
        if self.role is BrokerRole.SLAVE:
            return max(0, (self.master_end_offset or self.end_offset) - self.end_offset)
        return max(0, self.end_offset - self.confirmed_offset) if self.slaves else 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``plugmq admin`` and the metrics exporter read)."""
        return {
            "role": self.role.value, "broker_id": self.broker_id, "address": self.address,
            "end_offset": self.end_offset, "confirmed_offset": self.confirmed_offset,
            "master_end_offset": self.master_end_offset, "connected": self.connected, "epoch": self.epoch,
            "lag_bytes": self.lag_bytes,
            "slaves": [attrs.asdict(s) for s in self.slaves],
        }


Replicated = Callable[[int], None]
"""The broker's hook on a slave: records up to this end offset were appended (wake consumers,
learn new topics)."""

def _text(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValidationError(f"{attribute.name} must be a non-empty string, got {value!r}")


@attrs.frozen
class LaneProgress:
    """How far a consumer group got in one queue: every offset below ``done_below`` is done.

    Unpacks as ``group, topic, queue_id, done_below`` (the order of :meth:`ConsumerHandover.as_rows`).
    """

    group: str = attrs.field(validator=_text)
    topic: str = attrs.field(validator=_text)
    queue_id: int = attrs.field(validator=non_negative_int)
    done_below: int = attrs.field(validator=non_negative_int)

    @property
    def key(self) -> tuple[str, str, int]:
        """``(group, topic, queue id)``: the lane it speaks of."""
        return self.group, self.topic, self.queue_id

    def __iter__(self) -> Iterator[str | int]:
        return iter((self.group, self.topic, self.queue_id, self.done_below))


def _lane(item: LaneProgress | Sequence[Any]) -> LaneProgress:
    if isinstance(item, LaneProgress):
        return item
    if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 4:
        raise ValidationError(f"a consumer lane is (group, topic, queue id, done below); got {item!r:.120}")
    return LaneProgress(*item)


def _lanes(items: Iterable[LaneProgress | Sequence[Any]]) -> tuple[LaneProgress, ...]:
    return tuple(_lane(item) for item in items)


@attrs.frozen
class ConsumerHandover:
    """Consumer progress a slave's own readers made while no master was up, handed to its master.

    Iterates over its :class:`LaneProgress` lanes; empty (false) when there is nothing to hand
    over. ``as_rows`` / ``from_rows`` are its JSON form for a replication stream; ``from_rows``
    raises ValidationError naming the row that is not a lane.
    """

    lanes: tuple[LaneProgress, ...] = attrs.field(default=(), converter=_lanes)

    def __iter__(self) -> Iterator[LaneProgress]:
        return iter(self.lanes)

    def __len__(self) -> int:
        return len(self.lanes)

    def as_rows(self) -> list[list[str | int]]:
        """``[[group, topic, queue id, done below], ...]``, JSON-ready."""
        return [list(lane) for lane in self.lanes]

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> ConsumerHandover:
        """Rebuild a hand-over from :meth:`as_rows` output."""
        return cls(rows)


@attrs.frozen
class ReplicationContext(PluginContext):
    """PluginContext plus the store to ship or fill, the broker's role and id, and the slave's hook.

    ``store`` is a :class:`ReplicableStore` (the broker refuses a store without the
    ``replication`` capability before it calls the factory). ``replicated`` is called on a
    slave after each chunk it appended; ``truncated`` after the slave cut its log back to where it
    agrees with its master (the broker then rebuilds the state it follows from the log).
    ``failover``: the cluster's election picks the master (``[broker] failover``); the broker
    then starts as a slave that follows no master until told which (:class:`FailoverReplication`).

    Consumer progress of a slave's own readers (consumers read from a slave while no master of
    its name is up; its log stays a copy, so that progress is in its memory only): a slave calls
    ``handover`` as it connects to a master and sends what it returns along (empty: nothing to
    hand over; ``handed_over`` once the master took it); a master calls ``adopt`` with what a
    slave handed over and the log offset up to which both logs agree, which moves its consumers
    forward to where the slave's readers got within that shared log (never back); it raises a
    PlugmqError when the broker cannot take it yet. All optional: without them the master delivers
    those messages again (at-least-once).
    """

    store: ReplicableStore | None = None
    role: BrokerRole = BrokerRole.ASYNC_MASTER
    broker_id: int = 0
    replicated: Replicated | None = None
    truncated: Replicated | None = None
    failover: bool = False
    handover: Callable[[], ConsumerHandover] | None = None
    handed_over: Callable[[ConsumerHandover], None] | None = None
    adopt: Callable[[ConsumerHandover, int], int] | None = None


@runtime_checkable
class ReplicationService(Protocol):
    """A broker's side of master / slave replication (RocketMQ's HAService).

    On a master (``async_master`` or ``sync_master``) it accepts slaves, each of which reports the
    offset it holds; from there it streams the commit log (``ReplicableStore.read_log``) and
    keeps what each slave confirmed. A dead or slow slave never blocks an append: only the sends
    of a ``sync_master`` wait, in :meth:`await_replicated`. On a slave it connects to the master
    by itself (again after any failure, with a back-off), appends what arrives
    (``append_log``: whole chunks or nothing) and confirms its end offset after each chunk (with
    sync flush, after the chunk is durable). A torn transfer never leaves a torn record.
    """

    @property
    def capabilities(self) -> ReplicationCapabilities:
        """Equal to the capabilities the plugin declares in ``plugmq_declare``."""

    def start(self) -> None:
        """Begin: a master listens for slaves, a slave connects to its master. Called once by the
        broker when it is assembled; returns without waiting for a peer."""

    def await_replicated(self, end_offset: int) -> SendStatus:
        """Wait until a slave confirmed the log up to ``end_offset`` (sync double-write).

        Called by the broker on a ``sync_master`` after each send was stored, on the sending
        thread. Returns SEND_OK once a slave confirmed it, SLAVE_NOT_AVAILABLE at once when no
        slave is connected and close enough to catch up, FLUSH_SLAVE_TIMEOUT when none confirmed
        it in the plugin's time limit (the message stays stored on the master). On an
        ``async_master`` it returns SEND_OK at once.
        """

    def status(self) -> ReplicationStatus:
        """Role, addresses, offsets, connected slaves and their lag (no blocking I/O)."""

    def close(self) -> None:
        """Stop listening / streaming and close connections. Idempotent."""


@runtime_checkable
class ClusterKeys(Protocol):
    """A replication service that holds the cluster secret (optional capability).

    The server seals receipt handles with ``cluster_key("receipt handles")`` when it is not None:
    every broker of the same broker name derives the same key, so a handle given out by a master
    is still accepted by the slave promoted in its place.
    """

    def cluster_key(self, purpose: str) -> bytes | None:
        """A 32-byte key for ``purpose``, the same on every broker of this broker name; None
        without a cluster secret."""


@runtime_checkable
class FailoverReplication(ReplicationService, Protocol):
    """A replication service whose broker changes role at run time (``capabilities.failover``).

    The broker calls these when its cluster's election says so (``plugmq.broker.failover``). Epochs
    fence: a log records where each master epoch began (RocketMQ 5's EpochFileCache), a slave
    whose log knows a newer epoch than a master's is refused by it, and a slave that holds records
    its new master never had (a returning old master) cuts them off in the handshake - its log
    then agrees with the new master's up to the point it follows from.
    """

    @property
    def epoch(self) -> int:
        """The newest master epoch this broker's log knows (0 before any election)."""

    def promote(self, epoch: int, role: BrokerRole, leadership: Leadership | None = None) -> None:
        """Become the master for ``epoch`` (a master ``role``): stop following, note that ``epoch``
        begins at the log's end, accept slaves. Returns without waiting for a slave.
        ``leadership``: the won election's lease and in-sync set (the cluster service keeps them):
        the master acks and serves only while it holds, and changes the set through it."""

    def follow(self, master: str) -> None:
        """Become (or stay) a slave of the master whose replication address is ``master``: stop
        serving slaves (sends waiting for one are answered), connect and copy its log."""

    @property
    def led_epoch(self) -> int:
        """The newest epoch this broker was itself master for (0 if none), kept across restarts."""

    @property
    def caught_up(self) -> bool:
        """Whether this broker holds what its master last said was committed (or is the master).
        For status only: elections trust the in-sync set the cluster service keeps."""

    @property
    def master_address(self) -> str:
        """Where slaves reach this broker while it is master ("" while it is a slave)."""
