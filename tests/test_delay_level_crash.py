"""kill -9 of a real broker-like process running delay_level on the wall clock.

The child (this file run as a script) opens store_lmdb and delay_level with short levels
("1s 2s") on a SystemClock, keeps scheduling while the clock thread writes due messages back,
and reports every accepted schedule and every finished write-back. The parent SIGKILLs it in the
middle of that, reopens the same directory on a ManualClock set past every deliver time (no
sleeping), and checks the real topic: every accepted message exactly once, nothing else.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from plugmq.broker.components import open_delay_scheduler, open_store
from plugmq.core import (
    AppendRequest,
    AppendResult,
    ManualClock,
    MessageStore,
    Prop,
    tags_code,
)
from tests.helpers.children import ROOT, child_command

TOPIC = "CrashTopic"
LEVELS = "1s 2s"


def _was_delivered(store: MessageStore) -> Callable[[AppendRequest], bool]:
    def check(request: AppendRequest) -> bool:
        uid = request.properties[Prop.UNIQ_KEY]
        return any(m.unique_id == uid and m.reconsume_times == request.reconsume_times
                   for m in store.query_by_key(request.topic, uid))

    return check


def child(data_dir: Path) -> None:
    from plugmq.core.clock import SystemClock

    out = sys.stdout.fileno()
    clock = SystemClock()
    store = open_store("store_lmdb", data_dir, clock=clock)

    def deliver(request: AppendRequest) -> AppendResult:
        result = store.append(request)
        os.write(out, f"D {request.properties[Prop.UNIQ_KEY]}\n".encode())
        return result

    def deliver_batch(requests: Sequence[AppendRequest]) -> list[AppendResult]:
        results = store.append_batch(requests)
        os.write(out, "".join(f"D {r.properties[Prop.UNIQ_KEY]}\n" for r in requests).encode())
        return results

    scheduler = open_delay_scheduler("delay_level", data_dir, deliver=deliver, clock=clock, store=store,
                                     was_delivered=_was_delivered(store), deliver_batch=deliver_batch,
                                     options={"levels": LEVELS, "dispatch_batch": 8})
    scheduler.start()
    levels = scheduler.capabilities.levels_ms
    assert levels is not None
    stop = time.monotonic() + 30
    index = 0
    while time.monotonic() < stop:
        level = 1 + index % 2
        due = clock.now_ms() + levels[level - 1]
        request = AppendRequest(TOPIC, index % 2, f"crash {index}".encode(),
                                properties={Prop.UNIQ_KEY: f"c{index}", Prop.TAGS: "T", Prop.DELAY_LEVEL: str(level)},
                                tags_code=tags_code("T"))
        scheduler.schedule(request, deliver_at_ms=due, delay_level=level)
        os.write(out, f"S {index} {due}\n".encode())
        index += 1
        if index % 50 == 0:
            time.sleep(0.01)  # pace the producer (the wall clock delivers meanwhile)
    os.write(out, b"DONE\n")


def test_kill_during_wall_clock_dispatch_loses_and_repeats_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with open(tmp_path / "child.log", "wb") as log_file:
        proc = subprocess.Popen(child_command(__file__, str(data_dir)), stdout=subprocess.PIPE, stderr=log_file,
                                cwd=ROOT)
    assert proc.stdout is not None
    received = b""
    try:
        while received.count(b"\nD ") < 400:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, f"child died early: {(tmp_path / 'child.log').read_text()[-2000:]}"
            received += chunk
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    received += rest
    assert proc.returncode == -signal.SIGKILL and b"DONE" not in received
    due: dict[str, int] = {}
    reported: collections.Counter[str] = collections.Counter()
    for line in received.decode().split("\n")[:-1]:
        tag, *fields = line.split()
        if tag == "S":
            due[f"c{fields[0]}"] = int(fields[1])
        elif tag == "D":
            reported[fields[0]] += 1
    assert reported and max(reported.values()) == 1, "the child itself delivered something twice"
    in_flight = f"c{len(due)}"

    clock = ManualClock(time.time())
    store = open_store("store_lmdb", data_dir, clock=clock)
    delivered: list[tuple[int, str]] = []

    def deliver(request: AppendRequest) -> AppendResult:
        delivered.append((clock.now_ms(), request.properties[Prop.UNIQ_KEY]))
        return store.append(request)

    scheduler = open_delay_scheduler("delay_level", data_dir, deliver=deliver, clock=clock, store=store,
                                     was_delivered=_was_delivered(store), options={"levels": LEVELS})
    try:
        scheduler.start()
        clock.advance(5)
        assert scheduler.pending() == 0
        counts: collections.Counter[str] = collections.Counter()
        for qid in range(store.queues().get(TOPIC, 0)):
            for entry in store.read_queue(TOPIC, qid, 0, 1_000_000):
                message = store.read(entry.commit_log_offset, entry.size)
                assert message is not None and message.unique_id is not None
                counts[message.unique_id] += 1
        lost = [u for u in due if counts[u] == 0]
        doubled = [u for u, n in counts.items() if n > 1]
        unknown = set(counts) - set(due) - {in_flight}
        assert not lost, f"accepted messages lost: {lost[:5]}"
        assert not doubled, f"delivered twice: {doubled[:5]}"
        assert not unknown, f"never scheduled, yet delivered: {sorted(unknown)[:5]}"
        for at, uid in delivered:
            assert uid == in_flight or at >= due[uid], f"{uid} delivered early after the restart"
    finally:
        scheduler.close()
        store.close()


if __name__ == "__main__":
    child(Path(sys.argv[1]))
