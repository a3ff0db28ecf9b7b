"""kill -9 of a real child process running delay_schedule: restart loses nothing, doubles nothing.

The child's deliver callback appends each delivered unique id to an fsynced file (the "topic"),
and ``was_delivered`` reads that file, as the broker's store would answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from plugmq.core import AppendRequest, AppendResult, AppendStatus, DelayContext, ManualClock, Prop
from plugmq.plugins.delay_schedule import DelayScheduleOptions, ScheduleDelayScheduler

T0 = 1_700_000_000.0

CHILD = r"""
import json, os, signal, sys
from pathlib import Path
from plugmq.core import AppendRequest, AppendResult, AppendStatus, DelayContext, ManualClock, Prop
from plugmq.plugins.delay_schedule import DelayScheduleOptions, ScheduleDelayScheduler

args = json.loads(sys.argv[1])
topic_file = Path(args["topic_file"])
clock = ManualClock(args["start"])
count = 0

def deliver(request):
    global count
    with topic_file.open("a") as f:
        f.write(request.properties[Prop.UNIQ_KEY] + "\n")
        f.flush()
        os.fsync(f.fileno())
    count += 1
    print("D", request.properties[Prop.UNIQ_KEY], flush=True)
    if count == args.get("die_after_delivery"):
        os.kill(os.getpid(), signal.SIGKILL)  # between the delivery and its dispatch-log mark
    return AppendResult(AppendStatus.PUT_OK, "00" * 16, count, 0, 1, clock.now_ms())

def was_delivered(request):
    return topic_file.exists() and request.properties[Prop.UNIQ_KEY] in topic_file.read_text().split()

context = DelayContext(broker_name="b", data_dir=Path(args["data_dir"]), clock=clock,
                       options={"delay_schedule": DelayScheduleOptions(**args["options"])},
                       deliver=deliver, was_delivered=was_delivered,
                       deliver_batch=lambda requests: [deliver(r) for r in requests])  # a kill may land mid-batch
scheduler = ScheduleDelayScheduler(context, DelayScheduleOptions(**args["options"]))
scheduler.start()
for i in range(args.get("produce", 0)):
    uid = f"p{i}"
    request = AppendRequest(topic="T", queue_id=0, body=b"x" * 100, properties={Prop.UNIQ_KEY: uid})
    scheduler.schedule(request, deliver_at_ms=clock.now_ms() + (i % 50) * 100, delay_level=None)
    print("A", uid, flush=True)
    if i % 7 == 0:
        clock.advance(0.5)
while True:
    clock.advance(0.5)
"""


def run_child(args: dict[str, Any], *, kill_after_lines: int | None) -> list[str]:
    """Run the child; SIGKILL it once it reported ``kill_after_lines`` deliveries/acks (or let
    it die by itself). Returns those report lines."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    lines: list[list[str]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if line[:2] not in ("D ", "A "):
            continue  # log output
        lines.append(line.split())
        if kill_after_lines is not None and len(lines) >= kill_after_lines:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return [" ".join(x) for x in lines]


class Parent:
    """The restarted broker, in this process, delivering to the same topic file."""

    def __init__(self, tmp_path: Path, options: DelayScheduleOptions, *, ask: bool = True) -> None:
        self.topic = tmp_path / "topic.txt"
        self.clock = ManualClock(T0)
        context = DelayContext(
            broker_name="b",
            data_dir=tmp_path / "data",
            clock=self.clock,
            deliver=self.deliver,
            was_delivered=(lambda r: r.properties[Prop.UNIQ_KEY] in self.topic_ids()) if ask else None,
        )
        self.scheduler = ScheduleDelayScheduler(context, options)

    def deliver(self, request: AppendRequest) -> AppendResult:
        with self.topic.open("a") as f:
            f.write(request.properties[Prop.UNIQ_KEY] + "\n")
        return AppendResult(AppendStatus.PUT_OK, "00" * 16, 0, 0, 1, self.clock.now_ms())

    def topic_ids(self) -> list[str]:
        return self.topic.read_text().split() if self.topic.exists() else []

    def schedule_all(self, uids: dict[str, int]) -> None:
        for uid, when in uids.items():
            request = AppendRequest(topic="T", queue_id=0, body=b"x" * 200, properties={Prop.UNIQ_KEY: uid})
            self.scheduler.schedule(request, deliver_at_ms=when, delay_level=None)


