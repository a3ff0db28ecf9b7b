"""Child process of the transaction restart clauses: drive one transaction to a step, then SIGKILL.

Run as ``python -m plugmq.conformance._txn_child SPEC_JSON``. The spec names the data dir, the
plugins and their options, the clock start and the step. When the step is reached the child prints one JSON line
(``{"step": ..., "now": <clock seconds>, "checks": <checks seen>}``) on stdout and kills itself
with SIGKILL, so nothing after that point runs: no close, no flush, no finally. Reaching the end
without the step is exit status 3 (the plugin never got there, e.g. it bypassed
``context.deliver``).

Steps:

``in_local``                      the half is stored, the local transaction is running
``commit_before_visible``         local COMMIT recorded; killed as the real message is appended
``commit_after_visible``          local COMMIT; killed right after the real message was appended
``rolled_back``                   local ROLLBACK returned; killed after ``send_in_transaction``
``in_check``                      local UNKNOWN; killed inside the first check listener call
``check_commit_before_visible``   local UNKNOWN; the check says COMMIT; killed as it is appended
``discard_before_visible``        never decided; killed as the copy goes to the discard topic
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

STEPS = (
    "in_local",
    "commit_before_visible",
    "commit_after_visible",
    "rolled_back",
    "in_check",
    "check_commit_before_visible",
    "discard_before_visible",
)


def _kill_at_append(store: Any, topic: str, after: bool, die: Any) -> None:
    """Make the broker's store crash at the append of one topic (before or after it). The store
    object is patched, not replaced: every part of the broker holds that same object."""
    inner = store.append

    def append(request: Any) -> Any:
        if request.topic == topic and not after:
            die()
        result = inner(request)
        if request.topic == topic and after:
            die()
        return result

    store.append = append


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    out = os.dup(1)
    os.dup2(2, 1)  # whatever the broker logs goes to stderr; stdout carries the step report only
    from plugmq.broker.broker import Broker
    from plugmq.conformance._txn_support import body_for, open_producer
    from plugmq.core import ManualClock, Message, TransactionDecision
    from plugmq.core.names import TRANS_DISCARD_TOPIC

    step = spec["step"]
    clock = ManualClock(spec["start"])
    checks = 0

    def die() -> None:
        report = {"step": step, "now": clock.now(), "checks": checks}
        os.write(out, (json.dumps(report) + "\n").encode())
        os.kill(os.getpid(), signal.SIGKILL)

    broker = Broker.open(Path(spec["data_dir"]), plugins=spec["plugins"], options=spec["options"], clock=clock)
    topic = spec["topic"]
    broker.create_topic(topic, 1)
    if step in ("commit_before_visible", "commit_after_visible", "check_commit_before_visible"):
        _kill_at_append(broker.store, topic, step == "commit_after_visible", die)
    elif step == "discard_before_visible":
        _kill_at_append(broker.store, TRANS_DISCARD_TOPIC, False, die)

    def local(_message: Message, _arg: object) -> TransactionDecision:
        if step == "in_local":
            die()
        if step.startswith("commit_"):
            return TransactionDecision.COMMIT
        if step == "rolled_back":
            return TransactionDecision.ROLLBACK
        return TransactionDecision.UNKNOWN

    def checker(_message: object) -> TransactionDecision:
        nonlocal checks
        checks += 1
        if step == "in_check":
            die()
        if step == "check_commit_before_visible":
            return TransactionDecision.COMMIT
        return TransactionDecision.UNKNOWN

    producer = open_producer(broker, spec["group"], local, checker)
    producer.send_in_transaction(Message(topic, body_for(step)))
    if step == "rolled_back":
        die()
    caps = broker.transactions.capabilities  # type: ignore[union-attr]
    horizon = caps.transaction_timeout_ms + (caps.check_max + 2) * caps.check_interval_ms + 2 * caps.schedule_resolution_ms
    for _ in range(caps.check_max + 3):  # step so a scan-based plugin gets a pass per interval too
        clock.advance(horizon / 1000 / (caps.check_max + 3))
    os.write(out, (json.dumps({"step": None, "now": clock.now(), "checks": checks}) + "\n").encode())
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
