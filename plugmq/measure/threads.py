"""Work on several threads, with the first error raised in the caller (a failed worker must not
pass for a fast one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from plugmq.measure import MeasureError

__all__ = ["Background", "run_threads"]


def run_threads(threads: int, work: Callable[[int], None]) -> float:
    """Run ``work(index)`` on ``threads`` threads; the wall seconds they took. MeasureError (from
    the first error a worker raised) when one failed."""
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    workers = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise MeasureError(f"a worker thread failed: {errors[0]!r}") from errors[0]
    return elapsed


class Background:
    """:func:`run_threads` on a thread of its own; :meth:`join` raises what the workers raised."""

    def __init__(self, threads: int, work: Callable[[int], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(threads, work), daemon=True)
        self._thread.start()

    def _run(self, threads: int, work: Callable[[int], None]) -> None:
        try:
            run_threads(threads, work)
        except BaseException as exc:  # noqa: BLE001 - raised by join()
            self._error = exc

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
