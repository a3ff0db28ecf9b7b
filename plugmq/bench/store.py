"""``plugmq bench store``: append and consume-queue speed of each store, against raw limits.

For each store (store_mmap, store_lmdb, store_rocks by default) and body size (128 B, 1 KiB):

* async flush: single appends (one ``append`` per message, one thread) and batches
  (``append_batch`` of ``--batch`` messages);
* sync flush: single appends from 1 writer thread and from 8 (group commit), and batches;
* consume-queue reads: ``read_queue`` pages of 32 entries over everything the async run wrote.

Raw limits, measured in the same run on the same disk: a plain-Python mmap append loop (a
length + CRC32 header and the body copied into an mmap'ed file; one record per call, and
``--batch`` records joined per call), ``os.write`` + ``os.fsync`` per message, a scan of
20-byte consume-queue entries from an mmap (32 per call) and, when redis-server and the redis
package are installed, Redis LPUSH pipelined ``--batch`` per round trip (loopback TCP,
persistence off). Ratios are store rate / raw rate. Requests carry TAGS and a unique key, as the
broker sends them.

The machine may be shared: each async case runs ``--rounds`` times, alternating with its raw
baseline, and the best round of each is kept (a burst of load then hurts both alike). Every
round writes a fresh store or file, so first-touch page faults count on both sides.

Restart: a child process fills a store_mmap commit log with ``--restart-log-mib`` MiB of
messages, keeps writing and is killed with SIGKILL; the figure is the time to reopen the store
(recovery) and serve a read of the newest message. The same again after a clean stop (SIGTERM:
the child closes the store while writing).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from plugmq.bench.redis_peer import RedisServer, redis_missing
from plugmq.core import AppendRequest, MessageStore, Prop, tags_code
from plugmq.core.contracts import RecoveryReporting
from plugmq.core.message import new_unique_id
from plugmq.measure.probes import LoadWindow

__all__ = ["command"]

DEFAULT_STORES = ("store_mmap", "store_lmdb", "store_rocks")
SIZES = (128, 1024)
TOPIC = "BenchTopic"
QUEUES = 4
CQ_PAGE = 32
SYNC_THREADS = (1, 8)
_RAW_HEADER = struct.Struct(">iI")  # total size, body CRC32: the least a log record carries
_CQ_ENTRY = struct.Struct(">qiq")

#: What each flush mode means for the built-in stores (the durability behind the figures).
DURABILITY = {
    ("store_mmap", "async"): "page cache; background flush every 500 ms",
    ("store_mmap", "sync"): "group commit: msync/fsync before the append returns",
    ("store_lmdb", "async"): "env sync=False; env.sync() every 500 ms",
    ("store_lmdb", "sync"): "env sync=True, metasync=True (fsync per commit)",
    ("store_rocks", "async"): "WriteOptions.sync=False, WAL on; flush_wal(sync) every 500 ms",
    ("store_rocks", "sync"): "WriteOptions.sync=True (WAL fsync per write batch)",
}
#: Targets of the issues, for store_mmap: (case, baseline) -> minimum ratio to that baseline.
TARGETS = {("store_mmap", "single async", "mmap single"): 0.30, ("store_mmap", "batch async", "mmap batched"): 0.40,
           ("store_mmap", "batch async", "redis lpush"): 3.0, ("store_mmap", "single sync x8", "write+fsync"): 5.0}
RESTART_TARGET_S = 2.0


@attrs.frozen
class Row:
    store: str
    case: str
    size: int
    durability: str
    batch: int
    threads: int
    messages: int
    seconds: float
    baseline: str
    baseline_rate: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("inf")

    @property
    def ratio(self) -> float:
        return self.rate / self.baseline_rate if self.baseline_rate else float("nan")

    @property
    def target(self) -> float | None:
        return TARGETS.get((self.store, self.case, self.baseline))

    def as_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out.update(rate=self.rate, ratio=self.ratio, target=self.target,
                   met=None if self.target is None else self.ratio >= self.target)
        return out


def _bodies(size: int, count: int = 256) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def _requests(size: int, count: int = 1000) -> list[AppendRequest]:
    bodies = _bodies(size, 64)
    return [
        AppendRequest(TOPIC, i % QUEUES, bodies[i % len(bodies)], tags_code=tags_code("TagA"),
                      properties={Prop.TAGS: "TagA", Prop.UNIQ_KEY: new_unique_id()})
        for i in range(count)
    ]


# ------------------------------------------------------------------------------------------------
# raw limits
# ------------------------------------------------------------------------------------------------


def _mapped(path: Path, size: int) -> tuple[Any, mmap.mmap]:
    f = open(path, "w+b")  # noqa: SIM115 - closed by the caller with the map
    f.truncate(size)
    return f, mmap.mmap(f.fileno(), size)


def raw_mmap_single(workdir: Path, bodies: Sequence[bytes], n: int) -> float:
    """Seconds for ``n`` calls each appending one record to an mmap'ed file."""
    f, mm = _mapped(workdir / "raw-single", n * (_RAW_HEADER.size + len(bodies[0])) + 4096)
    pos = 0

    def append(body: bytes) -> int:
        nonlocal pos
        record = _RAW_HEADER.pack(_RAW_HEADER.size + len(body), zlib.crc32(body)) + body
        end = pos + len(record)
        mm[pos:end] = record
        pos = end
        return pos

    count = len(bodies)
    start = time.perf_counter()
    for i in range(n):
        append(bodies[i % count])
    elapsed = time.perf_counter() - start
    mm.close()
    f.close()
    return elapsed


