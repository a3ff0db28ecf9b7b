"""A full disk never kills the process: every store answers with StoreFullError, reopens on the
full disk, loses nothing it acknowledged and writes again once space is freed.

The store runs in a child process on a small tmpfs, so a SIGBUS (the old store_mmap's death on a
full file system) would show as a child killed by a signal. Needs root for ``mount -t tmpfs``.
Run as a script (``python test_disk_full.py child STORE DIR``) this file is that child: it talks
to the test over stdin/stdout, one line per step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.children import ROOT, child_command

FS_BYTES = 12 << 20
FILLER_BYTES = 5 << 20
BODY = 1024
TOPIC = "Full"
OPTIONS: dict[str, dict[str, object]] = {
    # Watermarks off: the file system itself runs out, the case that used to end in SIGBUS.
    "store_mmap": {"flush": "sync", "commit_log_segment_size": 1 << 20, "consume_queue_entries_per_file": 4096,
                   "index_slot_count": 1021, "index_max_entries": 8192, "disk_max_used_ratio": 1.0,
                   "disk_force_clean_ratio": 1.0, "disk_critical_ratio": 1.0},
    "store_lmdb": {"flush": "sync", "map_size": 1 << 20},
    "store_rocks": {"flush": "sync", "write_buffer_size": 1 << 20},
}


def body_for(i: int) -> bytes:
    return i.to_bytes(4, "big") * (BODY // 4)


# -- the child ------------------------------------------------------------------------------------


def child(store: str, directory: str) -> None:
    from plugmq.broker.broker import Broker
    from plugmq.core import Message
    from plugmq.core.errors import StoreFullError

    out = os.dup(1)
    os.dup2(2, 1)  # the broker's logs go to stderr; stdout carries only the steps

    def say(**fields: object) -> None:
        os.write(out, (json.dumps(fields) + "\n").encode())

    def open_broker() -> Broker:
        return Broker.open(directory, plugins=[store, "filter_tag"], options={store: OPTIONS[store]})

    broker = open_broker()
    broker.create_topic(TOPIC, 1)
    sent = 0
    started = time.monotonic()
    first_error = ""
    while True:
        try:
            broker.put(Message(TOPIC, body_for(sent)), 0)
        except StoreFullError as exc:
            first_error = str(exc)
            break
        say(ack=sent)
        sent += 1
    refused = 0
    for _ in range(20):  # the process survives repeated attempts on a full disk
        try:
            broker.put(Message(TOPIC, body_for(sent)), 0)
        except StoreFullError:
            refused += 1
    broker.close()
    broker = open_broker()  # reopens on the full disk
    reopened_max = broker.max_offset(broker.topic_queues(TOPIC)[0])
    try:
        broker.put(Message(TOPIC, body_for(sent)), 0)
        still_full = False
    except StoreFullError:
        still_full = True
    say(full=sent, error=first_error, refused=refused, reopened_max=reopened_max, still_full=still_full,
        seconds=round(time.monotonic() - started, 3))
    assert sys.stdin.readline().strip() == "freed"
    resumed = 0
    for _ in range(50):
        broker.put(Message(TOPIC, body_for(sent)), 0)
        say(ack=sent)
        sent += 1
        resumed += 1
    broker.close()
    say(done=sent, resumed=resumed)


# -- the test ---------------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts a small tmpfs to fill (mount -t tmpfs)")
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("store", sorted(OPTIONS))
def test_disk_full_refuses_survives_keeps_and_resumes(small_fs: Path, store: str) -> None:
    filler = small_fs / "filler"
    filler.write_bytes(os.urandom(FILLER_BYTES))
    data = small_fs / "data"
    proc = subprocess.Popen(child_command(__file__, "child", store, str(data)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    acked: list[int] = []
    full: dict[str, object] = {}
    done: dict[str, object] = {}
    try:
        assert proc.stdout is not None and proc.stdin is not None
        for line in proc.stdout:
            event = json.loads(line)
            if "ack" in event:
                acked.append(event["ack"])
            elif "full" in event:
                full = event
                filler.unlink()  # an operator frees space
                proc.stdin.write("freed\n")
                proc.stdin.flush()
            elif "done" in event:
                done = event
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0, f"the child died (signal {-proc.returncode} if < 0): {stderr[-3000:]}"
    assert full, "the disk never filled"
    assert "no space left" in str(full["error"]) and str(data) in str(full["error"]), full["error"]
    assert full["refused"] == 20 and full["still_full"] is True
    assert full["reopened_max"] == full["full"], "reopened on the full disk with every acknowledged message"
    assert done["resumed"] == 50
    assert acked == list(range(len(acked)))

    from plugmq.broker.broker import Broker
    from plugmq.core import ManualClock, MessageQueue

    with Broker.open(data, plugins=[store, "filter_tag"], options={store: OPTIONS[store]},
                     clock=ManualClock()) as broker:
        queue = MessageQueue(TOPIC, broker.name, 0)
        got: list[bytes] = []
        while len(got) < broker.max_offset(queue):
            batch = broker.pull(queue, len(got), 256).messages
            assert batch, "a gap in the queue"
            got += [m.body for m in batch]
        assert got == [body_for(i) for i in acked], "every acknowledged message, intact, nothing else"
    print(f"\nFIGURES disk full {store}: tmpfs {FS_BYTES >> 20} MiB with a {FILLER_BYTES >> 20} MiB filler; "
          f"{full['full']} x {BODY} B acked before StoreFullError after {full['seconds']} s; 20/20 further sends "
          f"refused; reopened on the full disk with {full['reopened_max']} messages; filler deleted -> "
          f"{done['resumed']} more acked; {len(acked)} intact after reopen")


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "child":
    child(sys.argv[2], sys.argv[3])
