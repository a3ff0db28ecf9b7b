"""Receive + ack consumers in a process of their own: ``python -m plugmq.measure.consumers SPEC``.

Producers and consumers are separate applications, each with its own interpreter lock, so a
benchmark's consumers run in a child (:class:`ConsumerProcess`). SPEC is JSON: ``address``,
``groups`` (``[{"group", "topic"}]``), ``threads`` (SimpleConsumer threads per group), ``batch``,
``invisible_s``, ``long_polling_s``, ``request_timeout_s``, and optionally ``seq_property`` (a
property telling messages apart: a redelivery counts as a duplicate), ``warm_property`` (messages
carrying it are warm-up, left out of the latency figures) and ``timestamped`` (the body starts
with the big-endian nanosecond send time: end-to-end latency is recorded). Each thread receives up
to ``batch`` messages and acks each one (as the official client acks: one AckMessage per message).

Protocol on stdout, one JSON object per line: ``{"ready": true}`` once every consumer started,
then ``{"unique": {group: n}, "acked": n}`` every 0.1 s, and after stdin closes (the parent's
"stop") a final line with ``"final": true``: the end-to-end latency histogram
(:class:`~plugmq.kit.histogram.Histogram`) of the measured messages, their acks per 0.1 s slot of
the wall clock, duplicates and errors.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugmq.kit.histogram import Histogram
from plugmq.measure import MeasureError
from plugmq.measure.probes import process_cpu_s

__all__ = ["ConsumerProcess", "consume", "main"]

_HEADER = struct.Struct(">q")
_REPORT_S = 0.1


class _Tally:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, set[str]] = {g["group"]: set() for g in spec["groups"]}
        self.unique = dict.fromkeys(self.seen, 0)
        self.seq_property: str | None = spec.get("seq_property")
        self.warm_property: str | None = spec.get("warm_property")
        self.timestamped = bool(spec.get("timestamped"))
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

    def acked_one(self, group: str, message: Any, received_ns: int) -> None:
        properties = message.properties
        with self.lock:
            self.acked += 1
            if self.seq_property is not None:
                seen = self.seen[group]
                seq = properties.get(self.seq_property, "")
                if seq in seen:
                    self.duplicates += 1
                    return
                seen.add(seq)
            self.unique[group] += 1
            if self.warm_property is None or self.warm_property not in properties:
                if self.timestamped:
                    self.e2e.record((received_ns - _HEADER.unpack_from(message.body)[0]) / 1e6)
                self.slots[int(time.time() * 10)] += 1

    def progress(self) -> dict[str, Any]:
        with self.lock:
            return {"unique": dict(self.unique), "acked": self.acked}


def _receive_loop(consumer: Any, group: str, tally: _Tally, stop: threading.Event, batch: int,
                  invisible_s: float) -> None:
    while not stop.is_set():
        try:
            messages = consumer.receive(batch, int(invisible_s))
        except Exception as exc:  # noqa: BLE001 - counted and reported; the thread keeps receiving
            tally.error(exc)
            stop.wait(0.05)
            continue
        received_ns = time.time_ns()
        for message in messages:
            try:
                consumer.ack(message)
            except Exception as exc:  # noqa: BLE001 - the message comes back after its invisible time
                tally.error(exc, ack=True)
                continue
            tally.acked_one(group, message, received_ns)


def consume(spec: dict[str, Any], out: Any = sys.stdout, stop_when: threading.Event | None = None) -> None:
    """Run the consumers of ``spec`` until stdin closes (or ``stop_when`` is set), printing progress to ``out``."""
    from rocketmq import FilterExpression, SimpleConsumer

    from plugmq.measure.clients import client_config

    def say(body: dict[str, Any]) -> None:
        out.write(json.dumps(body) + "\n")
        out.flush()

    tally = _Tally(spec)
    stop = stop_when or threading.Event()
    consumers: list[tuple[Any, str]] = []
    try:
        for entry in spec["groups"]:
            for _ in range(int(spec["threads"])):
                consumer = SimpleConsumer(client_config(spec["address"], spec["request_timeout_s"]), entry["group"],
                                          {entry["topic"]: FilterExpression()}, await_duration=spec["long_polling_s"])
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


class ConsumerProcess:
    """:func:`consume` in a child interpreter; the newest progress it printed, and its final figures."""

    def __init__(self, spec: Mapping[str, Any], log: Path, start_timeout_s: float = 120.0) -> None:
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop() / kill()
        self.log_path = log
        self.process = subprocess.Popen([sys.executable, "-m", "plugmq.measure.consumers", json.dumps(spec)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.progress: dict[str, Any] = {"unique": {}, "acked": 0}
        self.final: dict[str, Any] | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name="plugmq-consumer-process")
        self._reader.start()
        if not self._ready.wait(start_timeout_s) or self.process.poll() is not None:
            self.kill()
            raise MeasureError(f"the consumer process did not start within {start_timeout_s:g} s "
                               f"(exit status {self.process.poll()}); its log ends with:\n{self._tail()}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                update = json.loads(line)
            except ValueError:
                continue
            if update.get("ready"):
                self._ready.set()
            elif update.get("final"):
                self.final = update
            else:
                self.progress = update
        self._ready.set()  # the process ended: stop waiting for it

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        except OSError:
            return ""

    @property
    def acked(self) -> int:
        return int(self.progress.get("acked", 0))

    def unique(self, group: str) -> int:
        return int(self.progress.get("unique", {}).get(group, 0))

    def cpu_s(self) -> float:
        """The consumer process's CPU seconds so far (user + system, all its threads)."""
        return process_cpu_s(self.process.pid)

    def stop(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Close stdin (the consumers stop after their current receive); the final figures."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(timeout=10)
        self._log.close()
        if self.final is None:
            raise MeasureError(f"the consumer process ended without its figures (exit status "
                               f"{self.process.returncode}); its log ends with:\n{self._tail()}")
        return self.final

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._log.close()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m plugmq.measure.consumers SPEC_JSON")
    consume(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