def raw_mmap_batched(workdir: Path, bodies: Sequence[bytes], n: int, batch: int) -> float:
    """Seconds for appending ``n`` records, ``batch`` joined per call, to an mmap'ed file."""
    f, mm = _mapped(workdir / "raw-batch", n * (_RAW_HEADER.size + len(bodies[0])) + 4096)
    pos = 0

    def append_many(items: Sequence[bytes]) -> int:
        nonlocal pos
        block = b"".join(_RAW_HEADER.pack(_RAW_HEADER.size + len(b), zlib.crc32(b)) + b for b in items)
        end = pos + len(block)
        mm[pos:end] = block
        pos = end
        return pos

    groups = [[bodies[(i + k) % len(bodies)] for k in range(min(batch, n - i))] for i in range(0, n, batch)]
    start = time.perf_counter()
    for group in groups:
        append_many(group)
    elapsed = time.perf_counter() - start
    mm.close()
    f.close()
    return elapsed


def raw_write_fsync(workdir: Path, bodies: Sequence[bytes], n: int) -> float:
    """Seconds for ``n`` records each written with os.write and made durable with os.fsync."""
    fd = os.open(workdir / "raw-fsync", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count = len(bodies)
    start = time.perf_counter()
    for i in range(n):
        body = bodies[i % count]
        os.write(fd, _RAW_HEADER.pack(_RAW_HEADER.size + len(body), zlib.crc32(body)) + body)
        os.fsync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed


def raw_cq_scan(workdir: Path, n: int) -> float:
    """Seconds to read ``n`` 20-byte consume-queue entries from an mmap, 32 per call."""
    f, mm = _mapped(workdir / "raw-cq", n * _CQ_ENTRY.size + 4096)
    for i in range(n):
        _CQ_ENTRY.pack_into(mm, i * _CQ_ENTRY.size, i * 200, 200, 12345)

    def page(first: int, count: int) -> list[tuple[int, int, int]]:
        return [_CQ_ENTRY.unpack_from(mm, (first + k) * _CQ_ENTRY.size) for k in range(count)]

    start = time.perf_counter()
    offset = 0
    while offset < n:
        offset += len(page(offset, min(CQ_PAGE, n - offset)))
    elapsed = time.perf_counter() - start
    mm.close()
    f.close()
    return elapsed


def raw_redis_lpush(server: RedisServer, bodies: Sequence[bytes], n: int, batch: int) -> float:
    """Seconds for ``n`` LPUSHes to one list, ``batch`` per pipelined round trip."""
    client = server.client
    client.delete("bench")
    groups = [[bodies[(i + k) % len(bodies)] for k in range(min(batch, n - i))] for i in range(0, n, batch)]
    start = time.perf_counter()
    for group in groups:
        pipe = client.pipeline(transaction=False)
        for body in group:
            pipe.lpush("bench", body)
        pipe.execute()
    elapsed = time.perf_counter() - start
    client.delete("bench")
    return elapsed


# ------------------------------------------------------------------------------------------------
# stores
# ------------------------------------------------------------------------------------------------


def _timed_appends(store: MessageStore, requests: Sequence[AppendRequest], n: int, batch: int, threads: int) -> float:
    per_thread = n // threads
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def work(t: int) -> None:
        try:
            barrier.wait()
            count = len(requests)
            base = t * per_thread
            if batch == 1:
                append = store.append
                for i in range(base, base + per_thread):
                    append(requests[i % count])
            else:
                for i in range(base, base + per_thread, batch):
                    store.append_batch([requests[(i + k) % count] for k in range(min(batch, base + per_thread - i))])
        except BaseException as exc:  # noqa: BLE001 - reported after the run: a failed writer must not pass as fast
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise click.ClickException(f"a writer failed: {type(errors[0]).__name__}: {errors[0]}")
    return elapsed


def _timed_reads(store: MessageStore) -> tuple[int, float]:
    total = 0
    start = time.perf_counter()
    for queue_id in range(QUEUES):
        offset = store.min_offset(TOPIC, queue_id)
        while True:
            page = store.read_queue(TOPIC, queue_id, offset, CQ_PAGE)
            if not page:
                break
            total += len(page)
            offset = page[-1].queue_offset + 1
    return total, time.perf_counter() - start


@contextlib.contextmanager
def _opened(plugin: str, workdir: Path, flush: str) -> Iterator[MessageStore]:
    """A new store in its own directory under ``workdir``; closed and removed afterwards (a run
    with ``--dir`` would otherwise leave a store per case behind)."""
    from plugmq.broker.components import open_store

    path = Path(tempfile.mkdtemp(prefix=f"{plugin}-{flush}-", dir=workdir))
    try:
        store = open_store(plugin, path, options={"flush": flush})
        try:
            yield store
        finally:
            store.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def usable_stores(names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    from plugmq.broker.components import plugin_declaration

    usable, skipped = [], {}
    for name in names:
        try:
            plugin_declaration(name)
        except Exception as exc:  # noqa: BLE001 - reported in the output, the others still run
            skipped[name] = f"{type(exc).__name__}: {exc}"
        else:
            usable.append(name)
    return usable, skipped


@attrs.define
class Bench:
    workdir: Path
    messages: int
    batch: int
    rounds: int
    progress: Callable[[str], None]
    redis: RedisServer | None = None
    rows: list[Row] = attrs.field(factory=list)
    raw: dict[tuple[str, int], float] = attrs.field(factory=dict)

    def _best_raw(self, key: tuple[str, int], rate: float) -> None:
        self.raw[key] = max(self.raw.get(key, 0.0), rate)

    def raw_round(self, size: int, bodies: Sequence[bytes]) -> None:
        n = self.messages
        self._best_raw(("mmap single", size), n / raw_mmap_single(self.workdir, bodies, n))
        self._best_raw(("mmap batched", size), n / raw_mmap_batched(self.workdir, bodies, n, self.batch))
        if self.redis is not None:
            self._best_raw(("redis lpush", size), n / raw_redis_lpush(self.redis, bodies, n, self.batch))

    def baselines(self, size: int) -> None:
        n = self.messages
        bodies = _bodies(size)
        self.progress(f"raw limits, {size} B")
        self.raw_round(size, bodies)
        self.raw[("write+fsync", size)] = n / raw_write_fsync(self.workdir, bodies, n)
        self.raw[("cq scan", size)] = n / raw_cq_scan(self.workdir, n)

    def store(self, plugin: str, size: int) -> None:
        requests = _requests(size)
        bodies = _bodies(size)
        n = self.messages
        best: dict[str, tuple[float, int]] = {}
        for round_ in range(self.rounds):
            for case, batch in (("single async", 1), ("batch async", self.batch)):
                self.progress(f"{plugin} {case}, {size} B, round {round_ + 1}/{self.rounds}")
                with _opened(plugin, self.workdir, "async") as store:
                    seconds = _timed_appends(store, requests, n, batch, 1)
                    if seconds < best.get(case, (float("inf"), 0))[0]:
                        best[case] = (seconds, n)
                    if case == "batch async" and round_ == 0:
                        self.progress(f"{plugin} consume-queue reads, {size} B")
                        entries, read_seconds = _timed_reads(store)
                        self._add(plugin, "cq read", size, "async", CQ_PAGE, 1, entries, read_seconds, "cq scan")
            if round_ > 0:  # the first raw round ran with the other baselines
                self.raw_round(size, bodies)
        for case, batch, baselines in (("single async", 1, ["mmap single"]),
                                       ("batch async", self.batch, ["mmap batched", "redis lpush"])):
            seconds, count = best[case]
            for baseline in baselines:
                if (baseline, size) in self.raw:
                    self._add(plugin, case, size, "async", batch, 1, count, seconds, baseline)
        cases = [(f"single sync x{t}", "sync", 1, t, "write+fsync") for t in SYNC_THREADS]
        cases += [("batch sync", "sync", self.batch, 1, "write+fsync")]
        for case, flush, batch, threads, baseline in cases:
            self.progress(f"{plugin} {case}, {size} B")
            with _opened(plugin, self.workdir, flush) as store:
                count = n - n % threads
                seconds = _timed_appends(store, requests, count, batch, threads)
                self._add(plugin, case, size, flush, batch, threads, count, seconds, baseline)

    def _add(self, plugin: str, case: str, size: int, flush: str, batch: int, threads: int, messages: int,
             seconds: float, baseline: str) -> None:
        self.rows.append(Row(plugin, case, size, f"{flush}: {DURABILITY.get((plugin, flush), 'flush=' + flush)}",
                             batch, threads, messages, seconds, baseline, self.raw[(baseline, size)]))


# ------------------------------------------------------------------------------------------------
# restart after kill -9
# ------------------------------------------------------------------------------------------------


@attrs.frozen
class Restart:
    stop: str  # "kill -9" or "clean stop"
    log_bytes: int
    messages: int
    body: int
    seconds: float
    read_ok: bool
    checked_from: int
    end: int
    redispatched: int
    cut_bytes: int

    @property
    def met(self) -> bool:
        return self.read_ok and self.seconds <= RESTART_TARGET_S


def restart_after_kill(workdir: Path, log_bytes: int, body: int, batch: int, plugin: str = "store_mmap",
                       *, clean: bool = False) -> Restart:
    """Fill a store in a child until its commit log holds ``log_bytes``, SIGKILL it mid-write
    (``clean``: SIGTERM, and the child closes the store), then time reopening the store and
    reading its newest message."""
    from plugmq.broker.components import open_store

    data = Path(tempfile.mkdtemp(prefix="restart-", dir=workdir))
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugmq.bench._restart_child", plugin, str(data), str(log_bytes), str(body),
         str(batch)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()
        if not line or line[0] != "ready":
            raise click.ClickException(f"the restart child stopped before filling the log (exit {proc.poll()})")
        messages = int(line[1])
        time.sleep(0.2)  # the child goes on writing: the kill lands inside an append
        os.kill(proc.pid, signal.SIGTERM if clean else signal.SIGKILL)
        if proc.wait(timeout=120) != (0 if clean else -signal.SIGKILL):
            raise click.ClickException(f"the restart child ended with exit code {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    start = time.perf_counter()
    store = open_store(plugin, data, options={"flush": "async"})
    try:
        heads = [entry for queue_id in range(4)
                 for entry in store.read_queue("RestartTopic", queue_id,
                                               max(store.max_offset("RestartTopic", queue_id) - 1, 0), 1)]
        newest = max(heads, key=lambda e: e.commit_log_offset) if heads else None
        read_ok = newest is not None and store.read(newest.commit_log_offset, newest.size) is not None
        seconds = time.perf_counter() - start
        report = store.recovery if isinstance(store, RecoveryReporting) else None
        figures = (report.checked_from, report.end, report.redispatched, report.cut_bytes) if report else (-1,) * 4
    finally:
        store.close()
        shutil.rmtree(data, ignore_errors=True)
    return Restart("clean stop" if clean else "kill -9", log_bytes, messages, body, seconds, read_ok,
                   *figures)


def _table(rows: Sequence[Row], raw: dict[tuple[str, int], float], batch: int) -> Table:
    table = Table(title="plugmq bench store (rates in messages/s; ratio = store / raw limit of the same run)")
    right = {"body", "batch", "threads", "msgs", "rate", "ratio", "target"}
    for column in ("store", "case", "body", "durability", "batch", "threads", "msgs", "rate", "vs raw", "ratio",
                   "target"):
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    for (name, size), rate in sorted(raw.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        per_call = batch if name in ("mmap batched", "redis lpush") else CQ_PAGE if name == "cq scan" else 1
        flags = {"write+fsync": "fsync per message", "redis lpush": "loopback TCP, no persistence"}.get(
            name, "none (page cache)")
        table.add_row("raw", name, str(size), flags, str(per_call), "1", "", f"{rate:,.0f}", "", "1.00", "",
                      style="dim")
    for row in rows:
        target = ""
        if row.target is not None:
            target = f"{'OK' if row.ratio >= row.target else 'MISS'} >= {row.target:.2f}"
        table.add_row(row.store, row.case, str(row.size), row.durability, str(row.batch), str(row.threads),
                      f"{row.messages:,}", f"{row.rate:,.0f}", row.baseline, f"{row.ratio:.2f}", target)
    return table


@click.command("store")
@click.option("--messages", default=20_000, show_default=True, type=click.IntRange(100),
              help="Messages per case (and per raw baseline).")
@click.option("--stores", default=",".join(DEFAULT_STORES), show_default=True,
              help="Comma-separated storage plugins to measure.")
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1),
              help="Messages per append_batch call (and per call of the raw batched loop / Redis pipeline).")
@click.option("--sizes", default=",".join(map(str, SIZES)), show_default=True, help="Comma-separated body sizes.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="Rounds of each async case and its raw baselines (the best round of each is kept).")
@click.option("--redis/--no-redis", "use_redis", default=True, show_default=True,
              help="Measure Redis LPUSH pipelined as a batch baseline (needs redis-server and the redis package).")
@click.option("--restart-log-mib", default=1024, show_default=True, type=click.IntRange(0),
              help="Commit-log size for the kill -9 restart measurement of store_mmap (0 leaves it out).")
@click.option("--dir", "workdir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the stores and raw files go (default: a temporary directory, removed after).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of a table.")
def command(messages: int, stores: str, batch: int, sizes: str, rounds: int, use_redis: bool, restart_log_mib: int,
            workdir: Path | None, as_json: bool) -> None:
    """Append and consume-queue speed of each store, as ratios to raw mmap / fsync / Redis limits."""
    names = [s.strip() for s in stores.split(",") if s.strip()]
    body_sizes = [int(s) for s in sizes.split(",") if s.strip()]
    usable, skipped = usable_stores(names)
    console = Console(stderr=as_json)
    if not console.is_terminal and not as_json:
        console = Console(width=180)
    redis_note = redis_missing() if use_redis else "left out (--no-redis)"
    load = LoadWindow()
    bench, restarts = _measure(workdir, console, usable, body_sizes, _Plan(messages, batch, rounds, restart_log_mib),
                               redis_note)
    load.finish()
    if as_json:
        click.echo(json.dumps({
            "rows": [r.as_dict() for r in bench.rows],
            "raw": [{"baseline": k[0], "size": k[1], "rate": v} for k, v in bench.raw.items()],
            **{"restart_clean" if restart.stop == "clean stop" else "restart":
               {**attrs.asdict(restart), "target_s": RESTART_TARGET_S, "met": restart.met} for restart in restarts},
            "skipped": skipped, "batch": batch, "messages": messages, "rounds": rounds,
            "redis": redis_note or "measured", "load_average": load.as_dict(),
        }, indent=2))
        return
    console.print(_table(bench.rows, bench.raw, batch))
    for name, reason in skipped.items():
        console.print(f"skipped {name}: {reason}", style="yellow")
    if redis_note:
        console.print(f"Redis baseline: {redis_note}", style="yellow")
    for restart in restarts:
        console.print(_restart_line(restart))
    console.print(
        f"raw mmap: {_RAW_HEADER.size}-byte header (size, CRC32) + body copied into an mmap'ed file, one record "
        f"per call or {batch} joined per call; write+fsync: os.write + os.fsync per message; cq scan: 20-byte "
        f"entries unpacked from an mmap, {CQ_PAGE} per call; redis lpush: {batch} LPUSH per pipelined round trip. "
        f"Store requests carry TAGS and a unique key ({QUEUES} queues). Async cases and their mmap/Redis baselines: "
        f"best of {rounds} alternating rounds. Targets (store_mmap): single >= 0.30x raw single, batch >= 0.40x raw "
        f"batched and >= 3x Redis LPUSH pipelined, sync x8 >= 5x write+fsync, restart <= 2 s. "
        f"{load.text().capitalize()}.",
        style="dim",
    )


@attrs.frozen
class _Plan:
    """How much the store bench measures (the command's options)."""

    messages: int
    batch: int
    rounds: int
    restart_log_mib: int


def _measure(workdir: Path | None, console: Console, usable: list[str], body_sizes: list[int], plan: _Plan,
             redis_note: str | None) -> tuple[Bench, list[Restart]]:
    """Run every case in ``workdir`` (a temporary directory, removed after, when None)."""
    own_dir = workdir is None
    root: Path = Path(tempfile.mkdtemp(prefix="plugmq-bench-store-")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    restarts: list[Restart] = []
    try:
        redis_server = RedisServer(root) if redis_note is None else None
        try:
            with Progress(console=console, transient=True) as progress:
                total = (len(body_sizes) * (1 + len(usable) * (4 + 2 * plan.rounds))
                         + (2 if plan.restart_log_mib else 0))
                task = progress.add_task("store bench", total=total)

                def step(label: str) -> None:
                    progress.update(task, advance=1, description=label)

                bench = Bench(root, plan.messages, plan.batch, plan.rounds, step, redis_server)
                for size in body_sizes:
                    bench.baselines(size)
                    for plugin in usable:
                        bench.store(plugin, size)
                if plan.restart_log_mib and "store_mmap" in usable:
                    for clean in (False, True):
                        step(f"store_mmap restart after {'a clean stop' if clean else 'kill -9'} with a "
                             f"{plan.restart_log_mib} MiB commit log")
                        restarts.append(restart_after_kill(root, plan.restart_log_mib << 20, 1024, plan.batch,
                                                           clean=clean))
        finally:
            if redis_server is not None:
                redis_server.stop()
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
        else:  # the caller's directory: only what the bench itself wrote goes
            for raw in ("raw-single", "raw-batch", "raw-fsync", "raw-cq"):
                (root / raw).unlink(missing_ok=True)
    return bench, restarts


def _restart_line(restart: Restart) -> str:
    verdict = "OK" if restart.met else "MISS"
    return (f"store_mmap restart after {restart.stop}: {restart.seconds:.2f} s to reopen and read the newest message "
            f"({restart.log_bytes / (1 << 20):,.0f} MiB log, {restart.messages:,} x {restart.body} B messages; "
            f"recovery checked from {restart.checked_from:,} to {restart.end:,}, re-dispatched "
            f"{restart.redispatched:,}, cut {restart.cut_bytes:,} bytes; read ok: {restart.read_ok}) "
            f"[{verdict} <= {RESTART_TARGET_S:.0f} s]")

