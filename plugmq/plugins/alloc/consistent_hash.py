"""CONSISTENT_HASH: RocketMQ's AllocateMessageQueueConsistentHash over its ConsistentHashRouter."""

from __future__ import annotations

import bisect
import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import attrs

from plugmq.core import MessageQueue
from plugmq.core.errors import AllocationError
from plugmq.plugins.alloc._common import CheckedStrategy, Round, take_params

HashFunction = Callable[[str], int]

DEFAULT_VIRTUAL_NODES = 10
# Queue keys are hashed once per strategy object; a long-lived consumer sees the same queues
# every rebalance. The bound only keeps a pathological caller from growing it forever.
_QUEUE_HASH_CACHE_LIMIT = 200_000


_FIRST_U32 = struct.Struct(">I").unpack_from


def md5_hash(key: str) -> int:
    """RocketMQ's default ``MD5Hash``: first 4 digest bytes, big-endian, as an unsigned 32-bit.

    Java's ``getBytes()`` turns a lone surrogate into "?", which is what "replace" does here.
    """
    return _FIRST_U32(hashlib.md5(key.encode("utf-8", "replace")).digest())[0]


def _checked(hash_function: HashFunction, key: str) -> int:
    h = hash_function(key)
    if isinstance(h, bool) or not isinstance(h, int):
        raise AllocationError(f"CONSISTENT_HASH hash_function must return an int, got {h!r} for {key!r}")
    return h


@attrs.frozen
class Ring:
    """The sorted ring: ``hashes[i]`` is owned by ``owners[i]``. A key belongs to the owner of
    the first entry with hash >= the key's hash, wrapping to the smallest (``allocate``)."""

    hashes: list[int]
    owners: list[str]


def build_ring(consumer_ids: Sequence[str], virtual_nodes: int, hash_function: HashFunction) -> Ring:
    """Virtual nodes ``f"{cid}-{r}"`` added in list order; on a hash collision the later entry wins.

    Like RocketMQ's ``addNode``, a node's replica numbers continue from the entries it already
    owns on the ring, so an id listed twice gets r = v..2v-1 the second time (fewer if one of
    its entries was overwritten by a collision, since RocketMQ counts the ring, not the calls).
    """
    ring: dict[int, str] = {}
    owned: dict[str, int] = {}
    trusted = hash_function is md5_hash
    for cid in consumer_ids:
        existing = owned.get(cid, 0)
        for r in range(existing, existing + virtual_nodes):
            h = hash_function(f"{cid}-{r}") if trusted else _checked(hash_function, f"{cid}-{r}")
            previous = ring.get(h)
            if previous is not None:
                owned[previous] -= 1
            ring[h] = cid
            owned[cid] = owned.get(cid, 0) + 1
    hashes = sorted(ring)
    return Ring(hashes, [ring[h] for h in hashes])


@attrs.define(eq=False)
class ConsistentHash(CheckedStrategy):
    """Consumers as nodes with virtual nodes on an MD5 ring; a queue goes to the next node clockwise.

    The ring depends only on the consumer list, so it is cached for the last list seen: every
    consumer of a process, and every rebalance until membership changes, reuses it.
    """

    name: ClassVar[str] = "CONSISTENT_HASH"

    virtual_nodes: int = DEFAULT_VIRTUAL_NODES
    hash_function: HashFunction = md5_hash
    _ring_cache: tuple[tuple[str, ...], Ring] | None = attrs.field(default=None, init=False, repr=False)
    _queue_hashes: dict[MessageQueue, int] = attrs.field(factory=dict, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if isinstance(self.virtual_nodes, bool) or not isinstance(self.virtual_nodes, int):
            raise AllocationError(
                f"CONSISTENT_HASH parameter virtual_nodes must be an int, got {self.virtual_nodes!r}"
            )
        if self.virtual_nodes < 0:
            raise AllocationError(f"illegal virtualNodeCnt :{self.virtual_nodes}")
        if not callable(self.hash_function):
            raise AllocationError(
                "CONSISTENT_HASH parameter hash_function must be a callable(str) -> int, "
                f"got {self.hash_function!r}"
            )

    def _ring(self, consumer_ids: Sequence[str]) -> Ring:
        key = tuple(consumer_ids)
        cached = self._ring_cache  # one read: another thread may replace it meanwhile
        if cached is not None and cached[0] == key:
            return cached[1]
        ring = build_ring(key, self.virtual_nodes, self.hash_function)
        self._ring_cache = (key, ring)
        return ring

    def _queue_hashes_of(self, queues: Sequence[MessageQueue]) -> list[int]:
        cache = self._queue_hashes
        if len(cache) + len(queues) > _QUEUE_HASH_CACHE_LIMIT:
            cache.clear()
        function = self.hash_function
        trusted = function is md5_hash  # a custom function's results are checked once each
        result = []
        for queue in queues:
            h = cache.get(queue)
            if h is None:
                h = function(str(queue)) if trusted else _checked(function, str(queue))
                cache[queue] = h
            result.append(h)
        return result

    def share(self, round_: Round) -> list[MessageQueue]:
        ring = self._ring(round_.consumer_ids)
        if not ring.hashes:
            return []
        # Ring.route inlined: this loop runs once per queue, 10,000 times on a big topic.
        ring_hashes, owners, size, first_at_or_after = ring.hashes, ring.owners, len(ring.hashes), bisect.bisect_left
        result = []
        current_id = round_.current_id
        for queue, h in zip(round_.queues, self._queue_hashes_of(round_.queues)):
            i = first_at_or_after(ring_hashes, h)
            if owners[i if i < size else 0] == current_id:
                result.append(queue)
        return result


def make_consistent_hash(**params: Any) -> ConsistentHash:
    p = take_params(
        ConsistentHash.name, params, {"virtual_nodes": DEFAULT_VIRTUAL_NODES, "hash_function": None}
    )
    hash_function = p["hash_function"] if p["hash_function"] is not None else md5_hash
    return ConsistentHash(virtual_nodes=p["virtual_nodes"], hash_function=hash_function)
