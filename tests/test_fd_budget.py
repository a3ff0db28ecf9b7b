"""File descriptors: a broker holds none per queue, and a full descriptor table is a clear error.

Every broker here runs in a child process with a small RLIMIT_NOFILE (soft = hard, so it cannot
lift it): ``plugmq serve`` with 320 queues under 32 descriptors, ten queues per descriptor
(``plugmq bench queues`` runs the full 10,000 under 1,024), and a broker whose table a child fills with /dev/null descriptors.
Run as a script (``python test_fd_budget.py child DIR``) this file is that second child: it prints
one JSON line per step.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.bench.queues import run_queues
from plugmq.testing import ServeProcess

LIMIT = 64


def child(directory: str) -> None:
    from plugmq.broker.broker import Broker
    from plugmq.core import Message
    from plugmq.core.errors import DescriptorLimitError

    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
    out = os.dup(1)

    def say(**fields: object) -> None:
        os.write(out, (json.dumps(fields) + "\n").encode())

    broker = Broker.open(directory, plugins=["store_mmap"])
    broker.create_topic("Before", 2)
    for q in range(2):
        broker.put(Message("Before", f"before-{q}".encode()), queue_id=q)
    held: list[int] = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    try:
        broker.put(Message("NewTopic", b"refused"), queue_id=0)
        say(step="full", error=None)
    except DescriptorLimitError as exc:
        say(step="full", error=str(exc))
    consumer = broker.simple_consumer("g", {"Before": "*"})
    received = consumer.receive(8, 30)  # the pop-state journal keeps working
    for message in received:
        consumer.ack(message)
    say(step="received", bodies=sorted(m.body.decode() for m in received))
    for fd in held:
        os.close(fd)
    broker.put(Message("NewTopic", b"after"), queue_id=0)
    broker.close()
    broker = Broker.open(directory, plugins=["store_mmap"])
    consumer = broker.simple_consumer("g2", {"NewTopic": "*"})
    say(step="reopened", bodies=[m.body.decode() for m in consumer.receive(8, 30)],
        inflight_of_g=broker.pop.inflight_count("g"))
    broker.close()


def test_a_full_descriptor_table_refuses_new_queue_files_clearly_and_breaks_nothing_else(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, __file__, "child", str(tmp_path / "data")], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = {line["step"]: line for line in map(json.loads, run.stdout.splitlines())}
    error = steps["full"]["error"]
    assert error is not None, "a put needing new files succeeded with a full descriptor table"
    assert f"RLIMIT_NOFILE soft {LIMIT}" in error and "ulimit -n" in error and "nothing stored is lost" in error
    assert steps["received"]["bodies"] == ["before-0", "before-1"]
    assert steps["reopened"]["bodies"] == ["after"]
    assert steps["reopened"]["inflight_of_g"] == 0  # the acks made while the table was full were kept


@pytest.mark.slow
def test_ten_times_more_queues_than_descriptors_serve_send_receive_and_restart(tmp_path: Path) -> None:
    # 320 queues under 32 descriptors: the server starts with about 14 open, so a descriptor per
    # queue would run out twenty times over; each queue's files cost ~20 ms to create, hence not 2,000.
    topics, queues, fd_limit = 40, 8, 32
    run = run_queues(tmp_path, topics=topics, queues=queues, fd_limit=fd_limit)  # raises on a refused or missing message
    assert topics * queues >= 10 * fd_limit
    by_name = {phase.name: phase for phase in run.phases}
    assert set(by_name) == {f"{what} {r}" for what in ("start", "send", "receive") for r in (1, 2)}
    # No descriptor per queue: the server holds as many after all the queues as right after start.
    assert by_name["receive 2"].descriptors <= by_name["start 1"].descriptors + 8
    # One mapping per consume-queue file (and the few of the commit log, the index, the journals).
    assert by_name["receive 2"].mappings < by_name["start 1"].mappings + topics * queues + 200


def test_serve_lifts_its_soft_descriptor_limit_to_the_hard_one_and_warns_when_it_is_low(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\ndata_dir = "data"\nplugins = ["store_mmap"]\n', encoding="utf-8")
    soft, hard = 128, 512
    server = ServeProcess(config, fd_limit=(soft, hard))
    try:
        server.await_address()
        limits = Path(f"/proc/{server.process.pid}/limits").read_text()
    finally:
        server.stop()
    line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    assert line.split()[3:5] == [str(hard), str(hard)]
    log = server.log_path.read_text()
    assert "open-file limit is low" in log and f"soft={hard}" in log


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(sys.argv[2])
