"""MACHINE_ROOM_NEARBY and MACHINE_ROOM: RocketMQ's AllocateMachineRoomNearby and
AllocateMessageQueueByMachineRoom."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, ClassVar

import attrs

from plugmq.core import AllocateStrategy, AllocateStrategyFactory, AllocationCapabilities, MessageQueue
from plugmq.core.errors import AllocationError
from plugmq.core.rebalance_order import java_string_key
from plugmq.plugins.alloc._common import CheckedStrategy, Round, java_split, take_params

Resolver = Callable[[str], "str | None"]
"""A room resolver: the machine room of a broker name or consumer id, None (or "") for none."""


def default_resolver(name: str) -> str:
    """The room of a broker name or client id as RocketMQ's tests resolve it: the text before
    the first "-" (the whole name when there is none)."""
    return name.split("-", 1)[0]


def at_sign_room(broker_name: str) -> str | None:
    """RocketMQ's AllocateMessageQueueByMachineRoom rule: a broker named "<room>@<broker>" is in
    <room>; any other name (no "@", more than one, "room@" with nothing after) is in none."""
    parts = java_split(broker_name, "@")
    return parts[0] if len(parts) == 2 else None


@attrs.frozen
class MachineRoomNearby(CheckedStrategy):
    """Queues go to consumers of their own room first; rooms without consumers are shared by all.

    Every step uses ``inner`` on a sub-list, so its answer is RocketMQ's for the same inner
    strategy and resolvers. ``resolver`` gives the room of a broker name and, unless
    ``consumer_resolver`` is set, of a consumer id too (RocketMQ's MachineRoomResolver has one
    method per side; a live broker passes the configured rooms of its cluster's brokers and of
    the brokers its consumers connect to).
    """

    name: ClassVar[str] = "MACHINE_ROOM_NEARBY"
    capabilities: ClassVar[AllocationCapabilities] = AllocationCapabilities(room_aware=True)

    inner: AllocateStrategy
    resolver: Resolver = default_resolver
    consumer_resolver: Resolver | None = None

    def _room(self, resolver: Resolver, name: str, what: str) -> str:
        room = resolver(name)
        if not room or not isinstance(room, str):
            raise AllocationError(
                f"Machine room is null for {what}: the resolver gave {room!r} for {name!r}; "
                "it must return a non-empty room name"
            )
        return room

    def share(self, round_: Round) -> list[MessageQueue]:
        broker_resolver = self.resolver
        consumer_resolver = self.consumer_resolver or self.resolver
        queues_by_room: dict[str, list[MessageQueue]] = {}
        # One resolver call per broker, not per queue: a big topic has thousands of queues on
        # a few dozen brokers. The first failing queue is still the one named, as in RocketMQ.
        broker_rooms: dict[str, str] = {}
        for queue in round_.queues:
            room = broker_rooms.get(queue.broker_name)
            if room is None:
                room = broker_rooms[queue.broker_name] = self._room(broker_resolver, queue.broker_name, f"mq {queue}")
            queues_by_room.setdefault(room, []).append(queue)
        consumers_by_room: dict[str, list[str]] = {}
        for cid in round_.consumer_ids:
            consumers_by_room.setdefault(self._room(consumer_resolver, cid, f"consumer id {cid}"), []).append(cid)

        group, current_id = round_.consumer_group, round_.current_id
        current_room = self._room(consumer_resolver, current_id, f"consumer id {current_id}")
        result: list[MessageQueue] = []
        own_queues = queues_by_room.pop(current_room, None)
        if own_queues:
            result += self.inner.allocate(group, current_id, own_queues, consumers_by_room[current_room])
        # RocketMQ walks the rest in a TreeMap: room names in Java string order.
        orphan_rooms = [room for room in queues_by_room if room not in consumers_by_room]
        for room in sorted(orphan_rooms, key=java_string_key(orphan_rooms)):
            result += self.inner.allocate(group, current_id, queues_by_room[room], round_.consumer_ids)
        return result


@attrs.frozen
class MachineRoom(CheckedStrategy):
    """Only queues on brokers in one of ``rooms``; contiguous split, the remainder dealt one each
    to the first consumers.

    ``broker_room`` resolves a broker's room; by default RocketMQ's own rule, which reads it from
    broker names of the form "<room>@<broker>" (:func:`at_sign_room`). A live broker passes the
    rooms its cluster's brokers are configured with instead, since broker names cannot hold "@".
    """

    name: ClassVar[str] = "MACHINE_ROOM"
    # example_params: rooms named like the conformance suite's "r<k>@b<n>" brokers.
    capabilities: ClassVar[AllocationCapabilities] = AllocationCapabilities(
        may_leave_queues_unassigned=True, example_params={"rooms": ("r0", "r1")}, room_aware=True
    )

    rooms: frozenset[str] | None = None
    broker_room: Resolver = at_sign_room

    def _qualifies(self, queue: MessageQueue) -> bool:
        room = self.broker_room(queue.broker_name)
        if room is None:
            return False
        if self.rooms is None:
            # RocketMQ dereferences its unset room set here (a NullPointerException).
            raise AllocationError(
                f"MACHINE_ROOM has no rooms configured but broker {queue.broker_name!r} is in room "
                f"{room!r}; pass rooms=[...] (the machine rooms this consumer may consume from)"
            )
        return room in self.rooms

    def share(self, round_: Round) -> list[MessageQueue]:
        index = round_.index
        rooms: dict[str, bool] = {}  # one resolver call per broker
        qualifying = []
        for queue in round_.queues:
            ok = rooms.get(queue.broker_name)
            if ok is None:
                ok = rooms[queue.broker_name] = self._qualifies(queue)
            if ok:
                qualifying.append(queue)
        c = len(round_.consumer_ids)
        mod, rem = divmod(len(qualifying), c)
        result = qualifying[index * mod : index * mod + mod]
        if index < rem:
            result.append(qualifying[c * mod + index])
        return result


def _callable(strategy: str, param: str, value: Any) -> Resolver:
    if not callable(value):
        raise AllocationError(f"{strategy} parameter {param} must be a callable(name) -> room, got {value!r}")
    return value


def make_machine_room_nearby(strategies: Mapping[str, AllocateStrategyFactory], **params: Any) -> MachineRoomNearby:
    p = take_params(
        MachineRoomNearby.name, params,
        {"inner": "AVG", "inner_params": None, "resolver": None, "broker_room": None, "consumer_room": None},
    )
    inner_name, inner_params = p["inner"], p["inner_params"] or {}
    if not isinstance(inner_name, str) or inner_name not in strategies:
        raise AllocationError(
            f"MACHINE_ROOM_NEARBY parameter inner must name a strategy of this plugin, got {inner_name!r}; "
            f"known: {', '.join(sorted(strategies))}"
        )
    if not isinstance(inner_params, Mapping):
        raise AllocationError(
            f"MACHINE_ROOM_NEARBY parameter inner_params must be a dict of the inner strategy's "
            f"parameters, got {inner_params!r}"
        )
    name = MachineRoomNearby.name
    both = default_resolver if p["resolver"] is None else _callable(name, "resolver", p["resolver"])
    broker = both if p["broker_room"] is None else _callable(name, "broker_room", p["broker_room"])
    consumer = both if p["consumer_room"] is None else _callable(name, "consumer_room", p["consumer_room"])
    return MachineRoomNearby(inner=strategies[inner_name](**inner_params), resolver=broker, consumer_resolver=consumer)


def _room_set(rooms: Any) -> frozenset[str] | None:
    if rooms is None:
        return None
    # A string is a comma-separated list, so the CLI's --param rooms=a,b works as written.
    items: Iterable[Any] = rooms.split(",") if isinstance(rooms, str) else rooms
    if not isinstance(items, Collection) or not all(isinstance(r, str) for r in items):
        raise AllocationError(f"MACHINE_ROOM parameter rooms must be a list of room names, got {rooms!r}")
    return frozenset(items)


def make_machine_room(**params: Any) -> MachineRoom:
    # consumer_room is accepted because every room-aware strategy takes both resolvers; RocketMQ's
    # by-machine-room strategy never looks at the consumers' rooms.
    p = take_params(MachineRoom.name, params, {"rooms": None, "broker_room": None, "consumer_room": None})
    if p["consumer_room"] is not None:
        _callable(MachineRoom.name, "consumer_room", p["consumer_room"])
    broker_room = at_sign_room if p["broker_room"] is None else _callable(MachineRoom.name, "broker_room",
                                                                        p["broker_room"])
    return MachineRoom(rooms=_room_set(p["rooms"]), broker_room=broker_room)
