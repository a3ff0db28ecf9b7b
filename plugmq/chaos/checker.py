"""The checker: what a chaos history says about every acknowledged message.

Run over the events of a :class:`~plugmq.chaos.history.History` (the run and the final
read-back through the current master), :func:`check` finds:

* **lost**: sends acked OK whose body the read-back lacks (the promise broken); ``lost_seen``
  counts those a consumer had even received before they vanished;
* **redelivered after an OK ack**: a delivery to a group invoked after an ack of the same message
  by that group had been answered OK (the other broken promise);
* **position conflicts**: one (queue, offset) that held two different messages, by whatever saw
  it: a send receipt naming its queue, a delivery, the read-back;
* **reordered**: two messages of one producer thread (it sends one at a time, so the later was
  sent after the earlier was acked) stored in one queue in the opposite order;
* **acks by a deposed master**: a send acked by a broker after another broker was seen master
  under a newer epoch (split brain; from the role samples, so a late sample can only hide one),
  and the longest such window;
* **duplicates**: extra deliveries of a message to a group (at-least-once allows them; counted)
  and messages stored more than once (a failed send stored anyway, then sent again);
* per fault window: the losses it caused (each lost message charged to the first window that
  ends after it was acked), the redeliveries after an OK ack from its injection to the next one,
  and the recovery time, from the injection to the first send, and the
  first receive, invoked after it that succeeded.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

import attrs

from plugmq.chaos.history import Ack, Delivery, Event, FaultWindow, Readback, Receive, RoleSample, Send

__all__ = ["CheckResult", "FaultOutcome", "PositionConflict", "Redelivery", "Reordering", "StaleAck", "check"]


@attrs.frozen
class Redelivery:
    group: str
    body: str
    acked_at: float  # the OK ack was answered
    delivered_at: float  # a later receive was invoked, and handed it out again


@attrs.frozen
class PositionConflict:
    queue: int
    offset: int
    bodies: tuple[str, ...]


@attrs.frozen
class Reordering:
    producer: str
    queue: int
    earlier_seq: int  # sent (and acked) first ...
    later_seq: int  # ... yet stored before it


@attrs.frozen
class StaleAck:
    """A send acked by a master after another broker was seen master under a newer epoch."""

    broker: str
    epoch: int
    body: str
    acked_at: float
    newer_master: str
    newer_epoch: int
    newer_since: float  # when the newer master was first seen


@attrs.frozen
class FaultOutcome:
    name: str
    round: int
    target: str
    t0: float
    t1: float
    lost: int
    redelivered_after_ack: int  # redeliveries from this injection until the next one
    stale_acks: int  # acks by a deposed master, likewise
    split_brain_s: float
    send_recovery_s: float | None  # None: no send succeeded after the injection ...
    receive_recovery_s: float | None
    watched_s: float  # ... in this long: until the next injection or the history's last operation


@attrs.frozen
class CheckResult:
    sends: int
    acked: int
    send_failures: int
    read_back: int
    lost: tuple[str, ...]
    lost_seen: tuple[str, ...]
    redelivered_after_ack: tuple[Redelivery, ...]
    position_conflicts: tuple[PositionConflict, ...]
    reordered: tuple[Reordering, ...]
    duplicate_deliveries: int
    stored_twice: tuple[str, ...]
    failed_but_stored: int
    stale_acks: tuple[StaleAck, ...]
    faults: tuple[FaultOutcome, ...]

    @property
    def split_brain_s(self) -> float:
        """The longest a deposed master went on acking after a newer master was seen (0: never)."""
        return max((a.acked_at - a.newer_since for a in self.stale_acks), default=0.0)

    @property
    def promise_broken(self) -> bool:
        """An acknowledged message lost, or a message redelivered after an OK ack."""
        return bool(self.lost or self.redelivered_after_ack)

    def summary(self) -> dict[str, object]:
        """Counts for the JSON summary (the anomalies themselves are listed in the report)."""
        return {"sends": self.sends, "acked": self.acked, "send_failures": self.send_failures,
                "read_back": self.read_back, "lost": len(self.lost), "lost_seen": len(self.lost_seen),
                "redelivered_after_ack": len(self.redelivered_after_ack),
                "position_conflicts": len(self.position_conflicts), "reordered": len(self.reordered),
                "duplicate_deliveries": self.duplicate_deliveries, "stored_twice": len(self.stored_twice),
                "failed_but_stored": self.failed_but_stored, "acked_by_deposed_master": len(self.stale_acks),
                "split_brain_s": round(self.split_brain_s, 3), "promise_broken": self.promise_broken}


def _redeliveries(acks: list[Ack], deliveries: list[Delivery]) -> list[Redelivery]:
    """Deliveries of a stored message (body and position: a body stored twice is two messages)
    to a group invoked after that group's ack of it was answered OK."""
    first_ok: dict[tuple[str, str, int | None, int | None], float] = {}
    for ack in acks:
        if ack.ok:
            key = (ack.group, ack.body, ack.queue, ack.offset)
            first_ok[key] = min(first_ok.get(key, ack.t1), ack.t1)
    found = []
    for delivery in deliveries:
        acked_at = first_ok.get((delivery.group, delivery.body, delivery.queue, delivery.offset))
        if acked_at is not None and delivery.t0 > acked_at:
            found.append(Redelivery(delivery.group, delivery.body, acked_at, delivery.t0))
    return found


