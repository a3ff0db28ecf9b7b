"""Quick measurements of delay_wheel against an in-memory ``heapq`` baseline in the same run.

``python -m plugmq.plugins.delay_wheel.measure`` prints insert rate, dispatch rate (virtual clock)
and RSS growth with many pending messages spread over days. Each RSS figure comes from a fresh
process so one measurement's heap does not hide the next one's. Not a substitute for
``plugmq bench delay``; it exists so the wheel's own trade-offs can be checked in isolation.
"""

from __future__ import annotations

import heapq
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from plugmq.core import AppendRequest, AppendResult, AppendStatus, ManualClock, Prop
from plugmq.plugins.delay_wheel.options import DelayWheelOptions
from plugmq.plugins.delay_wheel.scheduler import WheelDelayScheduler

_T0 = 1_700_000_000.0


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _requests(n: int, body: int) -> list[AppendRequest]:
    payload = b"x" * body
    return [AppendRequest(topic="BenchTopic", queue_id=i % 8, body=payload,
                          properties={Prop.UNIQ_KEY: f"{i:032X}", Prop.KEYS: f"k{i}"}) for i in range(n)]


def _delays(n: int, horizon_s: int, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1_000, horizon_s * 1000) for _ in range(n)]


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, _request: AppendRequest) -> AppendResult:
        self.n += 1
        return AppendResult(AppendStatus.PUT_OK, "0" * 32, self.n, 0, 1, 0)


def _wheel(data_dir: Path, clock: ManualClock, deliver: _Count, fsync: bool) -> WheelDelayScheduler:
    from plugmq.core import DelayContext

    context = DelayContext(broker_name="bench", data_dir=data_dir, clock=clock, deliver=deliver,
                           was_delivered=None, options={"delay_wheel": DelayWheelOptions(fsync=fsync)})
    return WheelDelayScheduler(context, DelayWheelOptions(fsync=fsync))


def measure_rates(n: int, horizon_s: int, body: int, fsync: bool) -> dict[str, float]:
    """Insert and dispatch rates (messages/s) of the wheel and of heapq, same inputs."""
    requests, delays = _requests(n, body), _delays(n, horizon_s)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        clock, sink = ManualClock(_T0), _Count()
        wheel = _wheel(Path(tmp), clock, sink, fsync)
        now = clock.now_ms()
        t = time.perf_counter()
        for request, delay in zip(requests, delays):
            wheel.schedule(request, deliver_at_ms=now + delay, delay_level=None)
        out["wheel_insert"] = n / (time.perf_counter() - t)
        wheel.start()
        t = time.perf_counter()
        clock.advance(horizon_s + 3600)
        out["wheel_dispatch"] = sink.n / (time.perf_counter() - t)
        assert sink.n == n, (sink.n, n)
        wheel.close()

    heap: list[tuple[int, int, AppendRequest]] = []
    now = int(_T0 * 1000)
    t = time.perf_counter()
    for seq, (request, delay) in enumerate(zip(requests, delays)):
        heapq.heappush(heap, (now + delay, seq, request))
    out["heapq_insert"] = n / (time.perf_counter() - t)
    sink = _Count()
    t = time.perf_counter()
    while heap:
        sink(heapq.heappop(heap)[2])
    out["heapq_dispatch"] = n / (time.perf_counter() - t)
    return out


def fdatasync_latency_ms(rounds: int = 50) -> float:
    """This disk's fdatasync latency right now: what every fsync=on figure is bound by."""
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(f"{tmp}/probe", os.O_RDWR | os.O_CREAT, 0o644)
        t = time.perf_counter()
        for i in range(rounds):
            os.pwrite(fd, b"x" * 128, i * 128)
            os.fdatasync(fd)
        os.close(fd)
        return (time.perf_counter() - t) / rounds * 1000


