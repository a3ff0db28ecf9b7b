"""Child processes the kill clauses run and SIGKILL (storage, delay): start, read, kill, collect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["run_until_killed"]


def run_until_killed(module: str, args: Sequence[str], log_path: Path,
                     enough: Callable[[bytes], bool] | None) -> bytes:
    """Run ``python -m module args...``; SIGKILL it once ``enough(its stdout so far)`` holds.

    ``enough=None``: the child kills itself. Its stderr goes to ``log_path`` (a file, not a pipe:
    a chatty child must never block). Returns everything it wrote to stdout; a last line without
    a newline was cut by the kill. Fails, with the log's tail, when the child exits on its own
    first, or when it did not die by SIGKILL.
    """
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=log_file)
    assert proc.stdout is not None
    received = b""
    try:
        while enough is None or not enough(received):
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.wait()
                if enough is None:
                    break  # it killed itself (checked below)
                raise AssertionError(f"the child exited before the kill (code {proc.returncode}); the clause cannot "
                                     f"kill it mid-work:\n{log_path.read_text(errors='replace')[-3000:]}")
            received += chunk
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        rest, _ = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, (
        f"the child was not killed (code {proc.returncode}):\n{log_path.read_text(errors='replace')[-3000:]}")
    return received + rest
