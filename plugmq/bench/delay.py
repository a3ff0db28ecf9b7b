"""``plugmq bench delay``: the delay strategies against a heapq and a Redis sorted-set delay queue.

Sections (every figure from this run; ratios are against the ``heapq`` baseline of the same run):

* **throughput** (virtual clock): insert rate (``schedule`` calls) and dispatch rate (moving a
  ManualClock in 10 ms steps until everything was written back) for ``--messages`` messages due
  within 2 h (levels: a random level 1..18; others: a random time up to 2 h). The write-back is a
  counting sink (``deliver`` and ``deliver_batch``), so the figures are the strategy's own cost
  (delay_level still reads its store). Baselines: ``heapq`` of (deliver time, seq, request)
  with the same sink; Redis: one ``ZADD`` per message (member = id + body), dispatch by
  ``ZRANGEBYSCORE .. LIMIT 1000`` + pipelined ``ZREM``.
* **memory**: RSS growth (``VmRSS`` from /proc/self/status, and ``RssAnon``: the part that is
  not mmap'ed files) of a child process holding ``--pending`` messages pending, due over 30
  days (delay_level cannot: its levels end at 2 h, so it gets random levels), next to heapq (an
  in-memory index of (deliver time, seq, pointer) tuples) in its own child at the same count,
  and Redis ``used_memory`` (member = 20-byte id). Disk bytes too. The clock's due timers run
  every 10,000 schedules (the iterator of delay_schedule moves its message log meanwhile).
  ``--pending 10000000`` is the 10M case (minutes per strategy; run it with
  ``--sections memory``).
* **lateness** (real clock): ``--rate`` messages due per second for ``--seconds`` seconds,
  preloaded under a virtual clock, then dispatched on a wall clock shifted so the first is due
  ``--lead-ms`` (2 s) after start; the write-back appends to a store_mmap (flush async) — with
  one store batch (``append_columns``) where the strategy batches — and a message's lateness is
  (the time its append returned, i.e. it is visible - its deliver time): p50/p99 (nearest rank on
  the shared log histogram, plugmq.kit.histogram), max and how many came early.
* **burst** (real clock): ``--burst`` messages all due within the same second, written back the
  same way; the time from that second's start until the last one is visible.

The heapq baseline on the wall clock is one thread sleeping until its head is due, then writing
everything due (up to 1,000 per store batch) to its own store_mmap; Redis polls every 1 ms
and writes what it removed the same way. Each wall-clock run freezes the collector once it has
started and before its load, as ``plugmq serve`` does (:func:`served_gc`). Durability (``--fsync``
off, the default): everything on the page cache (store_mmap flush=async, every delay plugin with
``fsync`` off — their shared default): a ``kill -9`` loses nothing, a power cut may. ``--fsync``:
store_mmap flush=sync and ``fsync`` on. Redis runs with persistence off (``--save '' --appendonly no``). Bodies are 128 B.
"""

from __future__ import annotations

import array
import contextlib
import gc
import heapq
import inspect
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.bench.redis_peer import RedisServer, redis_missing
from plugmq.broker.components import open_delay_scheduler, open_store
from plugmq.core import AppendRequest, AppendResult, AppendStatus, DelayScheduler, ManualClock, MessageStore, Prop
from plugmq.core.clock import SystemClock, Timer
from plugmq.core.contracts import ColumnAppending, has_capability
from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS
from plugmq.kit import requestcodec
from plugmq.kit.histogram import Histogram
from plugmq.measure.probes import disk_bytes, load_average, status_kib

__all__ = ["command"]

STRATEGIES = ("delay_level", "delay_wheel", "delay_schedule")
T0 = 1_700_000_000_000
HORIZON_MS = 2 * 3_600_000
THIRTY_DAYS_MS = 30 * 86_400_000
BODY = b"b" * 128
TOPIC = "BenchDelay"
STORE = "store_mmap"
BATCH = 1000  # baselines' write-back batch
_OK = AppendResult(AppendStatus.PUT_OK, "0" * 32, 0, 0, 1, 0)
GOALS = {"rss_mb": 100.0, "lateness_p99_ms": 5.0, "burst_s": 5.0}
_BATCHES = "deliver_batch" in inspect.signature(open_delay_scheduler).parameters


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in load_average())


