"""QueryAssignment: which queues a push consumer of a group reads, over every broker of the route.

By default the answer is RocketMQ 5's pop assignment (the proxy's ``RouteActivity``): one
assignment per broker that has readable queues of the topic, with queue id -1, so every consumer
receives from every broker and the broker's pop state hands each message to one of them. A group
whose policy names an allocation strategy (``[groups.<g>] allocation``) gets RocketMQ 4's
rebalance instead: the strategy runs over the RocketMQ-sorted, cluster-wide queue list and the
group's live consumer ids, and the consumer reads only its own queues. Consumers heartbeat every
broker of their routes, so every broker sees the same members once heartbeats have gone round.

Room-aware strategies (MACHINE_ROOM, MACHINE_ROOM_NEARBY) get the rooms configured on the brokers
(``[broker] room``). A consumer's room comes from the consumer itself, never from the broker it
talks to (the official clients report each broker's own endpoint as their access point, which
would put every consumer in every broker's room): the group's ``allocation_params.consumer_rooms``
maps rooms to the hosts their consumers run on (``{ east = ["10.1.0.0/16"], west = ["web-w*"] }``:
networks, or globs of the host a client reports or of its client id)::

    [groups.billing]
    allocation = "MACHINE_ROOM_NEARBY"
    allocation_params = { consumer_rooms = { east = ["10.1.0.0/16"], west = ["10.2.0.0/16"] } }
"""

from __future__ import annotations

import fnmatch
import ipaddress
import threading
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.broker.routes import RoutedQueue
from plugmq.config.policy import GroupPolicies, GroupPolicy
from plugmq.core.clock import Clock, Timer
from plugmq.core.contracts import AllocateStrategy, AllocateStrategyFactory, ClusterView
from plugmq.core.errors import AllocationError, ConfigError
from plugmq.core.logs import get_logger
from plugmq.core.message import MessageQueue
from plugmq.core.rebalance_order import rocketmq_sorted

__all__ = ["Assigner", "ConsumerMembers", "ConsumerRooms", "access_point_address"]

log = get_logger(__name__)


class ConsumerMembers:
    """The consumers of each group that talk to this broker (RocketMQ's ConsumerManager).

    A consumer is a member from its first heartbeat (or assignment query) until it says goodbye
    (NotifyClientTermination) or stays silent for ``expiry_s`` on ``clock``. What silent clients
    leave behind (their ids, their groups, their access points) is pruned every ``expiry_s / 2``
    by :meth:`start_pruning`, so heartbeats with ever new client ids cannot grow the server.
    """

    def __init__(self, clock: Clock, expiry_s: float) -> None:
        self._clock = clock
        self._expiry_ms = round(expiry_s * 1000)
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, int]] = {}
        self._access_points: dict[str, tuple[str, int]] = {}
        self._hosts: dict[str, str] = {}  # client id -> the host it reports (its user agent): its room
        self._timer: Timer | None = None
        self._pruning = False

    def seen(self, group: str, client_id: str) -> None:
        if not client_id:
            return
        with self._lock:
            self._groups.setdefault(group, {})[client_id] = self._clock.now_ms()

    def access_point(self, client_id: str, address: str) -> None:
        """The endpoint the client was configured with ("host:port", its first address)."""
        if client_id and address:
            with self._lock:
                self._access_points[client_id] = (address, self._clock.now_ms())

    def host(self, client_id: str, hostname: str) -> None:
        """The host the client runs on, as it reports it (the official clients: their local address)."""
        if client_id and hostname:
            with self._lock:
                self._hosts[client_id] = hostname

    def host_of(self, client_id: str) -> str | None:
        with self._lock:
            return self._hosts.get(client_id)

    def access_point_of(self, client_id: str) -> str | None:
        with self._lock:
            found = self._access_points.get(client_id)
        return found[0] if found is not None else None

    def size(self) -> int:
        """Client ids held, over every group and the access points."""
        with self._lock:
            return sum(len(members) for members in self._groups.values()) + len(self._access_points)

    def prune(self) -> int:
        """Forget every client silent for longer than the expiry; returns how many entries went."""
        oldest = self._clock.now_ms() - self._expiry_ms
        removed = 0
        with self._lock:
            for group in list(self._groups):
                members = self._groups[group]
                for client_id in [c for c, seen in members.items() if seen < oldest]:
                    del members[client_id]
                    removed += 1
                if not members:
                    del self._groups[group]
            live = {c for members in self._groups.values() for c in members}
            for client_id in [c for c, (_, seen) in self._access_points.items() if seen < oldest and c not in live]:
                del self._access_points[client_id]
                removed += 1
            for client_id in [c for c in self._hosts if c not in live and c not in self._access_points]:
                del self._hosts[client_id]
        return removed

    def start_pruning(self) -> None:
        """Prune every half expiry on the clock until :meth:`stop_pruning`."""
        self._pruning = True
        self._timer = self._clock.call_later(self._expiry_ms / 2000, self._prune_and_rearm)

    def _prune_and_rearm(self) -> None:
        if not self._pruning:
            return
        try:
            removed = self.prune()
            if removed:
                log.info("silent clients forgotten", removed=removed)
        finally:
            if self._pruning:
                self._timer = self._clock.call_later(self._expiry_ms / 2000, self._prune_and_rearm)

    def stop_pruning(self) -> None:
        self._pruning = False
        if self._timer is not None:
            self._timer.cancel()

    def leave(self, client_id: str) -> None:
        with self._lock:
            for members in self._groups.values():
                members.pop(client_id, None)
            self._access_points.pop(client_id, None)
            self._hosts.pop(client_id, None)

    def members(self, group: str) -> list[str]:
        """The group's live consumer ids (unsorted)."""
        oldest = self._clock.now_ms() - self._expiry_ms
        with self._lock:
            members = self._groups.get(group, {})
            for client_id in [c for c, seen in members.items() if seen < oldest]:
                del members[client_id]
                log.info("consumer expired from its group (no heartbeat)", group=group, client=client_id)
            return list(members)


