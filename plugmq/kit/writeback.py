"""A delay plugin's write-back of due messages, and what reached the store when it failed."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from plugmq.core.contracts import Deliver, DeliverBatch, WasDelivered
from plugmq.core.message import AppendRequest

__all__ = ["WriteBackOutcome", "write_back"]


@attrs.frozen
class WriteBackOutcome:
    """``stored``: None when every message was stored, else which ones reached the store (the
    rest stay with the plugin and are retried). ``error``: what the write-back raised, if anything."""

    stored: list[bool] | None
    error: Exception | None = None


def write_back(requests: Sequence[AppendRequest], deliver: Deliver, deliver_batch: DeliverBatch | None,
               was_delivered: WasDelivered | None) -> WriteBackOutcome:
    """Deliver ``requests`` in order: as one batch when the broker offers ``deliver_batch``, else
    one by one. Never raises: a failure is returned with which messages were stored anyway."""
    done = 0
    try:
        if deliver_batch is not None:
            deliver_batch(requests)
        else:
            for request in requests:
                deliver(request)
                done += 1
        return WriteBackOutcome(None)
    except Exception as exc:  # noqa: BLE001 - whatever the store raised, the plugin keeps and retries them
        error = exc
    if deliver_batch is None:  # one at a time: the ones before the failure are stored
        return WriteBackOutcome([i < done for i in range(len(requests))], error)
    return WriteBackOutcome([was_delivered is not None and was_delivered(r) for r in requests], error)
