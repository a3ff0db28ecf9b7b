"""A stored batch's results as columns: each AppendResult is built only when it is read.

A store with the ``ColumnAppending`` capability answers a batch with one of these instead of a
list of AppendResult: its kernel writes three integers per record into one buffer, and a put of
100 messages whose caller reads one result builds one result, not 100.
"""

from __future__ import annotations

from collections.abc import Sequence

from plugmq.core.errors import ValidationError
from plugmq.core.message import AppendResult, AppendStatus, BuiltWhenRead

__all__ = ["AppendColumns"]

_ROW = 3  # queue offset, commit-log offset, size
_trusted = AppendResult.trusted


class AppendColumns(BuiltWhenRead[AppendResult]):
    """The results of one batch append: per record its queue offset, commit-log offset and size.

    All records of one batch share their status and store timestamp. Each message id is
    ``msg_id_prefix`` followed by the record's commit-log offset as 16 upper-case hex digits
    (RocketMQ's offset message id). Equal to any sequence of the same AppendResults; pickles as
    a list. Read-only.
    """

    __slots__ = ("_prefix", "_rows", "_status", "_ts")
    _rows: Sequence[int]
    _prefix: str
    _ts: int
    _status: AppendStatus

    def __init__(self, rows: Sequence[int], msg_id_prefix: str, store_timestamp_ms: int,
                 status: AppendStatus = AppendStatus.PUT_OK) -> None:
        if len(rows) % _ROW:
            raise ValidationError(f"append columns need {_ROW} integers per record, got {len(rows)}")
        for name, value in (("_rows", rows), ("_prefix", msg_id_prefix), ("_ts", store_timestamp_ms),
                            ("_status", status)):
            object.__setattr__(self, name, value)

    @property
    def status(self) -> AppendStatus:
        """The status every record of the batch shares."""
        return self._status

    def queue_offsets(self) -> list[int]:
        """Each record's queue offset, in order: one column read, no AppendResult built."""
        column = self._rows[0::_ROW]
        return column.tolist() if isinstance(column, memoryview) else list(column)

    def with_status(self, status: AppendStatus) -> AppendColumns:
        """The same records with another status (a sync flush that timed out: FLUSH_DISK_TIMEOUT)."""
        return AppendColumns(self._rows, self._prefix, self._ts, status)

    @property
    def end_offset(self) -> int:
        """The commit-log offset just after the batch's last record (0 for an empty batch)."""
        rows = self._rows
        return rows[-2] + rows[-1] if rows else 0

    def __len__(self) -> int:
        return len(self._rows) // _ROW

    def _result(self, index: int) -> AppendResult:
        rows = self._rows
        at = index * _ROW
        if at < 0:
            at += len(rows)
        if not 0 <= at < len(rows):
            raise IndexError(f"append result {index} of a batch of {len(self)}")
        phys = rows[at + 1]
        return _trusted(self._status, f"{self._prefix}{phys:016X}", rows[at], phys, rows[at + 2], self._ts)
