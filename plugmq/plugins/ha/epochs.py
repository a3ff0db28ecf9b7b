"""Where each master epoch began in the commit log (RocketMQ 5's EpochFileCache).

An entry ``(epoch, start)`` says: the master elected for ``epoch`` wrote its first record at log
offset ``start``. A master adds its entry when it is promoted; a slave takes its master's entries
in the handshake. Two logs whose entries agree up to some epoch hold the same bytes up to where
that epoch ended in the shorter of them: that is where a returning old master (or any slave that
followed another history) is cut before it follows the new master (:func:`consistent_point`).

The file holds one ``epoch start`` line per entry and is replaced atomically (write, fsync,
rename), so a crash leaves the old or the new list.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from plugmq.core.errors import ReplicationError

__all__ = ["EpochFile", "consistent_point"]

Entry = tuple[int, int]


def _checked(entries: Sequence[Sequence[int]]) -> list[Entry]:
    out: list[Entry] = []
    for item in entries:
        if len(item) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in item):
            raise ReplicationError(f"an epoch entry is (epoch, start offset), two integers >= 0; got {item!r}")
        epoch, start = int(item[0]), int(item[1])
        if out and (epoch <= out[-1][0] or start < out[-1][1]):
            raise ReplicationError(f"epoch entries must grow in epoch and start offset; {out[-1]} then {(epoch, start)}")
        out.append((epoch, start))
    return out


class EpochFile:
    """The epoch entries of one broker's log, in memory and in ``path``. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries: list[Entry] = []
        if path.exists():
            try:
                rows = [[int(v) for v in line.split()] for line in path.read_text("utf-8").splitlines() if line.strip()]
                self._entries = _checked(rows)
            except (ValueError, ReplicationError) as exc:
                raise ReplicationError(f"epoch file {path} is unreadable ({exc}); move it aside: the broker then "
                                       "takes its master's epochs at the next handshake") from exc

    @property
    def led_epoch(self) -> int:
        """The newest epoch this broker itself was master for (0 if none): kept in ``<path>.led``."""
        led = self.path.with_name(self.path.name + ".led")
        try:
            return int(led.read_text("utf-8").strip() or 0)
        except (OSError, ValueError):
            return 0

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries)

    @property
    def last_epoch(self) -> int:
        """The newest epoch of this log (0 when it never had an elected master)."""
        with self._lock:
            return self._entries[-1][0] if self._entries else 0

    def epoch_at(self, end: int) -> int:
        """The epoch of a log ending at ``end``: the newest entry starting at or below it."""
        with self._lock:
            found = [epoch for epoch, start in self._entries if start <= end]
        return found[-1] if found else 0

    def begin(self, epoch: int, start: int) -> None:
        """This broker became master for ``epoch`` with its log ending at ``start``."""
        with self._lock:
            kept = [(e, s) for e, s in self._entries if s <= start and e < epoch]
            self._replace(_checked([*kept, (epoch, start)]))
            _write_atomically(self.path.with_name(self.path.name + ".led"), f"{epoch}\n")

    def adopt(self, entries: Sequence[Sequence[int]], end: int) -> None:
        """Take a master's entries (a slave after the handshake cut its log to ``end``): entries
        starting beyond ``end`` are kept too (the stream will bring their records)."""
        del end  # entries ahead of the log are what the stream is about to fill
        with self._lock:
            self._replace(_checked(entries))

    def cut(self, end: int) -> None:
        """Forget entries that start beyond ``end`` (a promotion from a log that never got there)."""
        with self._lock:
            self._replace([(e, s) for e, s in self._entries if s <= end])

    def _replace(self, entries: list[Entry]) -> None:
        if entries == self._entries:
            return
        _write_atomically(self.path, "".join(f"{e} {s}\n" for e, s in entries))
        self._entries = entries


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def consistent_point(mine: Sequence[Entry], my_end: int, theirs: Sequence[Entry], their_end: int) -> int | None:
    """Where two logs stop being the same: the end of their newest common epoch in the shorter of
    them (RocketMQ's findLastConsistentPoint). ``mine``/``my_end``: the master's entries and log end;
    ``theirs``/``their_end``: the slave's. None when they share no epoch (histories unrelated)."""
    master = dict(mine)
    for index in range(len(theirs) - 1, -1, -1):
        epoch, start = theirs[index]
        if master.get(epoch) != start:
            continue
        their_stop = theirs[index + 1][1] if index + 1 < len(theirs) else their_end
        following = [s for e, s in mine if e > epoch]
        my_stop = following[0] if following else my_end
        return min(their_stop, my_stop)
    return None
