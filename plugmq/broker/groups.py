"""Consumer-group membership on the broker: registration, heartbeats on the clock, rebalance.

Every member recomputes its queues with the group's strategy over RocketMQ-sorted inputs. In one
process the rebalance of a group runs under one lock in two phases — every member first releases
(committing offsets) the queues it loses, then takes the ones it gains — so a queue is never
consumed by two members at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

import attrs

from plugmq.client.ports import GroupMember
from plugmq.core.clock import Clock, Timer
from plugmq.core.logs import get_logger
from plugmq.core.message import MessageQueue
from plugmq.core.rebalance_order import rocketmq_sorted

__all__ = ["GroupMember", "GroupRegistry"]

log = get_logger(__name__)


@attrs.define
class _Membership:
    member: GroupMember
    last_heartbeat: float


class GroupRegistry:
    """Members of every clustering group of one broker."""

    def __init__(self, clock: Clock, heartbeat_timeout_s: float,
                 queues_of: Callable[[str], list[MessageQueue]]) -> None:
        self._clock = clock
        self._timeout = heartbeat_timeout_s
        self._queues_of = queues_of
        self._lock = threading.RLock()
        self._groups: dict[str, dict[str, _Membership]] = {}
        self._expiry: Timer | None = None
        self.rebalances = 0

    def register(self, member: GroupMember) -> None:
        with self._lock:
            group = self._groups.setdefault(member.group, {})
            group[member.client_id] = _Membership(member, self._clock.now())
            log.info("consumer joined", group=member.group, client=member.client_id, members=len(group))
            self._arm_expiry()
            self.rebalance(member.group)

    def unregister(self, member: GroupMember) -> None:
        with self._lock:
            group = self._groups.get(member.group, {})
            if group.pop(member.client_id, None) is None:
                return
            member.release_queues(member.owned_queues())
            log.info("consumer left", group=member.group, client=member.client_id, members=len(group))
            self.rebalance(member.group)

    def heartbeat(self, group: str, client_id: str) -> bool:
        """Record a heartbeat; False if the member was already dropped (it must register again)."""
        with self._lock:
            membership = self._groups.get(group, {}).get(client_id)
            if membership is None:
                return False
            membership.last_heartbeat = self._clock.now()
            return True

    def members(self, group: str) -> list[str]:
        with self._lock:
            return list(self._groups.get(group, {}))

    def reposition(self, group: str, queues: Collection[MessageQueue], move: Callable[[], None]) -> list[str]:
        """Run ``move`` (which rewrites the group's committed offsets of ``queues``) while no member
        consumes those queues: their owners release them first (committing where they were) and
        take them back afterwards, starting from the offsets ``move`` wrote. Returns the client ids
        of the members that held any of them."""
        wanted = set(queues)
        with self._lock:
            held: list[tuple[GroupMember, set[MessageQueue]]] = []
            try:
                for membership in list(self._groups.get(group, {}).values()):
                    owned = membership.member.owned_queues() & wanted
                    if owned:
                        membership.member.release_queues(owned)
                        held.append((membership.member, owned))
                move()
            finally:
                for member, owned in held:
                    member.take_queues(owned)
            return [member.client_id for member, _ in held]

    def expire(self) -> list[str]:
        """Drop members whose last heartbeat is older than the timeout; rebalance their groups."""
        dropped = []
        with self._lock:
            now = self._clock.now()
            for group_name, group in self._groups.items():
                stale = [cid for cid, m in group.items() if now - m.last_heartbeat > self._timeout]
                for cid in stale:
                    membership = group.pop(cid)
                    membership.member.release_queues(membership.member.owned_queues())
                    log.warning("consumer missed heartbeats; dropped", group=group_name, client=cid,
                                silent_s=round(now - membership.last_heartbeat, 3))
                    dropped.append(cid)
                if stale:
                    self.rebalance(group_name)
        return dropped

    def _arm_expiry(self) -> None:
        if self._expiry is None or self._expiry.fired or self._expiry.cancelled:
            self._expiry = self._clock.call_later(self._timeout / 4, self._expiry_tick)

    def _expiry_tick(self) -> None:
        self.expire()
        with self._lock:
            self._expiry = None
            if any(self._groups.values()):
                self._arm_expiry()

    def room_of(self, group: str, client_id: str) -> str | None:
        """The machine room the group's member ``client_id`` was configured with (None: none, or no such member)."""
        with self._lock:
            entry = self._groups.get(group, {}).get(client_id)
            return entry.member.room if entry is not None else None

    def rebalance(self, group: str) -> None:
        """Recompute every member's queues; release everything lost before anything is taken."""
        with self._lock:
            members = [m.member for m in self._groups.get(group, {}).values()]
            if not members:
                return
            self.rebalances += 1
            ids = [m.client_id for m in members]
            plans: dict[str, set[MessageQueue]] = {}
            for member in members:
                target: set[MessageQueue] = set()
                for topic in member.topics_to_balance():
                    queues, sorted_ids = rocketmq_sorted(self._queues_of(topic), ids)
                    target.update(member.target_queues(topic, queues, sorted_ids))
                plans[member.client_id] = target
            self._warn_if_starved(group, members, plans)
            for member in members:
                lost = member.owned_queues() - plans[member.client_id]
                if lost:
                    member.release_queues(lost)
            for member in members:
                gained = plans[member.client_id] - member.owned_queues()
                if gained:
                    member.take_queues(gained)

    def _warn_if_starved(self, group: str, members: list[GroupMember], plans: dict[str, set[MessageQueue]]) -> None:
        """A strategy that hands the group none of a topic's queues (a room strategy whose rooms
        match no broker's) starves its consumers silently: say so, once per rebalance."""
        for topic in sorted({t for m in members for t in m.topics_to_balance()}):
            queues = self._queues_of(topic)
            if queues and not any(q.topic == topic for plan in plans.values() for q in plan):
                log.warning("no consumer of the group was given any queue of the topic: it will receive nothing. A "
                            "room strategy needs [broker] room on the brokers and the consumers' rooms to match",
                            group=group, topic=topic, queues=len(queues), consumers=len(members))

    def close(self) -> None:
        with self._lock:
            if self._expiry is not None:
                self._expiry.cancel()
