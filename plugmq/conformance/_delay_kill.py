"""The parent side of the delay family's kill clauses: run ``_delay_child``, SIGKILL it, check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plugmq.broker.components import plugin_declaration
from plugmq.conformance import _delay_child as child
from plugmq.conformance._children import run_until_killed
from plugmq.conformance._delay_harness import DelayHarness

__all__ = ["ChildRun", "check_after_kill", "child_window", "run_child"]

SECOND = 1000


class ChildRun:
    """What a killed child printed: messages accepted (with their due times), write-backs, its clock."""

    def __init__(self) -> None:
        self.accepted: set[int] = set()
        self.due: dict[int, int] = {}
        self.moved: set[int] = set()  # rescheduled (the reschedule run)
        self.delivered: list[str] = []
        self.clock_ms = 0
        self.done = False


def child_window(h: DelayHarness, count: int) -> tuple[int, int]:
    """Now, and a clock time by which the child's ``count`` planned messages are all due (plus 5 s)."""
    levels = plugin_declaration(h.plugin).capabilities.levels_ms
    start = h.clock.now_ms()
    return start, start + max(child.plan(i, levels)[1] for i in range(count)) + 5 * SECOND


def _lines_of(kind: str, count: int) -> Callable[[bytes], bool]:
    """Whether a child's output holds ``count`` complete lines of ``kind``."""
    prefix = kind.encode() + b" "
    return lambda out: sum(1 for line in out.split(b"\n")[:-1] if line.startswith(prefix)) >= count


def run_child(h: DelayHarness, tmp_path: Path, *, start: int, count: int, until: int,
              kill_after: tuple[str, int] | None, self_kill_after: int = 0, reschedule: bool = False) -> ChildRun:
    """Run the child until it printed ``kill_after[1]`` lines of kind ``kill_after[0]``, SIGKILL it
    (or, with ``self_kill_after``, until it SIGKILLs itself after that many write-backs). With
    ``reschedule`` it moves every message once after scheduling them all (``R`` lines)."""
    received = run_until_killed(
        "plugmq.conformance._delay_child",
        [h.plugin, h.store_plugin, str(h.data_dir), str(start), str(count), str(until), "250", str(self_kill_after),
         "1" if reschedule else "0"],
        tmp_path / f"child-{start}-{count}.log", None if kill_after is None else _lines_of(*kill_after))
    run = ChildRun()
    run.clock_ms = start
    for line in received.decode().split("\n")[:-1]:  # a last line without newline was cut by the kill
        tag, *rest_fields = line.split()
        if tag == "S":
            run.accepted.add(int(rest_fields[0]))
            run.due[int(rest_fields[0])] = int(rest_fields[1])
        elif tag == "T":
            run.clock_ms = max(run.clock_ms, int(rest_fields[0]))
        elif tag == "D":
            run.delivered.append(rest_fields[0])
        elif tag == "R":
            run.moved.add(int(rest_fields[0]))
        elif tag == "DONE":
            run.done = True
    assert not run.done, "the child finished before the kill; nothing was in flight"
    return run


def check_after_kill(h: DelayHarness, due: dict[int, int]) -> None:
    counts = h.stored_uids(child.TOPIC)
    lost = [i for i in due if counts[child.uid_of(i)] == 0]
    doubled = [i for i in due if counts[child.uid_of(i)] > 1]
    assert not lost, f"{len(lost)} accepted messages lost across kill -9, e.g. {lost[:5]}"
    assert not doubled, f"{len(doubled)} messages delivered twice across kill -9, e.g. {doubled[:5]}"
    assert sum(counts.values()) == len(due), "the real topic holds messages that were never scheduled"

