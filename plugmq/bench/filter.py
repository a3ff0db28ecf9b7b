"""``plugmq bench filter``: compiled SQL92 vs a tree-walking interpreter, vectorised tag pre-check
vs a per-entry loop, and the multi-tag pre-check's false-positive rate.

Every speed is measured in the same run as its baseline and reported as a ratio. The baseline is
filter_sql's reference evaluator (:mod:`plugmq.plugins.filter_sql.interpreter`): the "obvious"
implementation (recursive walk over the parsed tree, conversions chosen per message) that
compiling to closures must beat.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import click
import numpy as np
from rich.console import Console
from rich.table import Table

from plugmq.core import tags_code
from plugmq.core.hashing import java_string_hash
from plugmq.measure.probes import LoadWindow
from plugmq.plugins.filter_sql import COMPILER as SQL_COMPILER
from plugmq.plugins.filter_sql.interpreter import interpret
from plugmq.plugins.filter_tag import COMPILER as TAG_COMPILER
from plugmq.plugins.filter_tag import encode_block

__all__ = ["FalsePositiveResult", "command", "multi_tag_false_positive_rate"]

SQL_EXPRESSION = "a > 5 AND b IN ('x','y') AND c IS NOT NULL"

# ------------------------------------------------------------------ workloads


def _sql_messages(count: int, rng: random.Random, a_values: int = 11) -> list[dict[str, str]]:
    """Messages for the SQL92 expression; property ``a`` takes ``a_values`` distinct values."""
    messages = []
    for _ in range(count):
        props: dict[str, str] = {"a": str(rng.randrange(a_values)), "b": rng.choice("xyzw"), "k": "v" * rng.randint(1, 8)}
        if rng.random() < 0.8:
            props["c"] = str(rng.randint(0, 100))
        messages.append(props)
    return messages


def _rates(runs: Sequence[Callable[[], Any]], items: int, repeat: int) -> list[tuple[float, Any]]:
    """Best items/s of each run over ``repeat`` rounds, and its last result.

    Rounds interleave the implementations, so a burst of load on a shared machine hurts the
    baseline and the contender alike and the ratio stays meaningful.
    """
    best = [0.0] * len(runs)
    results: list[Any] = [None] * len(runs)
    for _ in range(repeat):
        for i, run in enumerate(runs):
            start = time.perf_counter()
            results[i] = run()
            elapsed = time.perf_counter() - start
            best[i] = max(best[i], items / elapsed if elapsed > 0 else float("inf"))
    return list(zip(best, results))


def _bench_sql(evaluations: int, repeat: int, rng: random.Random, *, distinct: int = 1000,
               a_values: int = 11) -> list[tuple[str, float, str]]:
    """Evaluations/s of the compiled filter and of the interpreter over ``distinct`` messages
    (repeated up to ``evaluations``) whose property ``a`` takes ``a_values`` values."""
    flt = SQL_COMPILER.compile(SQL_EXPRESSION)
    tree = flt.tree
    messages = _sql_messages(distinct, rng, a_values)
    batch = (messages * (evaluations // len(messages) + 1))[:evaluations]
    mismatches = sum(flt.evaluate(m) is not interpret(tree, m) for m in messages)
    if mismatches:
        raise click.ClickException(f"baseline and compiled filter disagree on {mismatches} messages")
    evaluate, matches = flt.evaluate, flt.matches

    def compiled() -> None:
        for props in batch:
            evaluate(props)

    def compiled_matches() -> None:
        for props in batch:
            matches(props)

    def baseline() -> None:
        for props in batch:
            interpret(tree, props)

    (base, _), (fast, _), (fast_matches, _) = _rates([baseline, compiled, compiled_matches], len(batch), repeat)
    return [
        ("tree-walking interpreter (baseline)", base, "1.0x"),
        ("compiled (closures + generated code): evaluate()", fast, f"{fast / base:.1f}x"),
        ("compiled (closures + generated code): matches()", fast_matches, f"{fast_matches / base:.1f}x"),
    ]


def _tag_block(entries: int, rng: random.Random) -> tuple[bytes, int]:
    others = [f"tag-{i:03d}" for i in range(99)]
    tags = ["TagA" if rng.random() < 0.01 else rng.choice(others) for _ in range(entries)]
    codes = {t: java_string_hash(t) for t in set(tags)}
    block = encode_block((i * 256, 256, codes[t]) for i, t in enumerate(tags))
    return block, sum(t == "TagA" for t in tags)


def _bench_tags(entries: int, repeat: int, rng: random.Random) -> tuple[list[tuple[str, float, str]], str]:
    flt = TAG_COMPILER.compile("TagA")
    raw, exact = _tag_block(entries, rng)
    (wanted,) = flt.codes
    unpack = struct.Struct(">q").unpack_from

    def per_entry() -> int:
        passed = 0
        for offset in range(12, len(raw), 20):
            if unpack(raw, offset)[0] & wanted == wanted:
                passed += 1
        return passed

    def vectorised() -> int:
        return int(flt.precheck_block(raw).sum())

    (base, base_passed), (fast, passed) = _rates([per_entry, vectorised], entries, repeat)
    if base_passed != passed:
        raise click.ClickException(f"vectorised pre-check passed {passed} entries, the loop {base_passed}")
    note = (f"{entries:,} entries, {exact:,} tagged TagA ({exact / entries:.2%}); pre-check passed {passed:,} "
            f"({passed - exact:,} false positives for the client's exact check)")
    return [
        ("per-entry Python loop (baseline)", base, "1.0x"),
        ("numpy over raw 20-byte entries", fast, f"{fast / base:.1f}x"),
    ], note


@attrs.frozen
class FalsePositiveResult:
    tags_per_message: int
    messages: int
    exact_matches: int
    precheck_passed: int
    false_positives: int

    @property
    def rate(self) -> float:
        """False positives among the messages the exact check rejects."""
        rejected = self.messages - self.exact_matches
        return self.false_positives / rejected if rejected else 0.0


def tag_vocabulary(size: int, rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_-0123456789"
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 10))))
    return sorted(words)


def multi_tag_false_positive_rate(
    messages: int, tags_per_message: int, vocabulary: Sequence[str], rng: random.Random, subscriptions: int = 20
) -> FalsePositiveResult:
    """How often the OR-ed hash pre-check lets through a message the exact check rejects.

    Each message carries ``tags_per_message`` distinct tags from ``vocabulary``; its consume-queue
    code is core ``tags_code`` (the OR of the tags' Java hashes). Single-tag subscriptions are
    drawn from the vocabulary; every (subscription, message) pair counts once.
    """
    subs = [TAG_COMPILER.compile(t) for t in rng.sample(list(vocabulary), min(subscriptions, len(vocabulary)))]
    tag_lists = [rng.sample(list(vocabulary), tags_per_message) for _ in range(messages)]
    codes = np.array([tags_code(tags) for tags in tag_lists], dtype=np.int64)
    joined = ["||".join(tags) for tags in tag_lists]
    exact = passed = false_pos = 0
    for flt in subs:
        mask = flt.precheck_many(codes)
        for tags, ok in zip(joined, mask):
            match = flt.matches({}, tags)
            exact += match
            passed += bool(ok)
            false_pos += bool(ok) and not match
    total = messages * len(subs)
    return FalsePositiveResult(tags_per_message, total, exact, passed, false_pos)


# ------------------------------------------------------------------ the command


@click.command("filter")
@click.option("--evaluations", default=100_000, show_default=True, help="SQL92 evaluations per timed run.")
@click.option("--entries", default=1_000_000, show_default=True, help="Consume-queue entries in the tag scan.")
@click.option("--fp-messages", default=5_000, show_default=True, help="Messages per false-positive measurement.")
@click.option("--repeat", default=9, show_default=True, help="Timed rounds per figure (the best is reported).")
@click.option("--seed", default=7, show_default=True)
def command(evaluations: int, entries: int, fp_messages: int, repeat: int, seed: int) -> None:
    """Filter speed (ratios to baselines measured in this run) and tag pre-check false positives."""
    console = Console()
    rng = random.Random(seed)

    load = LoadWindow()
    table = Table(title=f"SQL92: {SQL_EXPRESSION}  ({evaluations:,} evaluations, best of {repeat})",
                  caption="typical: 1,000 messages, a in 0..10 (number conversions mostly remembered); "
                          f"unique: {evaluations:,} messages, every a different (each conversion done afresh)")
    table.add_column("workload")
    table.add_column("implementation")
    table.add_column("evaluations/s", justify="right")
    table.add_column("vs baseline", justify="right")
    for name, rate, ratio in _bench_sql(evaluations, repeat, rng):
        table.add_row("typical", name, f"{rate:,.0f}", ratio)
    for name, rate, ratio in _bench_sql(evaluations, repeat, rng, distinct=evaluations, a_values=10**9):
        table.add_row("unique", name, f"{rate:,.0f}", ratio)
    console.print(table)
    console.print(f"SQL92 runs: {load.finish().text()}; targets: compiled >= 5x the interpreter and >= 500k "
                  "evaluations/s")

    rows, note = _bench_tags(entries, repeat, rng)
    table = Table(title=f"Tag pre-check, subscription 'TagA' (best of {repeat})", caption=note)
    table.add_column("implementation")
    table.add_column("entries/s", justify="right")
    table.add_column("vs baseline", justify="right")
    for name, rate, ratio in rows:
        table.add_row(name, f"{rate:,.0f}", ratio)
    console.print(table)

    vocabulary = tag_vocabulary(200, rng)
    table = Table(title=f"Multi-tag OR-ed hash pre-check: false positives ({len(vocabulary)} random tags, "
                        "20 single-tag subscriptions)")
    for column in ("tags per message", "pairs", "exact matches", "pre-check passed", "false positives",
                   "FP rate"):
        table.add_column(column, justify="right")
    for k in (1, 2, 3, 4, 6):
        result = multi_tag_false_positive_rate(fp_messages, k, vocabulary, rng)
        table.add_row(str(k), f"{result.messages:,}", f"{result.exact_matches:,}", f"{result.precheck_passed:,}",
                      f"{result.false_positives:,}", f"{result.rate:.2%}")
    console.print(table)
    console.print("false-positive rate = messages the pre-check passes but the exact check rejects, "
                  "over all messages the exact check rejects")

