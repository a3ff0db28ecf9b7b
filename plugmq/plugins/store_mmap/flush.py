"""Flushing: group commit for sync flush, and the background flush thread.

Sync flush (RocketMQ's GroupCommitService, done leader/follower style): a writer whose record is
not durable yet either becomes the leader - flushes the commit log up to its *current* end,
covering every record written meanwhile - or waits on a condition for the leader to finish. One
fdatasync therefore serves all writers that queued up during the previous one; fdatasync
releases the GIL, so writers keep appending while it runs. A writer that is not covered within
``sync_flush_timeout_ms`` gets False (the store reports FLUSH_DISK_TIMEOUT).

Waiting here is real I/O time (time.monotonic), not the broker's Clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from plugmq.core.logs import get_logger
from plugmq.plugins.store_mmap.commitlog import CommitLog

__all__ = ["FlushService", "GroupCommit"]

log = get_logger(__name__)
_REPEAT_REPORT_S = 60.0  # how often a failure that keeps coming back is reported again

PAGE = 4096


class GroupCommit:
    def __init__(self, commit_log: CommitLog, timeout_ms: int) -> None:
        self._cl = commit_log
        self._timeout = timeout_ms / 1000.0
        self._cond = threading.Condition(threading.Lock())
        self._flushing = False
        self.timeouts = 0
        self.leader_flushes = 0

    def wait(self, end: int) -> bool:
        """Block until the commit log is durable up to ``end``; False on timeout or flush error."""
        cl = self._cl
        if cl.flushed >= end:
            return True
        deadline = time.monotonic() + self._timeout
        cond = self._cond
        with cond:
            while cl.flushed < end:
                if not self._flushing:
                    self._flushing = True
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.timeouts += 1
                    return False
                cond.wait(remaining)
            else:
                return True
        try:
            cl.flush(deadline)
            self.leader_flushes += 1
        except OSError:
            log.exception("sync flush of the commit log failed")
        finally:
            with cond:
                self._flushing = False
                cond.notify_all()
        if cl.flushed >= end and time.monotonic() <= deadline:
            return True
        self.timeouts += 1
        return False


class FlushService:
    """One daemon thread: commit-log flush (async mode), derived-file flush + checkpoint, and
    housekeeping, each on its own real-time interval. With ``catch_up`` it first flushes the
    commit log once, whatever the mode: records a crashed process left in the page cache, which
    the store opened without waiting for."""

    def __init__(
        self,
        commit_log: CommitLog,
        *,
        flush_commit_log: bool,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        derived_interval_ms: int,
        flush_derived: Callable[[], None],
        housekeeping: Callable[[], None],
        catch_up: bool = False,
    ) -> None:
        self._cl = commit_log
        self._catch_up = catch_up
        self._flush_cl = flush_commit_log
        self._interval = interval_ms / 1000.0
        self._least_bytes = least_pages * PAGE
        self._thorough = thorough_interval_ms / 1000.0
        self._derived_interval = derived_interval_ms / 1000.0
        self._flush_derived = flush_derived
        self._housekeeping = housekeeping
        self._stop = threading.Event()
        self._failing: str | None = None  # the failure being repeated, if any
        self._reported_at = 0.0
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="store_mmap-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        tick = min(self._interval, self._derived_interval)
        now = time.monotonic()
        next_thorough = now + self._thorough
        next_derived = now + self._derived_interval
        if self._catch_up:
            try:
                self._cl.flush()
            except OSError:  # the next rounds (or the first sync write) try again
                log.exception("flushing the commit log recovered after a crash failed")
        while not self._stop.wait(tick):
            try:
                now = time.monotonic()
                if self._flush_cl:
                    dirty = self._cl.wrote - self._cl.flushed
                    if dirty > 0 and (dirty >= self._least_bytes or now >= next_thorough):
                        self._cl.flush()
                        next_thorough = now + self._thorough
                if now >= next_derived:
                    self._flush_derived()
                    next_derived = now + self._derived_interval
                self._housekeeping()
            except Exception as exc:  # noqa: BLE001 - the thread must survive one bad round; reported
                self._report_failure(exc)
            else:
                self._report_recovery()

    def _report_failure(self, exc: Exception) -> None:
        """The first failure of a kind with its traceback; the same failure again (say, a data dir
        deleted under a running store) once a minute with a count, not every tick."""
        key = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if key != self._failing or now - self._reported_at >= _REPEAT_REPORT_S:
            if key == self._failing:
                log.error("background flush still failing", error=key, failures=self._failures)
            else:
                log.exception("background flush failed", error=key, dir=str(self._cl.dir))
            self._failing, self._reported_at, self._failures = key, now, 0
        self._failures += 1

    def _report_recovery(self) -> None:
        if self._failing is not None:
            log.info("background flush works again", error=self._failing, after_failures=self._failures,
                     dir=str(self._cl.dir))
            self._failing, self._failures = None, 0

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
