"""Child process of the delay kill clause: schedule, then dispatch on a ManualClock until killed.

Run as ``python -m plugmq.conformance._delay_child PLUGIN STORE_PLUGIN DATA_DIR START_MS COUNT
UNTIL_MS STEP_MS [SELF_KILL_AFTER [RESCHEDULE]]``. It opens the store and the scheduler in DATA_DIR on a ManualClock at
START_MS, schedules COUNT messages (plan below), starts the scheduler, then moves the clock in
STEP_MS steps to UNTIL_MS. Every line on stdout is written only after the fact it reports:

- ``S <index> <due_ms>``  ``schedule`` returned for message ``index`` (accepted);
- ``R <index> <due_ms>``  with RESCHEDULE = 1: ``reschedule`` of message ``index`` to ``due_ms``
                          returned its new result (every message is moved once, after all are
                          scheduled and before the clock moves: see :func:`moved_due`);
- ``T <ms>``              the clock is about to move to ``ms`` (it never goes further);
- ``D <uid>``             the write-back of ``uid`` to its real topic returned;
- ``DONE``                every step ran (the parent meant to kill before this).

The parent SIGKILLs it mid-dispatch, so some write-back is usually done but not yet recorded by
the strategy; the restarted strategy must then deliver the rest exactly once. With
SELF_KILL_AFTER = n > 0 the child SIGKILLs itself right after the n-th write-back reached the
store: the worst moment, deterministically (the strategy has not recorded that delivery yet).
When the n-th message is in the middle of a batched write-back (``deliver_batch``), only the
batch's messages up to it are stored before the kill: a torn batch, as a crash inside
``append_batch`` can leave one.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from plugmq.core import AppendRequest, AppendResult, MessageStore
    from plugmq.core.contracts.delay import WasDelivered

TOPIC = "DelayKillTopic"
QUEUES = 2
STORE_HOST = "10.1.2.3:10911"


def uid_of(index: int) -> str:
    return f"kill-{index:06d}"


def plan(index: int, levels_ms: tuple[int, ...] | None) -> tuple[int | None, int]:
    """(delay level or None, delay in ms) of message ``index`` for a strategy's capabilities.

    Level strategies get their first three levels in turn; arbitrary ones a spread of delays up
    to ~20 s, every fifth one a broker-style level request (level 2 of RocketMQ's list, 5 s).
    """
    if levels_ms is not None:
        level = 1 + index % min(3, len(levels_ms))
        return level, levels_ms[level - 1]
    if index % 5 == 0:
        return 2, 5000
    return None, 200 + (index * 7919) % 20_000


def moved_due(index: int, start_ms: int) -> int:
    """Where the reschedule run moves message ``index``: 1 to 31 s after the start, so some
    messages move earlier and some later than :func:`plan` put them."""
    return start_ms + 1000 + (index * 4273) % 30_000


def was_delivered_in(store: MessageStore) -> WasDelivered:
    from plugmq.core import Prop

    def was_delivered(request: AppendRequest) -> bool:
        uid = request.properties.get(Prop.UNIQ_KEY)
        if not uid:
            return False
        return any(m.unique_id == uid and m.reconsume_times == request.reconsume_times
                   for m in store.query_by_key(request.topic, uid, max_results=64))

    return was_delivered


def main(argv: list[str]) -> int:
    plugin, store_plugin, data_dir = argv[1], argv[2], Path(argv[3])
    start_ms, count, until_ms, step_ms = (int(x) for x in argv[4:8])
    self_kill_after = int(argv[8]) if len(argv) > 8 else 0
    reschedule = len(argv) > 9 and argv[9] == "1"
    from plugmq.broker.components import open_delay_scheduler, open_store
    from plugmq.core import AppendRequest, ManualClock, Prop, tags_code
    from plugmq.core.delaylevels import DEFAULT_DELAY_LEVELS_MS

    out = sys.stdout.fileno()
    written = 0
    clock = ManualClock(start_ms / 1000)
    store = open_store(store_plugin, data_dir, clock=clock, store_host=STORE_HOST)

    def deliver(request: AppendRequest) -> AppendResult:
        nonlocal written
        result = store.append(request)
        os.write(out, f"D {request.properties[Prop.UNIQ_KEY]}\n".encode())
        written += 1
        if written == self_kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def deliver_batch(requests: Sequence[AppendRequest]) -> list[AppendResult]:
        nonlocal written
        cut = self_kill_after - written if 0 < self_kill_after - written <= len(requests) else len(requests)
        results = store.append_batch(requests[:cut])
        os.write(out, "".join(f"D {r.properties[Prop.UNIQ_KEY]}\n" for r in requests[:cut]).encode())
        written += cut
        if written == self_kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return results

    scheduler = open_delay_scheduler(plugin, data_dir, deliver=deliver, clock=clock, store=store,
                                     was_delivered=was_delivered_in(store), store_host=STORE_HOST,
                                     deliver_batch=deliver_batch)
    scheduler.start()
    levels = scheduler.capabilities.levels_ms
    ids: list[str] = []
    for index in range(count):
        level, delay = plan(index, levels)
        due = clock.now_ms() + (delay if level is None else (levels or DEFAULT_DELAY_LEVELS_MS)[level - 1])
        props = {Prop.UNIQ_KEY: uid_of(index), Prop.TAGS: "Kill", "index": str(index),
                 Prop.DELAY_LEVEL if level is not None else Prop.DELIVER_AT_MS: str(level or due)}
        request = AppendRequest(topic=TOPIC, queue_id=index % QUEUES, body=f"kill body {index}".encode(),
                                properties=props, tags_code=tags_code("Kill"), born_timestamp_ms=start_ms)
        ids.append(scheduler.schedule(request, deliver_at_ms=due, delay_level=level).msg_id)
        os.write(out, f"S {index} {due}\n".encode())
    if reschedule:
        from plugmq.core.contracts.delay import ReschedulableDelay

        assert isinstance(scheduler, ReschedulableDelay)
        for index, msg_id in enumerate(ids):
            if scheduler.reschedule(msg_id, moved_due(index, start_ms)) is None:
                raise SystemExit(f"reschedule of pending message {index} answered None")
            os.write(out, f"R {index} {moved_due(index, start_ms)}\n".encode())
    now = clock.now_ms()
    while now < until_ms:
        now = min(until_ms, now + step_ms)
        os.write(out, f"T {now}\n".encode())
        clock.set(now / 1000)
    os.write(out, b"DONE\n")
    scheduler.close()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