class Assigner:
    """Builds each allocating group's strategy and answers its consumers' assignment queries."""

    def __init__(self, strategies: Mapping[str, AllocateStrategyFactory], policies: GroupPolicies,
                 members: ConsumerMembers) -> None:
        self._strategies = strategies
        self._policies = policies
        self.members = members
        self._plain: dict[str, AllocateStrategy] = {}  # strategies without rooms, built once per group
        self._starved: set[tuple[str, str]] = set()  # (group, topic) warned about: no consumer gets a queue
        for group, policy in {"": policies.default, **policies.groups}.items():
            if policy.allocation is not None:
                self._check(group, policy)

    def _check(self, group: str, policy: GroupPolicy) -> None:
        where = (f"groups.{group}" if group else "groups") + ".allocation"
        factory = self._strategies.get(policy.allocation or "")
        if factory is None:
            raise ConfigError(f"{where} = {policy.allocation!r} is not an allocation strategy of this broker; known: "
                              f"{', '.join(sorted(self._strategies)) or 'none (add the alloc plugin)'}")
        try:
            self._strategy(group, policy, ClusterView(""))
        except (AllocationError, TypeError) as exc:
            raise ConfigError(f"{where}_params: {exc}") from exc

    def allocating(self, group: str) -> bool:
        return self._policies.policy(group).allocation is not None

    def assign(self, group: str, client_id: str, route: list[RoutedQueue], view: ClusterView) -> list[RoutedQueue]:
        """The caller's queues under the group's strategy (the group must allocate), out of the
        readable queues of ``route`` (the caller leaves out the brokers consumers do not read)."""
        policy = self._policies.policy(group)
        self.members.seen(group, client_id)  # it is alive: it is asking
        readable = {r.queue: r for r in route if r.readable}
        if not readable:
            return []
        queues, consumers = rocketmq_sorted(readable, self.members.members(group))
        strategy = self._strategy(group, policy, view)
        try:
            mine: list[MessageQueue] = strategy.allocate(group, client_id, queues, consumers)
        except AllocationError as exc:
            raise AllocationError(
                f"group {group!r} allocates with {policy.allocation}, which failed: {exc}. Room strategies need "
                "[broker] room on every broker, and [groups.<g>] allocation_params.consumer_rooms naming the "
                f"room of every consumer's host (this one reports {self.members.host_of(client_id)!r})") from exc
        if strategy.capabilities.room_aware:
            self._warn_if_starved(group, strategy, queues, consumers, bool(mine))
        return [readable[q] for q in mine if q in readable]

    def _warn_if_starved(self, group: str, strategy: AllocateStrategy, queues: list[MessageQueue],
                         consumers: list[str], got_some: bool) -> None:
        """A room strategy that gives none of the group's consumers any queue of a topic (MACHINE_ROOM
        whose rooms match no broker's) starves them silently: say so once, until it gives some again."""
        topic = queues[0].topic
        if got_some or any(strategy.allocate(group, other, queues, consumers) for other in consumers):
            self._starved.discard((group, topic))
        elif (group, topic) not in self._starved:
            self._starved.add((group, topic))
            log.warning("the group's room strategy gives its consumers no queue of the topic: they receive nothing. "
                        "Check [broker] room on the brokers against the strategy's rooms and consumer_rooms",
                        group=group, topic=topic, queues=len(queues), consumers=len(consumers))

    def _strategy(self, group: str, policy: GroupPolicy, view: ClusterView) -> AllocateStrategy:
        cached = self._plain.get(group)
        if cached is not None:
            return cached
        assert policy.allocation is not None
        factory = self._strategies[policy.allocation]
        params = dict(policy.allocation_params)
        consumer_rooms = ConsumerRooms.parse(params.pop("consumer_rooms", None), group)
        strategy = factory(**params)
        if not strategy.capabilities.room_aware:
            if consumer_rooms is not None:
                raise AllocationError(f"consumer_rooms is for room strategies; {policy.allocation} does not use rooms")
            self._plain[group] = strategy  # keeps e.g. CONSISTENT_HASH's ring cache across calls
            return strategy
        # A broker name's room is its master's (id 0), else any of its brokers'.
        rooms = {b.broker_name: b.room for b in sorted(view.brokers, key=lambda b: -b.broker_id)}
        members = self.members
        return factory(**params, broker_room=lambda name: rooms.get(name) or None,
                       consumer_room=lambda cid: consumer_rooms.room_of(cid, members.host_of(cid))
                       if consumer_rooms is not None else None)