def _rss_child(kind: str, n: int, horizon_s: int, body: int, queue: Any) -> None:
    requests_per_chunk = 10_000
    delays = _delays(n, horizon_s, seed=2)
    base = _rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        heap: list[tuple[int, int, AppendRequest]] = []
        wheel = _wheel(Path(tmp), ManualClock(_T0), _Count(), False) if kind == "wheel" else None
        base = _rss_bytes()
        now = int(_T0 * 1000)
        payload = b"x" * body
        t = time.perf_counter()
        for start in range(0, n, requests_per_chunk):
            for i in range(start, min(n, start + requests_per_chunk)):
                request = AppendRequest(topic="BenchTopic", queue_id=i % 8, body=payload,
                                        properties={Prop.UNIQ_KEY: f"{i:032X}", Prop.KEYS: f"k{i}"})
                if wheel is not None:
                    wheel.schedule(request, deliver_at_ms=now + delays[i], delay_level=None)
                else:
                    heapq.heappush(heap, (now + delays[i], i, request))
        elapsed = time.perf_counter() - t
        grown = _rss_bytes() - base
        disk = sum(p.stat().st_size for p in Path(tmp).rglob("*") if p.is_file())
        if wheel is not None:
            assert wheel.pending() == n
            wheel.close()
        queue.put({"rss_growth": grown, "seconds": elapsed, "disk": disk})


def measure_rss(kind: str, n: int, horizon_s: int, body: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_rss_child, args=(kind, n, horizon_s, body, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


@click.command("delay_wheel")
@click.option("--count", default=100_000, show_default=True, help="messages for the rate figures")
@click.option("--horizon-hours", default=6, show_default=True, help="delays spread over this many hours (rates)")
@click.option("--pending", default=1_000_000, show_default=True, help="pending messages for the RSS figure")
@click.option("--pending-days", default=30, show_default=True, help="spread of the pending messages")
@click.option("--body", default=100, show_default=True, help="body bytes per message")
@click.option("--fsync/--no-fsync", default=False, show_default=True, help="delay_wheel fsync option")
@click.option("--skip-heapq-rss", is_flag=True, help="skip the heapq RSS run (it needs a lot of memory)")
def command(count: int, horizon_hours: int, pending: int, pending_days: int, body: int, fsync: bool,
            skip_heapq_rss: bool) -> None:
    console = Console()
    rates = measure_rates(count, horizon_hours * 3600, body, fsync)
    table = Table(title=f"delay_wheel vs heapq: {count:,} messages over {horizon_hours} h, body {body} B, "
                        f"fsync={'on' if fsync else 'off'}, batch 1, ManualClock")
    for col in ("figure", "delay_wheel msg/s", "heapq msg/s", "wheel / heapq"):
        table.add_column(col, justify="right")
    for what in ("insert", "dispatch"):
        w, h = rates[f"wheel_{what}"], rates[f"heapq_{what}"]
        table.add_row(what, f"{w:,.0f}", f"{h:,.0f}", f"{w / h:.3f}")
    console.print(table)
    if fsync:
        console.print(f"fdatasync latency of this disk now: {fdatasync_latency_ms():.2f} ms "
                      "(insert = 3 syncs, dispatch = 1 sync per message with was_delivered, 2 without)")

    horizon = pending_days * 86_400
    rss = Table(title=f"RSS growth with {pending:,} pending messages over {pending_days} days (fresh process each)")
    for col in ("strategy", "RSS growth MB", "MB per 1M", "on disk MB", "insert s"):
        rss.add_column(col, justify="right")
    kinds = ["wheel"] if skip_heapq_rss else ["wheel", "heapq"]
    for kind in kinds:
        r = measure_rss(kind, pending, horizon, body)
        rss.add_row(kind, f"{r['rss_growth'] / 2**20:,.1f}", f"{r['rss_growth'] / 2**20 / pending * 1e6:,.1f}",
                    f"{r['disk'] / 2**20:,.1f}", f"{r['seconds']:,.1f}")
    console.print(rss)


if __name__ == "__main__":
    command()