def _conflicts(sends: list[Send], deliveries: list[Delivery], readback: list[Readback]) -> list[PositionConflict]:
    held: dict[tuple[int, int], set[str]] = collections.defaultdict(set)
    for send in sends:
        if send.ok and send.queue is not None and send.offset is not None:
            held[(send.queue, send.offset)].add(send.body)
    seen: list[Delivery | Readback] = [*deliveries, *readback]
    for one in seen:
        if one.queue is not None and one.offset is not None:
            held[(one.queue, one.offset)].add(one.body)
    return [PositionConflict(q, o, tuple(sorted(b))) for (q, o), b in sorted(held.items()) if len(b) > 1]


def _reorderings(acked: list[Send], stored_at: dict[str, tuple[int, int]]) -> list[Reordering]:
    by_lane: dict[tuple[str, int], list[tuple[int, int]]] = collections.defaultdict(list)
    for send in acked:
        position = stored_at.get(send.body)
        if position is not None:
            by_lane[(send.producer, position[0])].append((send.seq, position[1]))
    found = []
    for (producer, queue), stored in sorted(by_lane.items()):
        stored.sort()
        highest: tuple[int, int] | None = None  # (offset, seq) of the furthest stored so far
        for seq, offset in stored:
            if highest is not None and offset < highest[0]:
                found.append(Reordering(producer, queue, highest[1], seq))
            if highest is None or offset > highest[0]:
                highest = (offset, seq)
    return found


def _ack_epoch(samples: list[RoleSample], acked_at: float) -> int | None:
    """The newest epoch a broker can have acked under at ``acked_at``, from its role samples: the
    epoch of its next sample if that one still says master (it may have been elected again between
    samples), else the epoch of its last sample as master (it was deposed, or died, since)."""
    following = next((r for r in samples if r.t >= acked_at), None)
    if following is not None and following.role.endswith("_master"):
        return following.epoch
    before = [r.epoch for r in samples if r.t < acked_at and r.role.endswith("_master")]
    return before[-1] if before else None


def _counted_stale_acks(roles: list[RoleSample]) -> list[StaleAck]:
    """Acks a broker counted under an epoch (its status' ``acked_by_epoch``) between two of its
    samples, when another broker had been seen master under a newer epoch before the first of
    them: acked after the newer master was seen, whoever the client addressed. One StaleAck per
    ack, with no body (the counts do not say which); a change seen late is missed, never invented."""
    masters = sorted((r.t, r.broker, r.epoch) for r in roles if r.role.endswith("_master") and r.epoch is not None)
    found = []
    before: dict[str, RoleSample] = {}
    for sample in sorted(roles, key=lambda r: r.t):
        earlier = before.get(sample.broker)
        if sample.acked is None:
            continue
        before[sample.broker] = sample
        if earlier is None or earlier.acked is None:
            continue
        for epoch_key, count in sample.acked.items():
            epoch, new = int(epoch_key), count - earlier.acked.get(epoch_key, 0)
            newer = next(((t, broker, e) for t, broker, e in masters
                          if broker != sample.broker and e > epoch and t <= earlier.t), None)
            if new > 0 and newer is not None:
                found += [StaleAck(sample.broker, epoch, "", sample.t, newer[1], newer[2], newer[0])] * new
    return found


def _stale_acks(sends: list[Send], roles: list[RoleSample]) -> list[StaleAck]:
    """Sends acked OK by a broker under an epoch older than that of another broker seen master
    before the send was invoked. From the role samples: a change seen late is missed, never invented."""
    masters = sorted((r.t, r.broker, r.epoch) for r in roles if r.role.endswith("_master") and r.epoch is not None)
    by_broker: dict[str, list[RoleSample]] = collections.defaultdict(list)
    for sample in sorted(roles, key=lambda r: r.t):
        by_broker[sample.broker].append(sample)
    found = []
    for send in sends:
        if not send.ok or send.broker not in by_broker:
            continue
        epoch = _ack_epoch(by_broker[send.broker], send.t1)
        if epoch is None:
            continue
        newer = next(((t, broker, e) for t, broker, e in masters
                      if broker != send.broker and e > epoch and t <= send.t0), None)
        if newer is not None:
            found.append(StaleAck(send.broker, epoch, send.body, send.t1, newer[1], newer[2], newer[0]))
    return found


