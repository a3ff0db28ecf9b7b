"""The plugin's table of strategies: name -> factory(**params), and what each declares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugmq.core import AllocateStrategy, AllocateStrategyFactory, AllocationCapabilities
from plugmq.plugins.alloc.average import Averagely, AveragelyByCircle, make_averagely, make_averagely_by_circle
from plugmq.plugins.alloc.config import ByConfig, make_config
from plugmq.plugins.alloc.consistent_hash import ConsistentHash, make_consistent_hash
from plugmq.plugins.alloc.machine_room import (
    MachineRoom,
    MachineRoomNearby,
    make_machine_room,
    make_machine_room_nearby,
)


def _make_nearby(**params: Any) -> AllocateStrategy:
    # The inner strategy comes from this table: a plugin cannot reach the broker's registry.
    return make_machine_room_nearby(STRATEGIES, **params)


STRATEGIES: Mapping[str, AllocateStrategyFactory] = {
    Averagely.name: make_averagely,
    AveragelyByCircle.name: make_averagely_by_circle,
    ConsistentHash.name: make_consistent_hash,
    MachineRoomNearby.name: _make_nearby,
    MachineRoom.name: make_machine_room,
    ByConfig.name: make_config,
}

CAPABILITIES: Mapping[str, AllocationCapabilities] = {
    cls.name: cls.capabilities
    for cls in (Averagely, AveragelyByCircle, ConsistentHash, MachineRoomNearby, MachineRoom, ByConfig)
}
