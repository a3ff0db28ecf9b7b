"""Reschedule in delay_wheel and delay_schedule: a kill -9 at each step of a move.

The conformance clause kills a child at a random moment among many reschedules; here the child
SIGKILLs itself at one exact step of one move (after the intent file is written, after the new
copy is appended but before the old entry is marked moved, and right before the intent is
cleared), so every interrupted state is recovered at least once. In each case the move is
finished at restart: the message comes once, at its new time.

Run as a child: ``python -m tests.test_delay_reschedule PLUGIN STORE DATA_DIR KILL_AT``.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugmq.conformance._delay_harness import DelayHarness
from plugmq.core import ManualClock
from plugmq.core.contracts.delay import ReschedulableDelay
from tests.helpers.children import ROOT, child_command

TOPIC = "DelayConformance"
START_MS = 1_700_000_000_000
DUE = {"a": 10_000, "b": 20_000, "c": 30_000}  # after START_MS
MOVED_TO = 5_000  # b moves from 20 s to 5 s
KILL_POINTS = ("after_intent", "after_append", "before_clear")


def _kill_at(point: str, plugin: str) -> None:
    """Patch the step ``point`` of a move so the process SIGKILLs itself there."""
    from plugmq.kit.intent import IntentFile

    def die(*_args: Any, **_kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "after_intent":
        write = IntentFile.write

        def write_then_die(self: IntentFile, values: tuple[int, ...]) -> None:
            write(self, values)
            die()

        IntentFile.write = write_then_die  # type: ignore[method-assign]
    elif point == "before_clear":
        IntentFile.clear = die  # type: ignore[method-assign]
    elif plugin == "delay_wheel":
        from plugmq.plugins.delay_wheel.scheduler import WheelDelayScheduler

        WheelDelayScheduler._drop = die  # type: ignore[method-assign]
    else:
        from plugmq.plugins.delay_schedule.dispatch_log import MOVED
        from plugmq.plugins.delay_schedule.schedule_log import ScheduleLog

        mark = ScheduleLog.mark

        def mark_or_die(self: ScheduleLog, segment: Any, kind: int, seqs: list[int], *, sync: bool) -> None:
            if kind == MOVED:
                die()
            mark(self, segment, kind, seqs, sync=sync)

        ScheduleLog.mark = mark_or_die  # type: ignore[method-assign]


def _child(plugin: str, store: str, data_dir: Path, point: str) -> None:
    h = DelayHarness(plugin, data_dir, ManualClock(START_MS / 1000), (store,))
    h.open()
    for uid, delay in DUE.items():
        h.send(uid, due_ms=START_MS + delay)
    _kill_at(point, plugin)
    h.reschedule("b", START_MS + MOVED_TO)
    raise SystemExit(f"the move finished without reaching kill point {point}")


@pytest.mark.parametrize("plugin", ["delay_wheel", "delay_schedule"])
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_move_killed_at_each_step_is_finished_at_restart(plugin: str, point: str, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    child = subprocess.run(child_command(__file__, plugin, "store_lmdb", str(data_dir), point),
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, f"the child did not die at {point}: {child.stderr[-2000:]}"
    h = DelayHarness(plugin, data_dir, ManualClock(START_MS / 1000), ("store_lmdb",))
    try:
        scheduler = h.open()
        assert isinstance(scheduler, ReschedulableDelay)
        assert scheduler.pending() == 3, "the interrupted move lost or doubled a pending message"
        assert not (data_dir / plugin / "reschedule.intent").exists(), "the intent outlived its recovery"
        at: dict[str, int] = {}
        for moment in sorted({START_MS + d for d in (*DUE.values(), MOVED_TO)}):
            h.advance_to(moment)
            at.update((d.uid, d.at_ms) for d in h.deliveries)
        assert at == {"a": START_MS + DUE["a"], "b": START_MS + MOVED_TO, "c": START_MS + DUE["c"]}
        assert h.stored_uids(TOPIC) == collections.Counter("abc"), "a message stored twice or lost"
        assert scheduler.pending() == 0
    finally:
        h.close()


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4])