def child_args(tmp_path: Path, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"data_dir": str(tmp_path / "data"), "topic_file": str(tmp_path / "topic.txt"), "start": T0,
            "options": options, **extra}


OPTIONS: dict[str, Any] = {"fsync": True, "bucket_minutes": 1, "load_ahead_ms": 10_000, "dispatch_batch": 8}


def planned(n: int) -> dict[str, int]:
    base = int(T0 * 1000)
    return {f"m{i}": base + 1_000 + (i * 7919) % 120_000 for i in range(n)}


@pytest.mark.parametrize("kill_at", [37, 150])
def test_kill_mid_dispatch_then_restart(tmp_path: Path, kill_at: int) -> None:
    uids = planned(300)
    first = Parent(tmp_path, DelayScheduleOptions(**OPTIONS))
    first.schedule_all(uids)
    first.scheduler.close()

    lines = run_child(child_args(tmp_path, OPTIONS), kill_after_lines=kill_at)
    assert len(lines) >= kill_at
    before = (tmp_path / "topic.txt").read_text().split()
    assert len(before) >= kill_at

    second = Parent(tmp_path, DelayScheduleOptions(**OPTIONS))
    second.clock.set(T0 + 200)
    second.scheduler.start()
    second.clock.run_due()  # the overdue backlog goes out on the clock's first turn
    ids = second.topic_ids()
    assert Counter(ids) == Counter(list(uids)), "every message exactly once"
    assert second.scheduler.pending() == 0


def killed_after_20_deliveries(tmp_path: Path) -> dict[str, int]:
    """60 messages scheduled, then a child that delivers 20 of them and dies after the 20th's delivery,
    before its dispatch mark. The messages' ids and deliver times."""
    uids = planned(60)
    first = Parent(tmp_path, DelayScheduleOptions(**OPTIONS))
    first.schedule_all(uids)
    first.scheduler.close()
    run_child(child_args(tmp_path, OPTIONS, die_after_delivery=20), kill_after_lines=None)
    return uids


def test_kill_exactly_between_delivery_and_dispatch_mark(tmp_path: Path) -> None:
    uids = killed_after_20_deliveries(tmp_path)

    second = Parent(tmp_path, DelayScheduleOptions(**OPTIONS))
    assert len(second.topic_ids()) == 20
    second.clock.set(T0 + 200)
    second.scheduler.start()
    second.clock.run_due()  # the overdue backlog goes out on the clock's first turn
    assert Counter(second.topic_ids()) == Counter(list(uids))
    metrics = second.scheduler.metrics()
    # The 20th delivery had an intent but no mark: the broker said it was on the topic.
    assert metrics["in_doubt_found_delivered"] >= 1


def test_without_was_delivered_an_in_doubt_message_is_delivered_again(tmp_path: Path) -> None:
    """No way to ask the broker: at-least-once, and only the in-doubt messages repeat."""
    uids = killed_after_20_deliveries(tmp_path)
    second = Parent(tmp_path, DelayScheduleOptions(**OPTIONS), ask=False)
    in_doubt_before = second.topic_ids()
    second.clock.set(T0 + 200)
    second.scheduler.start()
    second.clock.run_due()  # the overdue backlog goes out on the clock's first turn
    counts = Counter(second.topic_ids())
    assert set(counts) == set(uids)
    doubled = {u for u, c in counts.items() if c > 1}
    assert doubled and doubled <= set(in_doubt_before)
    assert len(doubled) <= OPTIONS["dispatch_batch"]
    assert second.scheduler.metrics()["in_doubt_redelivered"] == len(doubled)


def test_kill_while_producing_loses_no_acknowledged_message(tmp_path: Path) -> None:
    lines = run_child(child_args(tmp_path, OPTIONS, produce=5_000), kill_after_lines=600)
    acked = {line.split()[1] for line in lines if line.startswith("A ")}
    assert len(acked) > 100
    parent = Parent(tmp_path, DelayScheduleOptions(**OPTIONS))
    parent.clock.set(T0 + 3_600)
    parent.scheduler.start()
    parent.clock.run_due()
    counts = Counter(parent.topic_ids())
    assert acked <= set(counts), "an acknowledged schedule() was lost"
    assert max(counts.values()) == 1, "a message was delivered twice"
    assert parent.scheduler.pending() == 0
