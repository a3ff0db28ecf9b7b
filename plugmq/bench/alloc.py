"""``plugmq bench alloc``: speed and churn of every installed allocation strategy.

Per strategy, on Q queues x C consumers (default 10,000 x 1,000):

* per-consumer call: one consumer computing its own share, as it does in a rebalance. "cold" uses
  a new strategy object (nothing cached: what a rebalance after a membership change costs),
  "warm" reuses one that has seen the same consumer list (CONSISTENT_HASH keeps its ring);
* all consumers: every member's share in turn, i.e. the whole assignment, with one object;
* churn: the fraction of queues whose owner changes when one consumer joins, and when one leaves
  (for CONSISTENT_HASH about 1/C is the ideal).

Baseline, measured in the same run: a plain Python loop copying the queue list
(``[q for q in queues]``), per call and C times for "all consumers". Ratios are strategy / baseline.
"""

from __future__ import annotations

import functools
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.core import AllocateStrategy, AllocateStrategyFactory, MessageQueue
from plugmq.core.rebalance_order import rocketmq_sorted

__all__ = ["command"]

GOAL_MS = 100.0
ROOMS = 4
_ROOM_SPLIT = re.compile(r"[-@]")


def _room_of(name: str) -> str:
    # Brokers are "room1@broker-07", consumers "room1-10.0.0.7@4242": the room is the first part.
    return _ROOM_SPLIT.split(name, 1)[0]


