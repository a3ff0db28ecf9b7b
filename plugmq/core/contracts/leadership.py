"""Leadership: what an election hands the master of a broker name, and the in-sync set it keeps.

The rule every replication change is judged by (DESIGN.md section 12): an acknowledged message is
never lost. Three things keep it, in the lineage of Kafka's ISR and RocketMQ 5's SyncStateSet:

* the **in-sync set** (:class:`InSyncSet`) of a broker name lives in the name service with the
  master epoch; only the current master changes it, by writes the name service checks against
  the version it last wrote, so a master that was replaced (or cannot reach the name service)
  can neither grow nor shrink it;
* only members of the set may be elected (:data:`Eligibility` decides, given the stored set);
* the master acks and serves only while it holds a **lease** (:meth:`Leadership.holds`): its
  session is up and its last confirmed contact with the name service is younger than a lease
  shorter than the session timeout, so no ack leaves a master whose session could have expired.

A cluster plugin that keeps sets and leases offers :class:`InSyncCluster` beside its
:class:`~plugmq.core.contracts.cluster.ClusterService`; a replication plugin gets the master's
:class:`Leadership` when it is promoted. Without failover (roles fixed in the config) the
replication plugin keeps its set in memory: :class:`LocalLeadership`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from plugmq.core.errors import FencedError, ValidationError
from plugmq.core.message import SendStatus

__all__ = ["CommitPointReplication", "Eligibility", "InSyncCluster", "InSyncSet", "Leadership", "LocalLeadership"]


def _members(value: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in value)


def _check_members(instance: InSyncSet, _attribute: attrs.Attribute[Any], value: frozenset[int]) -> None:
    if any(v < 0 for v in value):
        raise ValidationError(f"in-sync set members are broker ids >= 0; got {sorted(value)}")
    if instance.master not in value:
        raise ValidationError(f"the in-sync set must hold its master {instance.master}; got {sorted(value)}")


@attrs.frozen
class InSyncSet:
    """The brokers of one name that hold every acknowledged record (broker ids, the master's too).

    ``epoch``: the master epoch the set belongs to; ``master``: the broker id of that epoch's
    master. ``version``: the name service's version of the record it was read from or written as
    (-1 when not stored): a change is written only over that version.
    """

    epoch: int
    master: int
    members: frozenset[int] = attrs.field(converter=_members, validator=_check_members)
    version: int = -1

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what the name service stores; the version is the store's own)."""
        return {"epoch": self.epoch, "master": self.master, "members": sorted(self.members)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], version: int = -1) -> InSyncSet:
        """Rebuild from :meth:`as_dict` output; ValidationError names what is wrong."""
        try:
            epoch, master, members = data["epoch"], data["master"], data["members"]
        except (KeyError, TypeError) as exc:
            raise ValidationError(f"not an in-sync set ({type(exc).__name__}: {exc}): {data!r:.200}") from exc
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (epoch, master, *members)):
            raise ValidationError(f"an in-sync set holds integers (epoch, master, member ids); got {data!r:.200}")
        return cls(epoch, master, members, version)


Eligibility = Callable[["InSyncSet | None"], tuple[bool, str]]
"""Asked by an election won, before the win is claimed: may this broker be master, given the
stored in-sync set of its name (None: none stored yet)? Returns the answer and why."""


@runtime_checkable
class Leadership(Protocol):
    """A won election as the master holds it (handed over with the Mastership). Thread-safe."""

    @property
    def epoch(self) -> int:
        """The epoch this election granted."""

    @property
    def lost(self) -> bool:
        """True once this broker surely no longer leads (session ended, newer master, withdrawn)."""

    def holds(self) -> bool:
        """Whether this broker is surely still the master now: not lost, its session connected
        and its lease fresh. Cheap (no round trip): asked before every ack and every read served."""

    def wait_held(self, timeout: float) -> bool:
        """Block until :meth:`holds` (True), or until lost or ``timeout`` seconds passed (False)."""

    def why_not(self) -> str:
        """Why :meth:`holds` is False (for error messages); "" while it holds."""

    def in_sync(self) -> InSyncSet:
        """The in-sync set as last written (or read back) by this master."""

    def change_in_sync(self, members: frozenset[int]) -> InSyncSet:
        """Write a new member list over the version last written (blocking, bounded by the name
        service's call timeout). Returns the set written. Raises FencedError when a newer master
        changed the set (this one is marked lost), ClusterError when the name service cannot be
        reached (nothing changed as far as anyone may rely on: the caller tries again later)."""

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever :meth:`holds` may have changed (on the service's thread:
        it must only signal)."""


@runtime_checkable
class InSyncCluster(Protocol):
    """A cluster service that keeps in-sync sets and leases: what automatic failover needs."""

    def in_sync_set(self, broker_name: str) -> InSyncSet | None:
        """The stored in-sync set of ``broker_name`` (None: none stored). Raises ClusterError when
        the name service cannot be reached."""

    def stand(self, listener: Callable[[Any], None], eligible: Eligibility) -> None:
        """Stand for master of the registered broker name, as ``ClusterService.campaign`` does,
        but claim a won election only if ``eligible(stored set)`` allows it; the claim grants the
        next epoch and writes the set ``{this broker}`` in one atomic step. A broker not eligible
        lets the election go and stands again a moment later. ``listener`` gets a Mastership
        whose ``leadership`` is the :class:`Leadership`, and None once it is lost."""


@runtime_checkable
class CommitPointReplication(Protocol):
    """A replication service that keeps a commit point (Kafka's high watermark): what every
    in-sync broker holds. The broker shows consumers messages below it only, confirms consumer
    state once it passed it, and asks before storing a send."""

    def committed_offset(self) -> int | None:
        """The log offset every in-sync broker holds; None when this broker may serve no reads now
        (a master that is not sure it still leads). A slave answers what its master last said."""

    def admit_write(self) -> SendStatus:
        """Asked before a send is stored: SEND_OK, or a status to answer instead of storing it
        (SLAVE_NOT_AVAILABLE: too few in-sync brokers). Raises FencedError when this broker is not
        sure it is master, ReadOnlyBrokerError on a slave."""

    def await_committed(self, end_offset: int) -> bool:
        """Wait (bounded by the plugin's sync timeout) until the commit point passes
        ``end_offset`` with this broker still master; False when it did not in time,
        FencedError when this broker is not sure it still leads."""


class LocalLeadership:
    """A master whose role is fixed in its config (no election): always holds; the set is kept in
    memory only (what its own slaves hold, for sync double-write and the commit point)."""

    def __init__(self, master: int = 0) -> None:
        self._lock = threading.Lock()
        self._set = InSyncSet(0, master, {master})
        self._lost = False

    @property
    def epoch(self) -> int:
        return 0

    @property
    def lost(self) -> bool:
        return self._lost

    def holds(self) -> bool:
        return not self._lost

    def wait_held(self, timeout: float) -> bool:
        del timeout
        return not self._lost

    def why_not(self) -> str:
        return "this broker is no longer master" if self._lost else ""

    def in_sync(self) -> InSyncSet:
        with self._lock:
            return self._set

    def change_in_sync(self, members: frozenset[int]) -> InSyncSet:
        with self._lock:
            if self._lost:
                raise FencedError("this broker is no longer master: it cannot change its in-sync set")
            self._set = InSyncSet(0, self._set.master, members)
            return self._set

    def add_listener(self, listener: Callable[[], None]) -> None:
        del listener  # holds() never changes until end(), which nobody waits on

    def end(self) -> None:
        """The broker stops being master."""
        self._lost = True
