"""MACHINE_ROOM_NEARBY and MACHINE_ROOM: RocketMQ's AllocateMachineRoomNearby and
AllocateMessageQueueByMachineRoom."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import attrs

from plugmq.core import (
    AllocateStrategy,
    AllocateStrategyFactory,
    AllocationCapabilities,
    AllocationError,
    MessageQueue,
)
from plugmq.core.rebalance_order import java_string_key
from plugmq.plugins.alloc._common import check_inputs, java_split, take_params

Resolver = Callable[[str], str]


def default_resolver(name: str) -> str:
    """The room of a broker name or client id as RocketMQ's tests resolve it: the text before
    the first "-" (the whole name when there is none)."""
    return name.split("-", 1)[0]


@attrs.frozen
class MachineRoomNearby:
    """Queues go to consumers of their own room first; rooms without consumers are shared by all.

    Every step uses ``inner`` on a sub-list, so its answer is RocketMQ's for the same inner
    strategy and resolver.
    """

    name: ClassVar[str] = "MACHINE_ROOM_NEARBY"
    capabilities: ClassVar[AllocationCapabilities] = AllocationCapabilities()

    inner: AllocateStrategy
    resolver: Resolver = default_resolver

    def _room(self, name: str, what: str) -> str:
        room = self.resolver(name)
        if not room or not isinstance(room, str):
            raise AllocationError(
                f"Machine room is null for {what}: the resolver gave {room!r} for {name!r}; "
                "it must return a non-empty room name"
            )
        return room

    def allocate(
        self,
        consumer_group: str,
        current_id: str,
        all_queues: Sequence[MessageQueue],
        all_consumer_ids: Sequence[str],
    ) -> list[MessageQueue]:
        if not check_inputs(consumer_group, current_id, all_queues, all_consumer_ids):
            return []
        queues_by_room: dict[str, list[MessageQueue]] = {}
        # One resolver call per broker, not per queue: a big topic has thousands of queues on
        # a few dozen brokers. The first failing queue is still the one named, as in RocketMQ.
        broker_rooms: dict[str, str] = {}
        for queue in all_queues:
            room = broker_rooms.get(queue.broker_name)
            if room is None:
                room = broker_rooms[queue.broker_name] = self._room(queue.broker_name, f"mq {queue}")
            queues_by_room.setdefault(room, []).append(queue)
        consumers_by_room: dict[str, list[str]] = {}
        for cid in all_consumer_ids:
            consumers_by_room.setdefault(self._room(cid, f"consumer id {cid}"), []).append(cid)

        current_room = self._room(current_id, f"consumer id {current_id}")
        result: list[MessageQueue] = []
        own_queues = queues_by_room.pop(current_room, None)
        if own_queues:
            result += self.inner.allocate(
                consumer_group, current_id, own_queues, consumers_by_room[current_room]
            )
        # RocketMQ walks the rest in a TreeMap: room names in Java string order.
        orphan_rooms = [room for room in queues_by_room if room not in consumers_by_room]
        for room in sorted(orphan_rooms, key=java_string_key(orphan_rooms)):
            result += self.inner.allocate(consumer_group, current_id, queues_by_room[room], all_consumer_ids)
        return result


@attrs.frozen
class MachineRoom:
    """Only queues on brokers named "<room>@<broker>" with a configured room; contiguous split,
    the remainder dealt one each to the first consumers."""

    name: ClassVar[str] = "MACHINE_ROOM"
    # example_params: rooms named like the conformance suite's "r<k>@b<n>" brokers.
    capabilities: ClassVar[AllocationCapabilities] = AllocationCapabilities(
        may_leave_queues_unassigned=True, example_params={"rooms": ("r0", "r1")}
    )

    rooms: frozenset[str] | None = None

    def _qualifies(self, queue: MessageQueue) -> bool:
        parts = java_split(queue.broker_name, "@")
        if len(parts) != 2:
            return False
        if self.rooms is None:
            # RocketMQ dereferences its unset room set here (a NullPointerException).
            raise AllocationError(
                f"MACHINE_ROOM has no rooms configured but broker {queue.broker_name!r} names room "
                f"{parts[0]!r}; pass rooms=[...] (the machine rooms this consumer may consume from)"
            )
        return parts[0] in self.rooms

    def allocate(
        self,
        consumer_group: str,
        current_id: str,
        all_queues: Sequence[MessageQueue],
        all_consumer_ids: Sequence[str],
    ) -> list[MessageQueue]:
        if not check_inputs(consumer_group, current_id, all_queues, all_consumer_ids):
            return []
        index = list(all_consumer_ids).index(current_id)
        qualifying = [q for q in all_queues if self._qualifies(q)]
        c = len(all_consumer_ids)
        mod, rem = divmod(len(qualifying), c)
        result = qualifying[index * mod : index * mod + mod]
        if index < rem:
            result.append(qualifying[c * mod + index])
        return result


def make_machine_room_nearby(strategies: Mapping[str, AllocateStrategyFactory], **params: Any) -> MachineRoomNearby:
    p = take_params(
        MachineRoomNearby.name, params, {"inner": "AVG", "inner_params": None, "resolver": None}
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
    resolver = p["resolver"] if p["resolver"] is not None else default_resolver
    if not callable(resolver):
        raise AllocationError(
            f"MACHINE_ROOM_NEARBY parameter resolver must be a callable(name) -> room, got {resolver!r}"
        )
    return MachineRoomNearby(inner=strategies[inner_name](**inner_params), resolver=resolver)


def _room_set(rooms: Any) -> frozenset[str] | None:
    if rooms is None:
        return None
    # A string is a comma-separated list, so the CLI's --param rooms=a,b works as written.
    items: Iterable[Any] = rooms.split(",") if isinstance(rooms, str) else rooms
    if not isinstance(items, Collection) or not all(isinstance(r, str) for r in items):
        raise AllocationError(f"MACHINE_ROOM parameter rooms must be a list of room names, got {rooms!r}")
    return frozenset(items)


def make_machine_room(**params: Any) -> MachineRoom:
    p = take_params(MachineRoom.name, params, {"rooms": None})
    return MachineRoom(rooms=_room_set(p["rooms"]))