def make_inputs(n_queues: int, n_consumers: int) -> tuple[list[MessageQueue], list[str]]:
    """Queues spread over up to 50 brokers in 4 rooms; consumers in 5 rooms (one has no broker)."""
    n_brokers = max(1, min(50, n_queues))
    queues = [
        MessageQueue("BenchTopic", f"room{(i % n_brokers) % ROOMS}@broker-{i % n_brokers:02d}", i // n_brokers)
        for i in range(n_queues)
    ]
    ids = [f"room{k % (ROOMS + 1)}-10.0.{k // 250}.{k % 250}@{4000 + k}" for k in range(n_consumers)]
    return rocketmq_sorted(queues, ids)


def strategy_cases(queues: Sequence[MessageQueue]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, strategy name, params) of every configuration measured."""
    return [
        ("AVG", "AVG", {}),
        ("AVG_BY_CIRCLE", "AVG_BY_CIRCLE", {}),
        ("CONSISTENT_HASH", "CONSISTENT_HASH", {}),
        ("MACHINE_ROOM_NEARBY", "MACHINE_ROOM_NEARBY", {"inner": "AVG", "resolver": _room_of}),
        ("MACHINE_ROOM", "MACHINE_ROOM", {"rooms": ["room0", "room1", "room2"]}),
        ("CONFIG", "CONFIG", {"message_queues": list(queues[:10])}),
    ]


Clock = Callable[[], float]


def _seconds(clock: Clock, fn: Callable[[], object]) -> float:
    start = clock()
    fn()
    return clock() - start


def _owners(
    strategy: AllocateStrategy, queues: list[MessageQueue], ids: list[str]
) -> dict[MessageQueue, frozenset[str]]:
    owners: dict[MessageQueue, set[str]] = {}
    for cid in dict.fromkeys(ids):
        for q in strategy.allocate("bench", cid, queues, ids):
            owners.setdefault(q, set()).add(cid)
    return {q: frozenset(o) for q, o in owners.items()}


def _churn(before: dict[MessageQueue, frozenset[str]], after: dict[MessageQueue, frozenset[str]], total: int) -> float:
    moved = sum(1 for q in before.keys() | after.keys() if before.get(q) != after.get(q))
    return moved / total


def measure(
    factory: AllocateStrategyFactory,
    params: dict[str, Any],
    queues: list[MessageQueue],
    ids: list[str],
    samples: int,
    clock: Clock = time.process_time,
) -> dict[str, float]:
    picks = [ids[i * (len(ids) - 1) // max(1, samples - 1)] for i in range(samples)] if len(ids) > 1 else ids
    def fresh(cid: str) -> object:
        return factory(**params).allocate("bench", cid, queues, ids)

    cold = statistics.median(_seconds(clock, functools.partial(fresh, cid)) for cid in picks)
    shared = factory(**params)
    shared.allocate("bench", ids[0], queues, ids)
    warm = statistics.median(
        _seconds(clock, functools.partial(shared.allocate, "bench", cid, queues, ids)) for cid in picks
    )

    strategy = factory(**params)
    owners: dict[MessageQueue, frozenset[str]] = {}
    everyone = _seconds(clock, lambda: owners.update(_owners(strategy, queues, ids)))

    joined_q, joined = rocketmq_sorted(queues, [*ids, "room0-10.9.9.9@9999"])
    leaving = ids[len(ids) // 2]
    left_q, left = rocketmq_sorted(queues, [c for c in ids if c != leaving])
    join = _churn(owners, _owners(factory(**params), joined_q, joined), len(queues))
    leave = _churn(owners, _owners(factory(**params), left_q, left), len(queues)) if left else float("nan")
    return {"cold": cold, "warm": warm, "all": everyone, "join": join, "leave": leave}


def baseline(
    queues: list[MessageQueue], ids: list[str], samples: int, clock: Clock = time.process_time
) -> dict[str, float]:
    def copy() -> list[MessageQueue]:
        return list(queues)

    per_call = statistics.median(_seconds(clock, copy) for _ in range(max(samples, 5)))
    everyone = _seconds(clock, lambda: [copy() for _ in ids])
    return {"call": per_call, "all": everyone}


@click.command("alloc")
@click.option("--queues", "n_queues", default=10_000, show_default=True, type=click.IntRange(1),
              help="Number of queues.")
@click.option("--consumers", "n_consumers", default=1_000, show_default=True, type=click.IntRange(1),
              help="Number of consumers in the group.")
@click.option("--samples", default=15, show_default=True, type=click.IntRange(1),
              help="Consumers sampled for the per-call timings (median reported).")
@click.option("--strategy", "only", multiple=True, help="Measure only these strategy names (repeatable).")
@click.option("--wall", is_flag=True, help="Time with the wall clock instead of the process's CPU time.")
def command(n_queues: int, n_consumers: int, samples: int, only: tuple[str, ...], wall: bool) -> None:
    """Time each allocation strategy and measure its churn when one consumer joins or leaves."""
    from plugmq.core.pluginmanager import installed_allocate_strategies

    # CPU time of this process by default: the strategies are single-threaded pure Python, so on
    # an idle machine it equals wall time, and on a shared one it leaves out time spent waiting.
    clock: Clock = time.perf_counter if wall else time.process_time

    strategies = installed_allocate_strategies()
    queues, ids = make_inputs(n_queues, n_consumers)
    base = baseline(queues, ids, samples, clock)
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # a file or pipe: do not squeeze the table to 80 columns
    table = Table(title=f"allocation: {n_queues:,} queues x {n_consumers:,} consumers")
    for column in ("strategy", "call cold ms", "call warm ms", "x base", "all consumers s", "x base",
                   "churn join", "churn leave", f"call < {GOAL_MS:.0f} ms"):
        if column == "strategy":
            table.add_column(column, no_wrap=True, min_width=len("MACHINE_ROOM_NEARBY"))
        else:
            table.add_column(column, justify="right")
    for label, name, params in strategy_cases(queues):
        if only and name not in only:
            continue
        if name not in strategies:
            table.add_row(label, *["-"] * 7, "not installed")
            continue
        m = measure(strategies[name], params, queues, ids, samples, clock)
        table.add_row(
            label,
            f"{m['cold'] * 1e3:.3f}",
            f"{m['warm'] * 1e3:.3f}",
            f"{m['cold'] / base['call']:.1f}",
            f"{m['all']:.3f}",
            f"{m['all'] / base['all']:.1f}",
            f"{m['join']:.4f}",
            f"{m['leave']:.4f}",
            "yes" if max(m["cold"], m["warm"]) * 1e3 < GOAL_MS else "NO",
        )
    console.print(table)
    console.print(
        f"baseline (plain loop copying the queue list): {base['call'] * 1e3:.3f} ms per call, "
        f"{base['all']:.3f} s for {n_consumers:,} calls. 1/n = {1 / n_consumers:.4f}. "
        f"Times: {'wall clock' if wall else 'CPU time of this process'}. "
        "cold = new strategy object; warm = object reused with the same consumer list. "
        "CONSISTENT_HASH: 10 virtual nodes, MD5. MACHINE_ROOM_NEARBY: inner AVG, room = name up to the "
        "first '-' or '@'. MACHINE_ROOM: rooms room0-room2 of 4. CONFIG: 10 configured queues.",
        style="dim",
    )
