"""The consumers of a served workload, in a process of their own: ``python -m plugmq.spark.served_consumer SPEC``.

SPEC is JSON: ``address``, ``groups`` (``[{"group", "topic"}]``), ``threads`` (SimpleConsumer
threads per group), ``batch``, ``invisible_s``, ``long_polling_s``, ``request_timeout_s``. Each
thread has its own official-client ``SimpleConsumer``; it receives up to ``batch`` messages and
acks each one (as the client acks: one AckMessage per message). Messages are told apart by the
replay's sequence property, so a redelivery counts as a duplicate.

Protocol on stdout, one JSON object per line: ``{"ready": true}`` once every consumer started,
then ``{"unique": {group: n}, "acked": n}`` every 0.1 s, and after stdin closes (the parent's
"stop") a final line with ``"final": true``, the end-to-end latency histogram of the measured
messages (receive time minus the send timestamp in the body's first 8 bytes, warm-up excluded),
their acks per 0.1 s slot of the wall clock, duplicates and errors.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
from collections import Counter
from typing import Any

from plugmq.spark.histogram import Histogram
from plugmq.spark.workload import SEQ, WARM

__all__ = ["consume", "main"]

_HEADER = struct.Struct(">q")
_REPORT_S = 0.1


class _Tally:
    def __init__(self, groups: list[str]) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, set[str]] = {g: set() for g in groups}
        self.acked = 0
        self.duplicates = 0
        self.errors = 0
        self.ack_errors = 0
        self.first_error = ""
        self.e2e = Histogram()
        self.slots: Counter[int] = Counter()

    def error(self, exc: BaseException, *, ack: bool = False) -> None:
        with self.lock:
            if ack:
                self.ack_errors += 1
            else:
                self.errors += 1
            self.first_error = self.first_error or repr(exc)

    def progress(self) -> dict[str, Any]:
        with self.lock:
            return {"unique": {g: len(s) for g, s in self.seen.items()}, "acked": self.acked}


def _receive_loop(consumer: Any, group: str, tally: _Tally, stop: threading.Event, batch: int,
                  invisible_s: float) -> None:
    while not stop.is_set():
        try:
            messages = consumer.receive(batch, int(invisible_s))
        except Exception as exc:  # noqa: BLE001 - counted and reported; the thread keeps receiving
            tally.error(exc)
            time.sleep(0.05)
            continue
        received_ns = time.time_ns()
        for message in messages:
            try:
                consumer.ack(message)
            except Exception as exc:  # noqa: BLE001 - the message comes back after its invisible time
                tally.error(exc, ack=True)
                continue
            properties = message.properties
            seq = properties.get(SEQ, "")
            with tally.lock:
                tally.acked += 1
                seen = tally.seen[group]
                if seq in seen:
                    tally.duplicates += 1
                    continue
                seen.add(seq)
                if WARM not in properties:
                    tally.e2e.record((received_ns - _HEADER.unpack_from(message.body)[0]) / 1e6)
                    tally.slots[int(time.time() * 10)] += 1


def consume(spec: dict[str, Any], out: Any = sys.stdout, stop_when: threading.Event | None = None) -> None:
    """Run the consumers of ``spec`` until stdin closes (or ``stop_when`` is set), printing progress to ``out``."""
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    def say(body: dict[str, Any]) -> None:
        out.write(json.dumps(body) + "\n")
        out.flush()

    groups = [g["group"] for g in spec["groups"]]
    tally = _Tally(groups)
    stop = stop_when or threading.Event()
    consumers: list[tuple[Any, str]] = []
    try:
        for entry in spec["groups"]:
            for _ in range(int(spec["threads"])):
                config = ClientConfiguration(spec["address"], Credentials(), request_timeout=spec["request_timeout_s"])
                consumer = SimpleConsumer(config, entry["group"], {entry["topic"]: FilterExpression()},
                                          await_duration=spec["long_polling_s"])
                consumer.startup()
                consumers.append((consumer, entry["group"]))
        say({"ready": True})
        threads = [threading.Thread(target=_receive_loop, args=(c, g, tally, stop, int(spec["batch"]),
                                                                float(spec["invisible_s"])), daemon=True)
                   for c, g in consumers]
        for thread in threads:
            thread.start()
        if stop_when is None:
            def until_stdin_closes() -> None:
                while os.read(sys.stdin.fileno(), 4096):  # raw reads: no buffer lock held at exit
                    pass
                stop.set()

            threading.Thread(target=until_stdin_closes, daemon=True).start()
        while not stop.wait(_REPORT_S):
            say(tally.progress())
        for thread in threads:
            thread.join()
    finally:
        for consumer, _group in consumers:
            try:
                consumer.shutdown()
            except Exception as exc:  # noqa: BLE001 - reported; the figures are already counted
                tally.error(exc)
    progress = tally.progress()  # takes the lock itself
    with tally.lock:
        say({**progress, "final": True, "duplicates": tally.duplicates, "errors": tally.errors,
             "ack_errors": tally.ack_errors, "first_error": tally.first_error, "e2e": tally.e2e.to_json(),
             "slots": {str(k): v for k, v in sorted(tally.slots.items())}})


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m plugmq.spark.served_consumer SPEC_JSON")
    consume(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