# ----------------------------------------------------------------------------------------------
# opening strategies
# ----------------------------------------------------------------------------------------------


def _options(name: str, fsync: bool, levels: str | None = None) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if name == "delay_level":
        if fsync:
            opts["fsync"] = True
        if levels:
            opts["levels"] = levels
    else:
        opts["fsync"] = fsync
    return opts


def open_bench_store(data_dir: Path, clock: Any, fsync: bool) -> MessageStore:
    return open_store(STORE, data_dir, clock=clock, options={"flush": "sync" if fsync else "async"})


class Opened:
    """A strategy in one directory (and, for delay_level or a real write-back, a store there)."""

    def __init__(self, name: str, data_dir: Path, clock: Any, fsync: bool, *,
                 deliver: Callable[[AppendRequest], AppendResult],
                 deliver_batch: Callable[[Sequence[AppendRequest]], Sequence[AppendResult]] | None = None,
                 store: MessageStore | None = None, levels: str | None = None) -> None:
        self.own_store = store is None and name == "delay_level"
        self.store = open_bench_store(data_dir, clock, fsync) if self.own_store else store
        extra: dict[str, Any] = {"deliver_batch": deliver_batch} if _BATCHES and deliver_batch else {}
        self.scheduler: DelayScheduler = open_delay_scheduler(
            name, data_dir, deliver=deliver, clock=clock, store=self.store, options=_options(name, fsync, levels),
            **extra)

    def close(self) -> None:
        self.scheduler.close()
        if self.own_store and self.store is not None:
            self.store.close()


def _request(i: int, due: int, level: int | None) -> AppendRequest:
    props = {Prop.UNIQ_KEY: f"bench-{i:012d}", Prop.TAGS: "Bench", "due": str(due),
             Prop.DELAY_LEVEL if level is not None else Prop.DELIVER_AT_MS: str(level if level is not None else due)}
    return AppendRequest(TOPIC, i % 4, BODY, properties=props)


def _plan(name: str, n: int, seed: int, span_ms: int) -> Iterator[tuple[int | None, int]]:
    """(level or None, delay ms) per message: levels for delay_level, times for the rest."""
    rng = random.Random(seed)
    levels = [i + 1 for i, ms in enumerate(DEFAULT_DELAY_LEVELS_MS) if ms <= span_ms]
    for _ in range(n):
        if name == "delay_level":
            level = rng.choice(levels)
            yield level, DEFAULT_DELAY_LEVELS_MS[level - 1]
        else:
            yield None, rng.randint(1000, span_ms)


# ----------------------------------------------------------------------------------------------
# throughput on a virtual clock
# ----------------------------------------------------------------------------------------------


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def deliver(self, _request: AppendRequest) -> AppendResult:
        self.n += 1
        return _OK

    def deliver_batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        self.n += len(requests)
        return [_OK] * len(requests)


def throughput(name: str, n: int, workdir: Path, fsync: bool) -> dict[str, float]:
    clock = ManualClock(T0 / 1000)
    sink = _Counter()
    plan = list(_plan(name, n, 1, HORIZON_MS))
    requests = [_request(i, T0 + d, lv) for i, (lv, d) in enumerate(plan)]
    opened = Opened(name, workdir, clock, fsync, deliver=sink.deliver, deliver_batch=sink.deliver_batch)
    try:
        opened.scheduler.start()
        clock.run_due()
        schedule = opened.scheduler.schedule
        start = time.perf_counter()
        for request, (level, delay) in zip(requests, plan, strict=True):
            schedule(request, deliver_at_ms=T0 + delay, delay_level=level)
        insert_s = time.perf_counter() - start
        start = time.perf_counter()
        while clock.now_ms() < T0 + HORIZON_MS + 10_000:
            clock.advance(10)
        dispatch_s = time.perf_counter() - start
    finally:
        opened.close()
    return {"insert_per_s": n / insert_s, "dispatch_per_s": sink.n / dispatch_s, "delivered": sink.n}


