"""Allocation sweep: balance and churn of every strategy for every (queues, consumers) pair.

Spark generates the consumer counts (``spark.range``); each task computes, for its consumer
counts and every queue count up to the maximum, the whole assignment of each strategy with numpy
(all queue counts at once), then one consumer joining the group, and emits one row per
(strategy, queues, consumers). Spark SQL aggregates the rows.

The numpy assignment follows the plugin's definition (AVG blocks, AVG_BY_CIRCLE round robin,
CONSISTENT_HASH: MD5 ring with virtual nodes, next node clockwise). It is not trusted blindly:
every task re-computes sampled pairs with the installed strategy itself (one ``allocate`` call
per consumer, the way a rebalance does) and reports any difference; the driver refuses the sweep
if one is found.

Group of c consumers: ids ``c00000, c00010, ...`` (member k is ``f"c{k:04d}0"``); the joiner is
``f"c{m:04d}5"`` with m = (c - 1) // 2, so it sorts into the middle of the group, where a join
costs block strategies most (a join at the end of the sorted list would flatter them).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from plugmq.core.message import MessageQueue
from plugmq.core.rebalance_order import rocketmq_sorted
from plugmq.spark.experiments import SweepSpec

__all__ = ["PAIR_SCHEMA", "SweepModel", "run_sweep", "sweep_partition"]

PAIR_SCHEMA = ("strategy string, queues int, consumers int, max_per_consumer int, min_per_consumer int, "
               "imbalance double, overload double, spread int, idle_consumers int, moved_on_join int, moved_fraction double, "
               "moved_over_ideal double, verified boolean, mismatch string")

TOPIC = "SweepTopic"
BROKER = "broker-a"
_VERIFY_EVERY = 100


def member_id(k: int) -> str:
    return f"c{k:04d}0"


def joiner_id(c: int) -> str:
    return f"c{(c - 1) // 2:04d}5"


def _md5_u32(key: str) -> int:
    return struct.unpack_from(">I", hashlib.md5(key.encode("utf-8")).digest())[0]


class SweepModel:
    """Owner matrices ``O[q - 1, p]`` (consumer identity owning queue p when there are q queues;
    -1 where p >= q) for a group of c members, and for that group after the joiner arrived.

    Identities: member k is k; the joiner is ``c`` (one past the members)."""

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        q = spec.max_queues
        self.positions = np.arange(q, dtype=np.int64)
        self.queue_counts = np.arange(1, q + 1, dtype=np.int64)[:, None]
        self.valid = self.positions[None, :] < self.queue_counts
        self._queue_hashes: np.ndarray | None = None
        self._member_hashes: dict[int, np.ndarray] = {}

    # ---------------------------------------------------------------------------- orderings
    def order(self, c: int, *, joined: bool) -> np.ndarray:
        """Identity at each sorted position of the group."""
        members = np.arange(c, dtype=np.int64)
        if not joined:
            return members
        m = (c - 1) // 2
        return np.concatenate([members[: m + 1], [c], members[m + 1:]])

    def _positional(self, strategy: str, n: int) -> np.ndarray:
        """Sorted-position owner of every (q, p) for a group of n consumers (-1 where p >= q)."""
        q, p = self.queue_counts, self.positions[None, :]
        if strategy == "AVG_BY_CIRCLE":
            owner = p % n
        elif strategy == "AVG":
            size = q // n
            mod = q % n
            boundary = mod * (size + 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                block = np.where(p < boundary, p // (size + 1), mod + (p - boundary) // np.maximum(size, 1))
            owner = np.where(q <= n, p, block)
        else:
            raise ValueError(f"no positional model for {strategy}")
        return np.where(self.valid, owner, -1)

    def owners(self, strategy: str, c: int, *, joined: bool) -> np.ndarray:
        order = self.order(c, joined=joined)
        if strategy == "CONSISTENT_HASH":
            flat = self._ring_owners(order, c)
            return np.where(self.valid, flat[None, :], -1)
        positional = self._positional(strategy, len(order))
        return np.where(positional >= 0, order[np.maximum(positional, 0)], -1)

    # ---------------------------------------------------------------------------- consistent hash
    def queue_hashes(self) -> np.ndarray:
        if self._queue_hashes is None:
            self._queue_hashes = np.array(
                [_md5_u32(str(MessageQueue(TOPIC, BROKER, i))) for i in range(self.spec.max_queues)], dtype=np.int64)
        return self._queue_hashes

    def _node_hashes(self, identity: int, c: int) -> np.ndarray:
        key = identity if identity < c else -c - 1  # the joiner's id depends on c
        cached = self._member_hashes.get(key)
        if cached is None:
            cid = member_id(identity) if identity < c else joiner_id(c)
            cached = np.array([_md5_u32(f"{cid}-{r}") for r in range(self.spec.virtual_nodes)], dtype=np.int64)
            if identity < c:
                self._member_hashes[key] = cached
        return cached

    def _ring_owners(self, order: np.ndarray, c: int) -> np.ndarray:
        """Owner identity of each queue (all ``max_queues``) on the ring of ``order``'s members.

        Nodes are inserted in sorted-id order and a later node replaces an earlier one with the
        same hash (RocketMQ's TreeMap.put), hence the "last occurrence wins" de-duplication.
        """
        hashes = np.concatenate([self._node_hashes(int(i), c) for i in order])
        owners = np.repeat(order, self.spec.virtual_nodes)
        reversed_unique, first_in_reversed = np.unique(hashes[::-1], return_index=True)
        ring_owner = owners[::-1][first_in_reversed]
        slot = np.searchsorted(reversed_unique, self.queue_hashes(), side="left")
        slot[slot == len(reversed_unique)] = 0
        return ring_owner[slot]


def _pair_rows(model: SweepModel, strategy: str, c: int) -> pd.DataFrame:
    before = model.owners(strategy, c, joined=False)
    after = model.owners(strategy, c, joined=True)
    q_max = model.spec.max_queues
    valid = model.valid
    # counts[q, k]: queues of member k when there are q queues (bincount over row-offset owners).
    rows = np.nonzero(valid)[0]
    flat = rows * c + before[valid]
    counts = np.bincount(flat, minlength=q_max * c).reshape(q_max, c)
    high = counts.max(axis=1)
    low = counts.min(axis=1)
    moved = ((before != after) & valid).sum(axis=1)
    queues = np.arange(1, q_max + 1)
    ideal = queues // (c + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        imbalance = np.where(low > 0, high / np.maximum(low, 1), np.nan)
        over_ideal = np.where(ideal > 0, moved / np.maximum(ideal, 1), np.nan)
    return pd.DataFrame({
        "strategy": strategy, "queues": queues.astype(np.int32), "consumers": np.int32(c),
        "max_per_consumer": high.astype(np.int32), "min_per_consumer": low.astype(np.int32),
        # overload: the busiest member's queues over the fair share ceil(q / c); defined even when
        # some member gets nothing (where max/min is not).
        "imbalance": imbalance, "overload": high / -(-queues // c), "spread": (high - low).astype(np.int32),
        "idle_consumers": (counts == 0).sum(axis=1).astype(np.int32), "moved_on_join": moved.astype(np.int32),
        "moved_fraction": moved / queues, "moved_over_ideal": over_ideal, "verified": False, "mismatch": None,
    })


def _plugin_owners(factories: dict[str, Any], strategy: str, params: dict[str, Any], q: int,
                   ids: list[str]) -> dict[int, str]:
    queues, sorted_ids = rocketmq_sorted([MessageQueue(TOPIC, BROKER, i) for i in range(q)], ids)
    if sorted_ids != ids:
        raise AssertionError(f"sweep ids are not in RocketMQ order: {ids[:5]}...")
    strategy_object = factories[strategy](**params)
    owners: dict[int, str] = {}
    for cid in ids:
        for queue in strategy_object.allocate("sweep", cid, queues, ids):
            owners[queue.queue_id] = cid
    return owners


def _verify(model: SweepModel, factories: dict[str, Any], strategy: str, c: int, frame: pd.DataFrame) -> None:
    """Recompute sampled pairs with the installed plugin; mark the rows checked and any mismatch."""
    q_max = model.spec.max_queues
    params = {"virtual_nodes": model.spec.virtual_nodes} if strategy == "CONSISTENT_HASH" else {}
    for q in sorted({min(c, q_max), (c * 7919) % q_max + 1}):
        problems = []
        for joined in (False, True):
            order = model.order(c, joined=joined)
            names = [member_id(int(i)) if i < c else joiner_id(c) for i in order]
            expected = _plugin_owners(factories, strategy, params, q, names)
            mine = model.owners(strategy, c, joined=joined)[q - 1, :q]
            got = {p: (member_id(int(i)) if i < c else joiner_id(c)) for p, i in enumerate(mine)}
            if got != expected:
                diff = sorted(p for p in range(q) if got.get(p) != expected.get(p))[:5]
                problems.append(f"joined={joined} queues {diff}: model {[got.get(p) for p in diff]} "
                                f"plugin {[expected.get(p) for p in diff]}")
        frame.loc[q - 1, "verified"] = True
        if problems:
            frame.loc[q - 1, "mismatch"] = "; ".join(problems)


def sweep_partition(spec: SweepSpec, consumer_counts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """mapInPandas body: rows for every strategy x queue count, for each consumer count given."""
    from plugmq.core.pluginmanager import installed_allocate_strategies

    factories = installed_allocate_strategies()
    model = SweepModel(spec)
    for batch in consumer_counts:
        for c in batch["id"].tolist():
            c = int(c)
            frames = []
            for strategy in spec.strategies:
                frame = _pair_rows(model, strategy, c)
                if c in (1, 2, 3, spec.max_consumers) or c % _VERIFY_EVERY == 7:
                    _verify(model, factories, strategy, c, frame)
                frames.append(frame)
            yield pd.concat(frames, ignore_index=True)


def run_sweep(spark: Any, spec: SweepSpec, *, partitions: int | None = None) -> dict[str, pd.DataFrame]:
    """Run the sweep on ``spark``; returns the aggregated tables (summary, grid, by_consumers)."""
    from plugmq.core.errors import AllocationError

    n = spec.max_consumers
    parts = partitions or max(1, min(n, spark.sparkContext.defaultParallelism * 4))
    pairs = (spark.range(1, n + 1, 1, parts)
             .mapInPandas(lambda it: sweep_partition(spec, it), PAIR_SCHEMA)
             .cache())
    pairs.createOrReplaceTempView("sweep_pairs")
    try:
        bad = spark.sql("SELECT strategy, queues, consumers, mismatch FROM sweep_pairs "
                        "WHERE mismatch IS NOT NULL LIMIT 5").toPandas()
        if len(bad):
            raise AllocationError("the allocation sweep's model disagrees with the installed strategy on "
                                  f"{len(bad)}+ sampled pairs, e.g. {bad.to_dict('records')}")
        bin_q = max(1, -(-spec.max_queues // 20))
        bin_c = max(1, -(-n // 20))
        tables = {
            "summary": spark.sql("""
                SELECT strategy,
                       count(*) AS pairs,
                       sum(CAST(verified AS INT)) AS pairs_verified_against_plugin,
                       avg(CASE WHEN queues >= consumers THEN imbalance END) AS mean_imbalance,
                       max(imbalance) AS max_imbalance,
                       avg(overload) AS mean_overload,
                       max(overload) AS max_overload,
                       avg(CASE WHEN spread <= 1 THEN 1.0D ELSE 0.0D END) AS share_balanced,
                       avg(CASE WHEN queues >= consumers THEN CAST(idle_consumers > 0 AS DOUBLE) END)
                           AS share_with_idle_member,
                       avg(moved_fraction) AS mean_moved_fraction,
                       avg(moved_over_ideal) AS mean_moved_over_ideal,
                       -- nearest rank, the one quantile definition (plugmq.kit.histogram), on exact values
                       percentile_disc(0.99) WITHIN GROUP (ORDER BY moved_over_ideal)
                           FILTER (WHERE NOT isnan(moved_over_ideal)) AS p99_moved_over_ideal
                FROM sweep_pairs GROUP BY strategy ORDER BY strategy""").toPandas(),
            "grid": spark.sql(f"""
                SELECT strategy,
                       CAST(ceil(queues / {bin_q}) AS INT) * {bin_q} AS queues_bin,
                       CAST(ceil(consumers / {bin_c}) AS INT) * {bin_c} AS consumers_bin,
                       avg(imbalance) AS mean_imbalance,
                       avg(overload) AS mean_overload,
                       avg(moved_fraction) AS mean_moved_fraction,
                       avg(moved_over_ideal) AS mean_moved_over_ideal
                FROM sweep_pairs GROUP BY 1, 2, 3 ORDER BY 1, 2, 3""").toPandas(),
            "by_consumers": spark.sql("""
                SELECT strategy, consumers,
                       avg(CASE WHEN queues >= consumers THEN imbalance END) AS mean_imbalance,
                       avg(overload) AS mean_overload,
                       avg(CASE WHEN queues > consumers THEN moved_over_ideal END) AS mean_moved_over_ideal,
                       avg(CASE WHEN queues > consumers THEN moved_fraction END) AS mean_moved_fraction
                FROM sweep_pairs GROUP BY strategy, consumers ORDER BY strategy, consumers""").toPandas(),
        }
    finally:
        pairs.unpersist()
    return tables
