"""rendezvous: queue allocation by rendezvous (highest random weight) hashing.

Each queue goes to the consumer whose hash of ``(salt, queue, consumer)`` is highest. Every member
computes the same owner for every queue from the same lists, and when a consumer joins or leaves
only the queues it wins or held move (about 1/n of them), with no ring and no virtual nodes.

- ``RENDEZVOUS`` takes one parameter, ``salt`` (default ""): two groups with different salts
  spread the same queues differently.
- ``RENDEZVOUS_PER_GROUP`` salts with the consumer group's name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from plugmq.core import (
    AllocateStrategy,
    AllocateStrategyFactory,
    AllocationCapabilities,
    Family,
    MessageQueue,
    PluginDeclaration,
    hookimpl,
)
from plugmq.core.errors import AllocationError

__all__ = ["Rendezvous", "plugmq_allocate_strategies", "plugmq_declare", "rendezvous", "rendezvous_per_group"]

CAPABILITIES: Mapping[str, AllocationCapabilities] = {
    "RENDEZVOUS": AllocationCapabilities(example_params={"salt": "conformance"}),
    "RENDEZVOUS_PER_GROUP": AllocationCapabilities(),
}


def _score(salt: str, queue: MessageQueue, consumer_id: str) -> int:
    key = "\x00".join((salt, queue.topic, queue.broker_name, str(queue.queue_id), consumer_id))
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Rendezvous:
    """One strategy instance; ``per_group``: the group's name is the salt."""

    def __init__(self, name: str, salt: str = "", *, per_group: bool = False) -> None:
        if not isinstance(salt, str):
            raise AllocationError(f"{name}: salt must be a string, got {type(salt).__name__}")
        self.name = name
        self.capabilities = CAPABILITIES[name]
        self._salt = salt
        self._per_group = per_group

    def owner(self, consumer_group: str, queue: MessageQueue, consumer_ids: Sequence[str]) -> str:
        """The consumer with the highest score for ``queue`` (ties: the larger id)."""
        salt = consumer_group if self._per_group else self._salt
        return max(consumer_ids, key=lambda cid: (_score(salt, queue, cid), cid))

    def allocate(self, consumer_group: str, current_id: str, all_queues: Sequence[MessageQueue],
                 all_consumer_ids: Sequence[str]) -> list[MessageQueue]:
        if current_id not in all_consumer_ids:
            return []
        return [queue for queue in all_queues if self.owner(consumer_group, queue, all_consumer_ids) == current_id]


def rendezvous(salt: str = "") -> AllocateStrategy:
    return Rendezvous("RENDEZVOUS", salt)


def rendezvous_per_group() -> AllocateStrategy:
    return Rendezvous("RENDEZVOUS_PER_GROUP", per_group=True)


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name="rendezvous",
        families={Family.ALLOCATION},
        description="rendezvous (highest random weight) hashing: RENDEZVOUS, RENDEZVOUS_PER_GROUP",
        capabilities=dict(CAPABILITIES),
    )


@hookimpl
def plugmq_allocate_strategies() -> Mapping[str, AllocateStrategyFactory]:
    return {"RENDEZVOUS": rendezvous, "RENDEZVOUS_PER_GROUP": rendezvous_per_group}