def heapq_throughput(n: int) -> dict[str, float]:
    count = 0
    plan = list(_plan("heapq", n, 1, HORIZON_MS))
    requests = [_request(i, T0 + d, None) for i, (_, d) in enumerate(plan)]
    heap: list[tuple[int, int, AppendRequest]] = []
    start = time.perf_counter()
    for seq, (request, (_, delay)) in enumerate(zip(requests, plan, strict=True)):
        heapq.heappush(heap, (T0 + delay, seq, request))
    insert_s = time.perf_counter() - start
    start = time.perf_counter()
    now = T0
    while now < T0 + HORIZON_MS + 10_000:
        now += 10_000
        while heap and heap[0][0] <= now:
            _ = heapq.heappop(heap)[2]
            count += 1
    dispatch_s = time.perf_counter() - start
    return {"insert_per_s": n / insert_s, "dispatch_per_s": count / dispatch_s, "delivered": count}


# ----------------------------------------------------------------------------------------------
# Redis (optional)
# ----------------------------------------------------------------------------------------------


def redis_throughput(server: RedisServer, n: int) -> dict[str, float]:
    client = server.client
    client.delete("delayq")
    plan = list(_plan("redis", n, 1, HORIZON_MS))
    members = [f"bench-{i:012d}".encode() + b"|" + BODY for i in range(n)]
    start = time.perf_counter()
    for member, (_, delay) in zip(members, plan, strict=True):
        client.zadd("delayq", {member: T0 + delay})
    insert_s = time.perf_counter() - start
    count = 0
    start = time.perf_counter()
    now = T0
    while now < T0 + HORIZON_MS + 10_000:
        now += 10_000
        count += len(_redis_take(client, now))
    dispatch_s = time.perf_counter() - start
    return {"insert_per_s": n / insert_s, "dispatch_per_s": count / dispatch_s, "delivered": count}


def _redis_take(client: Any, now_ms: int) -> list[tuple[bytes, float]]:
    """Every member due by ``now_ms`` that this consumer removed (only a removal delivers)."""
    taken: list[tuple[bytes, float]] = []
    while True:
        due = client.zrangebyscore("delayq", 0, now_ms, start=0, num=BATCH, withscores=True)
        if not due:
            return taken
        pipe = client.pipeline(transaction=False)
        for member, _ in due:
            pipe.zrem("delayq", member)
        removed = pipe.execute()
        taken.extend(item for item, gone in zip(due, removed, strict=True) if gone)


# ----------------------------------------------------------------------------------------------
# memory in child processes
# ----------------------------------------------------------------------------------------------


def vm_rss_bytes(field: str = "VmRSS") -> int:
    """A size from /proc/self/status in bytes: VmRSS (all resident pages, mmap'ed files included) or
    RssAnon (heap and other anonymous memory only)."""
    kib = status_kib(field)
    if kib is None:
        raise click.ClickException(f"no {field} in /proc/self/status (Linux only)")
    return kib * 1024


def rss_child(name: str, n: int, workdir: str, fsync: bool) -> None:
    """Entry point of a memory child: print one JSON line with RSS before/after ``n`` pending."""
    data_dir = Path(workdir)
    gc.collect()
    before_open = vm_rss_bytes()
    if name == "heapq":
        rng = random.Random(2)
        before, before_anon = vm_rss_bytes(), vm_rss_bytes("RssAnon")
        heap: list[tuple[int, int, int]] = []
        start = time.perf_counter()
        for seq in range(n):
            heapq.heappush(heap, (T0 + rng.randint(1000, THIRTY_DAYS_MS), seq, seq * 200))
        insert_s = time.perf_counter() - start
        after, after_anon = vm_rss_bytes(), vm_rss_bytes("RssAnon")
        disk = 0
    else:
        clock = ManualClock(T0 / 1000)
        sink = _Counter()
        opened = Opened(name, data_dir, clock, fsync, deliver=sink.deliver, deliver_batch=sink.deliver_batch)
        opened.scheduler.start()
        clock.run_due()
        gc.collect()
        before, before_anon = vm_rss_bytes(), vm_rss_bytes("RssAnon")
        schedule = opened.scheduler.schedule
        start = time.perf_counter()
        for i, (level, delay) in enumerate(_plan(name, n, 2, THIRTY_DAYS_MS)):
            schedule(_request(i, T0 + delay, level), deliver_at_ms=T0 + delay, delay_level=level)
            if i % 10_000 == 9_999:
                clock.run_due()  # what a running broker's clock thread would have done meanwhile
        clock.run_due()
        insert_s = time.perf_counter() - start
        gc.collect()
        after, after_anon = vm_rss_bytes(), vm_rss_bytes("RssAnon")
        pending = opened.scheduler.pending()
        opened.close()
        disk = disk_bytes(data_dir)
        if pending != n:
            raise SystemExit(f"{name}: {pending} pending after {n} schedules")
    print(json.dumps({"before_open": before_open, "before": before, "after": after, "anon_growth": after_anon - before_anon,
                      "insert_s": insert_s, "disk": disk}))


