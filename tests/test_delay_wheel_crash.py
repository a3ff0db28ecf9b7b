"""kill -9 of a real child process running delay_wheel: no accepted message lost, none delivered twice.

The child's write-back appends each delivered unique id to an fsynced file, and ``was_delivered``
reads that file — the same role the broker's store plays. Run as a script, this file is the child.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from plugmq.broker.components import open_delay_scheduler
from plugmq.core import AppendRequest, AppendResult, AppendStatus, ManualClock, Prop
from tests.helpers.children import ROOT, child_command

T0 = 1_700_000_000.0
N = 400
END = T0 + 4 * 3600


def plan(n: int = N) -> list[int]:
    """Deterministic delays (ms): clusters in the same seconds, spread over three hours."""
    rng = random.Random(7)
    return [rng.choice([rng.randint(1, 90) * 1000, rng.randint(1_000, 3 * 3600 * 1000)]) for _ in range(n)]


def expected_order() -> list[str]:
    t0_ms = int(T0 * 1000)
    keyed = sorted((t0_ms + d, i) for i, d in enumerate(plan()))
    return [f"m{i}" for _, i in keyed]


class FileSink:
    def __init__(self, path: Path, clock: ManualClock) -> None:
        self.path = path
        self.clock = clock
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.count = 0
        self.block_at = -1
        self.block_after_write = False

    def __call__(self, request: AppendRequest) -> AppendResult:
        uid = request.properties[Prop.UNIQ_KEY]
        self.count += 1
        if self.count == self.block_at and not self.block_after_write:
            self._block()
        os.write(self.fd, f"{uid}\n".encode())
        os.fsync(self.fd)
        print(f"D {uid} {self.clock.now_ms()}", flush=True)
        if self.count == self.block_at and self.block_after_write:
            self._block()
        return AppendResult(AppendStatus.PUT_OK, "0" * 32, self.count, 0, 1, self.clock.now_ms())

    def _block(self) -> None:
        print(f"READY {self.clock.now_ms()}", flush=True)
        sys.stdin.read()  # until the parent kills us

    def batch(self, requests: Sequence[AppendRequest]) -> list[AppendResult]:
        """The broker's batched write-back: a kill can land after any message of the batch."""
        return [self(r) for r in requests]

    def was_delivered(self, request: AppendRequest) -> bool:
        return request.properties[Prop.UNIQ_KEY] in delivered_lines(self.path)


def delivered_lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def run(data_dir: Path, sink_path: Path, clock_start: float, *, schedule: int, block_at: int = -1,
        block_after_write: bool = False) -> None:
    """The body of a child (and of the parent's final, uncrashed run)."""
    clock = ManualClock(clock_start)
    sink = FileSink(sink_path, clock)
    sink.block_at, sink.block_after_write = block_at, block_after_write
    wheel = open_delay_scheduler("delay_wheel", data_dir, deliver=sink, clock=clock,
                                 was_delivered=sink.was_delivered, deliver_batch=sink.batch)
    if schedule:
        for i, delay in enumerate(plan(schedule)):
            at = int(T0 * 1000) + delay
            request = AppendRequest(topic="T", queue_id=i % 4, body=b"x" * (i % 50),
                                    properties={Prop.UNIQ_KEY: f"m{i}", Prop.DELIVER_AT_MS: str(at)})
            wheel.schedule(request, deliver_at_ms=at, delay_level=None)
            print(f"A m{i}", flush=True)
    wheel.start()
    step = random.Random(int(clock_start)).choice([1, 3, 7])
    while clock.now() < END:
        clock.advance(step)
    wheel.close()
    print("DONE", flush=True)


def spawn(data_dir: Path, sink_path: Path, clock_start: float, schedule: int, block_at: int,
          block_after_write: bool) -> subprocess.Popen[str]:
    args = child_command(__file__, str(data_dir), str(sink_path), repr(clock_start), str(schedule), str(block_at),
                         str(int(block_after_write)))
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def kill_when(child: subprocess.Popen[str], prefix: str, count: int) -> tuple[list[str], float]:
    """Read the child's lines until the count-th one starting with ``prefix``, then SIGKILL it.
    Returns the lines read and the last virtual time the child reported."""
    lines, seen, last_ms = [], 0, T0 * 1000
    assert child.stdout is not None
    for line in child.stdout:
        lines.append(line.strip())
        parts = line.split()
        if parts[0] in ("D", "READY"):
            last_ms = int(parts[-1])
        if parts[0] == prefix:
            seen += 1
            if seen == count:
                break
    os.kill(child.pid, signal.SIGKILL)
    lines.extend(rest.strip() for rest in child.stdout)  # what was already in the pipe
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, f"child ended on its own: {lines[-3:]}"
    return lines, last_ms / 1000


@pytest.mark.parametrize(
    ("block_at", "after_write"),
    [(37, True), (37, False), (-1, False)],
    ids=["killed-after-store-write", "killed-before-store-write", "killed-free-running"],
)
def test_kill_mid_dispatch_twice_then_restart_no_loss_no_duplicate(tmp_path: Path, block_at: int,
                                                                    after_write: bool) -> None:
    data_dir, sink_path = tmp_path / "broker", tmp_path / "delivered.txt"
    first = spawn(data_dir, sink_path, T0, N, block_at, after_write)
    _, t1 = kill_when(first, "READY" if block_at > 0 else "D", 1 if block_at > 0 else 60)
    delivered_before_kill = len(delivered_lines(sink_path))
    if block_at > 0:
        assert delivered_before_kill in (36, 37)  # the child blocks there until killed
    else:
        assert delivered_before_kill >= 60  # free running: it may deliver more before SIGKILL lands
    # second crash, free running, at a point nobody chose
    second = spawn(data_dir, sink_path, t1, 0, -1, False)
    _, t2 = kill_when(second, "D", 90)
    assert t2 >= t1
    run(data_dir, sink_path, t2, schedule=0)
    delivered = delivered_lines(sink_path)
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"
    assert delivered == expected_order()  # nothing lost, oldest first across three processes


def test_kill_while_scheduling_keeps_every_accepted_message(tmp_path: Path) -> None:
    data_dir, sink_path = tmp_path / "broker", tmp_path / "delivered.txt"
    many = 20_000  # long enough that the kill lands while appends are running
    child = spawn(data_dir, sink_path, T0, many, -1, False)
    lines, _ = kill_when(child, "A", 150)
    accepted = {line.split()[1] for line in lines if line.startswith("A ")}
    assert 150 <= len(accepted) < many and delivered_lines(sink_path) == []
    run(data_dir, sink_path, T0, schedule=0)
    delivered = delivered_lines(sink_path)
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"
    assert accepted <= set(delivered)  # every acknowledged message
    # beyond them, at most the one append in flight when the kill landed
    assert set(delivered) - accepted <= {f"m{len(accepted)}"}


if __name__ == "__main__":
    data, sink_file, start, sched, block, after = sys.argv[1:7]
    run(Path(data), Path(sink_file), float(start), schedule=int(sched), block_at=int(block),
        block_after_write=bool(int(after)))