def _fault_outcomes(windows: list[FaultWindow], lost_at: list[float], redelivered_at: list[float],
                    stale: list[StaleAck], sends: list[Send], receives: list[Receive]) -> list[FaultOutcome]:
    windows = sorted(windows, key=lambda w: w.t0)
    starts = [w.t0 for w in windows]
    last = max([s.t1 for s in sends] + [r.t1 for r in receives] + [w.t1 for w in windows], default=0.0)
    charged = collections.Counter[int]()
    for acked_at in lost_at:
        index = next((i for i, w in enumerate(windows) if w.t1 >= acked_at), None)
        if index is not None:
            charged[index] += 1
    outcomes = []
    for index, window in enumerate(windows):
        following = starts[index + 1] if index + 1 < len(starts) else None
        outcomes.append(_window_outcome(window, following, max(last, window.t1), charged[index], redelivered_at,
                                        stale, sends, receives))
    return outcomes


def _window_outcome(window: FaultWindow, following: float | None, last: float, lost: int,
                    redelivered_at: list[float], stale: list[StaleAck], sends: list[Send],
                    receives: list[Receive]) -> FaultOutcome:
    """One fault's outcome: what happened from its start to the next fault's (or the run's end)."""
    until = following if following is not None else last
    sent = [s.t1 for s in sends if s.ok and window.t0 <= s.t0 < until]
    received = [r.t1 for r in receives if r.ok and window.t0 <= r.t0 < until]

    def mine(t: float) -> bool:
        return t >= window.t0 and (following is None or t < following)

    redelivered = sum(1 for t in redelivered_at if mine(t))
    stale_here = [a.acked_at - a.newer_since for a in stale if mine(a.acked_at)]
    return FaultOutcome(window.name, window.round, window.target, window.t0, window.t1, lost, redelivered,
                        len(stale_here), max(stale_here, default=0.0), min(sent) - window.t0 if sent else None,
                        min(received) - window.t0 if received else None, until - window.t0)


def _stored_positions(readback: list[Readback]) -> dict[str, tuple[int, int]]:
    """Where the read-back found each body (queue, offset); the last copy where it is twice."""
    return {entry.body: (entry.queue, entry.offset) for entry in readback
            if entry.queue is not None and entry.offset is not None}


def _duplicate_deliveries(deliveries: list[Delivery]) -> int:
    """Deliveries of a body to a group beyond its first."""
    per_group = collections.Counter((d.group, d.body) for d in deliveries)
    return sum(n - 1 for n in per_group.values() if n > 1)


def _stale(roles: list[RoleSample], sends: list[Send]) -> list[StaleAck]:
    # Brokers that count their acks say who acked; otherwise the addressed broker is the guess.
    if any(r.acked is not None for r in roles):
        return _counted_stale_acks(roles)
    return _stale_acks(sends, roles)


def check(events: Iterable[Event]) -> CheckResult:
    """Check one run's history (its read-back included); see the module's docstring."""
    by_kind: dict[type, list[Any]] = collections.defaultdict(list)
    for event in events:
        by_kind[type(event)].append(event)
    sends: list[Send] = by_kind[Send]
    receives: list[Receive] = by_kind[Receive]
    deliveries: list[Delivery] = by_kind[Delivery]
    acks: list[Ack] = by_kind[Ack]
    windows: list[FaultWindow] = by_kind[FaultWindow]
    readback: list[Readback] = by_kind[Readback]
    roles: list[RoleSample] = by_kind[RoleSample]
    acked = [s for s in sends if s.ok]
    stored = collections.Counter(r.body for r in readback)
    lost_sends = [s for s in acked if s.body not in stored]
    delivered = {d.body for d in deliveries}
    redelivered = _redeliveries(acks, deliveries)
    stale = _stale(roles, sends)
    return CheckResult(
        sends=len(sends), acked=len(acked), send_failures=len(sends) - len(acked), read_back=len(readback),
        lost=tuple(s.body for s in lost_sends),
        lost_seen=tuple(s.body for s in lost_sends if s.body in delivered),
        redelivered_after_ack=tuple(redelivered),
        position_conflicts=tuple(_conflicts(sends, deliveries, readback)),
        reordered=tuple(_reorderings(acked, _stored_positions(readback))),
        duplicate_deliveries=_duplicate_deliveries(deliveries),
        stored_twice=tuple(sorted(b for b, n in stored.items() if n > 1)),
        failed_but_stored=sum(1 for s in sends if not s.ok and s.body in stored),
        stale_acks=tuple(stale),
        faults=tuple(_fault_outcomes(windows, [s.t1 for s in lost_sends], [r.delivered_at for r in redelivered],
                                     stale, sends, receives)))