_RSS_CHILD = ("import sys; from plugmq.bench.delay import rss_child; "
              "rss_child(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == '1')")


def measure_rss(name: str, n: int, workdir: Path, fsync: bool) -> dict[str, Any]:
    data_dir = workdir / f"rss-{name}"
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, name, str(n), str(data_dir), "1" if fsync else "0"],
        capture_output=True, text=True,
    )
    shutil.rmtree(data_dir, ignore_errors=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1][:200] if lines else f"exit code {proc.returncode}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"rss_growth_mb": (result["after"] - result["before"]) / 2**20, "rss_mb": result["after"] / 2**20,
            "anon_growth_mb": result["anon_growth"] / 2**20,
            "insert_per_s": n / result["insert_s"], "disk_mb": result["disk"] / 2**20}


def redis_memory(server: RedisServer, n: int) -> dict[str, float | None]:
    client = server.client
    client.delete("delayq")
    base = client.info("memory")["used_memory"]
    rng = random.Random(2)
    start = time.perf_counter()
    for chunk in range(0, n, 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(chunk, min(n, chunk + 10_000)):
            pipe.zadd("delayq", {f"bench-{i:014d}": T0 + rng.randint(1000, THIRTY_DAYS_MS)})
        pipe.execute()
    insert_s = time.perf_counter() - start
    used = client.info("memory")["used_memory"]
    client.delete("delayq")
    return {"rss_growth_mb": (used - base) / 2**20, "anon_growth_mb": None, "insert_per_s": n / insert_s,
            "disk_mb": 0.0}


# ----------------------------------------------------------------------------------------------
# real clock: lateness and burst, written back to a real store
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def served_gc() -> Iterator[None]:
    """The collector as ``plugmq serve`` leaves it under load: what was made while starting is frozen
    (``gc.freeze()``, as serve does once it listens: a full collection no longer walks it); unfrozen
    when the section ends. Every wall-clock run of a section gets it at the same point: its strategy
    or baseline is set up and started, the load (what comes due) is still ahead."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class ShiftedClock(SystemClock):
    """The wall clock moved by ``offset`` seconds: preloaded deliver times come due soon."""

    def __init__(self, offset: float) -> None:
        super().__init__()
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + int(self.offset * 1000)

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Timer:
        return super().call_at(deadline - self.offset, callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return super().call_at(time.time() + delay, callback)


class StoreSink:
    """The write-back on the wall clock: appends to a store (one batch per batch, as the broker's
    write-back does: ``append_columns`` where the store has it, else ``append_batch``) and records
    each message's lateness when its append returned (it is visible from then on)."""

    def __init__(self, store: MessageStore, clock: Any, n: int) -> None:
        self.store = store
        self.clock = clock
        self.late = array.array("q")
        self.n = n
        self.done = threading.Event()
        self.last_ms = 0
        self.batches = 0

    def record(self, dues: Sequence[int]) -> None:
        now = self.clock.now_ms()
        self.late.extend(now - due for due in dues)
        self.last_ms = now
        self.batches += 1
        if len(self.late) >= self.n:
            self.done.set()

    def deliver(self, request: AppendRequest) -> AppendResult:
        result = self.store.append(request)
        self.record([int(request.properties["due"])])
        return result

    def deliver_batch(self, requests: Sequence[AppendRequest]) -> Sequence[AppendResult]:
        store = self.store
        results = store.append_columns(requests) if has_capability(store, ColumnAppending) else store.append_batch(requests)
        self.record([int(r.properties["due"]) for r in requests])
        return results

    def figures(self, first_due: int) -> dict[str, float]:
        """Delivered, early, min, percentiles (plugmq.kit.histogram: nearest rank), max and when the last was visible."""
        if not self.late:
            return {"delivered": 0.0}
        hist = Histogram()
        hist.record_many(self.late)
        return {"delivered": float(hist.count), "min_ms": float(hist.min), "p50_ms": hist.quantile(0.5) or 0.0,
                "p99_ms": hist.quantile(0.99) or 0.0, "max_ms": float(hist.max),
                "early": float(sum(1 for v in self.late if v < 0)), "batches": float(self.batches),
                "all_done_s": (self.last_ms - (first_due // 1000) * 1000) / 1000}


def realtime(name: str, dues: list[int], workdir: Path, fsync: bool, timeout_s: float,
             lead_ms: int = 2000) -> dict[str, float]:
    """Preload ``dues`` (sorted) under a virtual clock, then dispatch them on a shifted wall clock
    into a store_mmap."""
    data_dir = workdir / f"rt-{name}"
    shutil.rmtree(data_dir, ignore_errors=True)
    first, last = dues[0], dues[-1]
    # delay_level gets one level longer than the whole span, so the loading clock moves along
    # with the deliver times and each message keeps its own.
    level_ms = ((last - first) // 1000 + 61) * 1000
    levels = f"{level_ms // 1000}s" if name == "delay_level" else None
    clock = ManualClock((first - level_ms) / 1000)
    store = open_bench_store(data_dir, clock, fsync)
    opened = Opened(name, data_dir, clock, fsync, deliver=lambda r: _OK, store=store, levels=levels)
    for i, due in enumerate(dues):
        if name == "delay_level":
            if due - level_ms > clock.now_ms():
                clock.set((due - level_ms) / 1000)
            at = clock.now_ms() + level_ms
            opened.scheduler.schedule(_request(i, at, 1), deliver_at_ms=at, delay_level=1)
        else:
            opened.scheduler.schedule(_request(i, due, None), deliver_at_ms=due, delay_level=None)
    clock.run_due()
    opened.close()
    store.close()
    wall = ShiftedClock((first - lead_ms) / 1000 - time.time())
    store = open_bench_store(data_dir, wall, fsync)
    sink = StoreSink(store, wall, len(dues))
    opened = Opened(name, data_dir, wall, fsync, deliver=sink.deliver, deliver_batch=sink.deliver_batch, store=store,
                    levels=levels)
    try:
        opened.scheduler.start()
        with served_gc():
            sink.done.wait(timeout_s + (last - first) / 1000 + lead_ms / 1000)
    finally:
        opened.close()
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return sink.figures(first)


def heapq_realtime(dues: list[int], workdir: Path, fsync: bool, timeout_s: float,
                   lead_ms: int = 2000) -> dict[str, float]:
    data_dir = workdir / "rt-heapq"
    shutil.rmtree(data_dir, ignore_errors=True)
    heap = [(due, i, _request(i, due, None)) for i, due in enumerate(dues)]
    heapq.heapify(heap)
    wall = ShiftedClock((dues[0] - lead_ms) / 1000 - time.time())
    store = open_bench_store(data_dir, wall, fsync)
    sink = StoreSink(store, wall, len(dues))
    stop = threading.Event()

    def run() -> None:  # one dispatcher thread sleeping until the head is due, like a DelayQueue
        while heap and not stop.is_set():
            wait = (heap[0][0] - wall.now_ms()) / 1000
            if wait > 0:
                stop.wait(wait)
                continue
            now = wall.now_ms()
            batch: list[AppendRequest] = []
            while heap and heap[0][0] <= now and len(batch) < BATCH:
                batch.append(heapq.heappop(heap)[2])
            sink.deliver_batch(batch)

    thread = threading.Thread(target=run, daemon=True)
    try:
        with served_gc():
            thread.start()
            sink.done.wait(timeout_s + (dues[-1] - dues[0]) / 1000 + lead_ms / 1000)
    finally:
        stop.set()
        thread.join()
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return sink.figures(dues[0])


def redis_realtime(server: RedisServer, dues: list[int], workdir: Path, fsync: bool, timeout_s: float,
                   lead_ms: int = 2000) -> dict[str, float]:
    client = server.client
    client.delete("delayq")
    for chunk in range(0, len(dues), 10_000):
        pipe = client.pipeline(transaction=False)
        for i in range(chunk, min(len(dues), chunk + 10_000)):
            pipe.zadd("delayq", {f"bench-{i:012d}".encode() + b"|" + BODY: dues[i]})
        pipe.execute()
    data_dir = workdir / "rt-redis"
    shutil.rmtree(data_dir, ignore_errors=True)
    wall = ShiftedClock((dues[0] - lead_ms) / 1000 - time.time())
    store = open_bench_store(data_dir, wall, fsync)
    sink = StoreSink(store, wall, len(dues))
    deadline = time.monotonic() + timeout_s + (dues[-1] - dues[0]) / 1000 + lead_ms / 1000
    try:
        with served_gc():
            while not sink.done.is_set() and time.monotonic() < deadline:
                taken = _redis_take(client, wall.now_ms())
                if not taken:
                    time.sleep(0.001)  # the usual poll interval of a sorted-set delay queue
                    continue
                for start in range(0, len(taken), BATCH):
                    requests = []
                    for member, score in taken[start:start + BATCH]:
                        uid, body = member.split(b"|", 1)
                        requests.append(AppendRequest(TOPIC, 0, body, properties={
                            Prop.UNIQ_KEY: uid.decode(), "due": str(int(score))}))
                    sink.deliver_batch(requests)
    finally:
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return sink.figures(dues[0])


# ----------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.3g}x"


@click.command("delay")
@click.option("--strategies", default=",".join(STRATEGIES), show_default=True, help="Comma-separated delay plugins.")
@click.option("--messages", default=20_000, show_default=True, type=click.IntRange(100),
              help="Messages of the throughput section.")
@click.option("--pending", default=1_000_000, show_default=True, type=click.IntRange(100),
              help="Pending messages (due over 30 days) of the memory section; 10000000 for the 10M case.")
@click.option("--rate", default=10_000, show_default=True, type=click.IntRange(1),
              help="Messages due per second in the lateness section.")
@click.option("--seconds", default=5, show_default=True, type=click.IntRange(1), help="Length of the lateness run.")
@click.option("--burst", default=500_000, show_default=True, type=click.IntRange(1),
              help="Messages due in the same second in the burst section.")
@click.option("--sections", default="throughput,memory,lateness,burst", show_default=True,
              help="Comma-separated sections to run.")
@click.option("--lead-ms", default=2000, show_default=True, type=click.IntRange(0),
              help="Wall-clock sections: how long after start the first message is due.")
@click.option("--timeout", default=300, show_default=True, type=click.IntRange(1),
              help="Wall-clock sections: give up this many seconds after the last deliver time.")
@click.option("--fsync/--no-fsync", default=False, show_default=True, help="Durable mode for every strategy.")
@click.option("--redis/--no-redis", "use_redis", default=True, show_default=True,
              help="Measure a Redis sorted-set delay queue when redis-server and the redis package exist.")
@click.option("--smoke", is_flag=True, help="Tiny sizes everywhere (a quick check that every part runs).")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where data goes (default: a temporary directory, removed afterwards).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of tables.")
def command(strategies: str, messages: int, pending: int, rate: int, seconds: int, burst: int, sections: str,
            lead_ms: int, timeout: int, fsync: bool, use_redis: bool, smoke: bool, workdir: Path | None,
            as_json: bool) -> None:
    """Insert/dispatch rates, memory at scale, real-clock lateness and a burst, per delay strategy."""
    if smoke:
        messages, pending, rate, seconds, burst = min(messages, 2000), min(pending, 20_000), min(rate, 1000), 1, min(burst, 5000)
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    wanted = {s.strip() for s in sections.split(",") if s.strip()}
    unknown = wanted - {"throughput", "memory", "lateness", "burst"}
    if unknown:
        raise click.BadParameter(f"unknown sections {sorted(unknown)}", param_hint="--sections")
    console = Console(stderr=as_json, width=None if sys.stdout.isatty() else 150)
    note = redis_missing() if use_redis else "turned off (--no-redis)"
    results: dict[str, Any] = {"settings": {"messages": messages, "pending": pending, "rate": rate, "seconds": seconds,
                                            "burst": burst, "fsync": fsync, "redis": note or "measured",
                                            "batched_write_back": _BATCHES,
                                            "compiled_decoder": requestcodec.native_available()}, "load": {}}
    with _workdir(workdir) as base:
        server = RedisServer(base) if note is None else None
        try:
            run = _Run(console, names, base, fsync, server, results)
            if "throughput" in wanted:
                run.throughput(messages)
            if "memory" in wanted:
                run.memory(pending)
            for section, dues in (("lateness", _steady(rate, seconds)), ("burst", _burst(burst))):
                if section in wanted:
                    run.realtime(section, dues, timeout, lead_ms)
        finally:
            if server is not None:
                server.stop()
    if as_json:
        click.echo(json.dumps(results, indent=2, default=str))
        return
    _print(console, results, names)


class _Run:
    """One bench run's sections: each measures heapq, every strategy and Redis into ``results``."""

    def __init__(self, console: Console, names: list[str], base: Path, fsync: bool, server: RedisServer | None,
                 results: dict[str, Any]) -> None:
        self.console, self.names, self.base, self.fsync = console, names, base, fsync
        self.server, self.results = server, results

    def throughput(self, messages: int) -> None:
        self.console.log(f"throughput: {messages:,} messages (load {_load()})")
        speeds = {"heapq": heapq_throughput(messages)}
        for name in self.names:
            speeds[name] = throughput(name, messages, self.base / f"tp-{name}", self.fsync)
        if self.server is not None:
            speeds["redis"] = redis_throughput(self.server, messages)
        self.results["throughput"] = speeds
        self.results["load"]["throughput"] = _load()

    def memory(self, pending: int) -> None:
        self.console.log(f"memory: {pending:,} pending over 30 days (child processes; load {_load()})")
        rows: dict[str, dict[str, Any]] = {"heapq": measure_rss("heapq", pending, self.base, self.fsync)}
        for name in self.names:
            self.console.log(f"memory: {name}")
            rows[name] = measure_rss(name, pending, self.base, self.fsync)
        if self.server is not None:
            rows["redis"] = redis_memory(self.server, pending)
        self.results["memory"] = rows
        self.results["load"]["memory"] = _load()

    def realtime(self, section: str, dues: list[int], timeout: int, lead_ms: int) -> None:
        self.console.log(f"{section}: {len(dues):,} messages on the wall clock (load {_load()})")
        timing = {"heapq": heapq_realtime(dues, self.base, self.fsync, timeout, lead_ms)}
        for name in self.names:
            self.console.log(f"{section}: {name}")
            timing[name] = realtime(name, dues, self.base, self.fsync, timeout, lead_ms)
        if self.server is not None:
            timing["redis"] = redis_realtime(self.server, dues, self.base, self.fsync, timeout, lead_ms)
        self.results[section] = timing
        self.results["load"][section] = _load()


def _steady(rate: int, seconds: int) -> list[int]:
    n = rate * seconds
    return [T0 + 10_000 + i * 1000 // rate for i in range(n)]


def _burst(n: int) -> list[int]:
    return [T0 + 10_000 + i * 1000 // n for i in range(n)]


class _workdir:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.made: str | None = None

    def __enter__(self) -> Path:
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            return self.path
        self.made = tempfile.mkdtemp(prefix="plugmq-bench-delay-")
        return Path(self.made)

    def __exit__(self, *exc: object) -> None:
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)


def _rows(results: dict[str, Any], section: str, names: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    rows = results.get(section, {})
    for name in ["heapq", *names, "redis"]:
        if name in rows:
            yield name, rows[name]


def _goal(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "MISSED")


def _print(console: Console, results: dict[str, Any], names: list[str]) -> None:
    settings = results["settings"]
    durability = (f"fsync: {STORE} flush=sync, delay plugins fsync=true" if settings["fsync"]
                  else f"page cache ({STORE} flush=async, delay plugins fsync=false: kill -9 safe, not power-cut safe); "
                       "Redis without persistence")
    console.print(f"[bold]plugmq bench delay[/bold] — durability: {durability}; 128 B bodies; write-back batched: "
                  f"{settings['batched_write_back']} (baselines: {BATCH} per store batch); compiled decoder of stored "
                  f"requests: {settings['compiled_decoder']}; Redis: {settings['redis']}")
    load = results["load"]
    if "throughput" in results:
        base = results["throughput"]["heapq"]
        table = Table(title=f"throughput, virtual clock ({settings['messages']:,} messages due within 2 h; "
                            f"load {load['throughput']})")
        for col in ("strategy", "insert/s", "vs heapq", "dispatch/s", "vs heapq", "delivered"):
            table.add_column(col, justify="right")
        for name, row in _rows(results, "throughput", names):
            table.add_row(name, _fmt(row["insert_per_s"]), _ratio(row["insert_per_s"], base["insert_per_s"]),
                          _fmt(row["dispatch_per_s"]), _ratio(row["dispatch_per_s"], base["dispatch_per_s"]),
                          _fmt(row["delivered"]))
        console.print(table)
    if "memory" in results:
        base = results["memory"]["heapq"]
        table = Table(title=f"memory with {settings['pending']:,} pending over 30 days (child processes; goal "
                            f"wheel/schedule <= {GOALS['rss_mb']:.0f} MB at 10M; load {load['memory']})")
        for col in ("strategy", "RSS growth MB", "vs heapq", "anon growth MB", "disk MB", "insert/s", "goal"):
            table.add_column(col, justify="right")
        for name, row in _rows(results, "memory", names):
            if "error" in row:
                table.add_row(name, f"failed: {row['error']}", "-", "-", "-", "-", "-")
                continue
            label = name + (" (levels <= 2 h)" if name == "delay_level" else "") + (" used_memory" if name == "redis" else "")
            ok = row["rss_growth_mb"] <= GOALS["rss_mb"] if name in ("delay_wheel", "delay_schedule") else None
            table.add_row(label, _fmt(row["rss_growth_mb"], 1), _ratio(row["rss_growth_mb"], base.get("rss_growth_mb")),
                          _fmt(row["anon_growth_mb"], 1), _fmt(row["disk_mb"], 1), _fmt(row["insert_per_s"]), _goal(ok))
        console.print(table)
    lateness_title = (f"lateness, wall clock: {settings['rate']:,} due/s for {settings['seconds']} s, visible in {STORE} "
                      f"(goal p99 <= {GOALS['lateness_p99_ms']:.0f} ms, 0 early)")
    burst_title = (f"burst, wall clock: {settings['burst']:,} due in one second, visible in {STORE} "
                   f"(goal all within {GOALS['burst_s']:.0f} s)")
    for section, title in (("lateness", lateness_title), ("burst", burst_title)):
        if section not in results:
            continue
        base = results[section]["heapq"]
        table = Table(title=f"{title}; load {load[section]}")
        for col in ("strategy", "delivered", "early", "p50 ms", "p99 ms", "max ms", "all done after s", "vs heapq",
                    "goal"):
            table.add_column(col, justify="right")
        for name, row in _rows(results, section, names):
            ok = None
            if name in STRATEGIES and row.get("delivered"):
                ok = (row["p99_ms"] <= GOALS["lateness_p99_ms"] and row["early"] == 0 if section == "lateness"
                      else row["all_done_s"] <= GOALS["burst_s"])
            table.add_row(name, _fmt(row.get("delivered")), _fmt(row.get("early")), _fmt(row.get("p50_ms"), 1),
                          _fmt(row.get("p99_ms"), 1), _fmt(row.get("max_ms"), 1), _fmt(row.get("all_done_s"), 2),
                          _ratio(row.get("all_done_s"), base.get("all_done_s")), _goal(ok))
        console.print(table)