@attrs.frozen
class ConsumerRooms:
    """Rooms by the hosts their consumers run on: networks (CIDR) or globs of a host or client id."""

    rooms: tuple[tuple[str, tuple[ipaddress.IPv4Network | ipaddress.IPv6Network | str, ...]], ...]

    @classmethod
    def parse(cls, table: Any, group: str) -> ConsumerRooms | None:
        if table is None:
            return None
        where = f"groups.{group}.allocation_params.consumer_rooms" if group else "groups.allocation_params.consumer_rooms"
        if not isinstance(table, Mapping) or not all(isinstance(v, list) and all(isinstance(p, str) for p in v)
                                                     for v in table.values()):
            raise AllocationError(f"{where} must map each room to a list of networks or host globs, e.g. "
                                  f'{{ east = ["10.1.0.0/16"], west = ["web-w*"] }}, got {table!r}')
        rooms = []
        for room, patterns in table.items():
            parsed: list[ipaddress.IPv4Network | ipaddress.IPv6Network | str] = []
            for pattern in patterns:
                try:
                    parsed.append(ipaddress.ip_network(pattern, strict=False))
                except ValueError:
                    parsed.append(pattern)  # a glob
            rooms.append((str(room), tuple(parsed)))
        return cls(tuple(rooms))

    def room_of(self, client_id: str, host: str | None) -> str | None:
        """The first room one of whose patterns matches the client's host or id; None: no room."""
        address = _address(host)
        for room, patterns in self.rooms:
            for pattern in patterns:
                if isinstance(pattern, str):
                    if fnmatch.fnmatchcase(host or "", pattern) or fnmatch.fnmatchcase(client_id, pattern):
                        return room
                elif address is not None and address.version == pattern.version and address in pattern:
                    return room
        return None


def _address(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host) if host else None
    except ValueError:
        return None


def access_point_address(settings: Any) -> str:
    """The first address of a client's configured endpoints (its Telemetry settings' access point)."""
    addresses = list(settings.access_point.addresses)
    return f"{addresses[0].host}:{addresses[0].port}" if addresses else ""
