"""The transaction service: half messages in the store, decisions in the op log, check-back.

Flow of one transaction (``h`` = the half's offset in the half queue, its id in the op log):

* ``prepare``: the half goes to ``TRANS_HALF_TOPIC`` (see ``halves``); ``h`` becomes open and due
  for its first check at store time + transaction timeout (or + its check-immunity time).
* ``end(COMMIT)``: record ``C h mark`` (fsync), where ``mark`` is the real queue's max offset; then
  ``context.deliver`` the real message; then ``D h``. ``end(ROLLBACK)``: record ``R h`` (fsync).
  Whoever takes ``h`` out of the open set under the lock decides; a second decision finds it
  gone and has no effect.
* check pass (one clock timer at the earliest due time): for a due ``h`` whose group has a live
  checker, record ``K h n`` for the batch (fsync), then ask; UNKNOWN leaves it due again one
  interval later. After ``check_max`` checks the next due time discards it: ``T h mark``, the
  copy on ``TRANS_DISCARD_TOPIC``, ``D h``, and a warning. No live checker: parked, not counted.
* ``start``: replay the op log, rescan the half queue above the watermark: open halves come back
  with their check counts; a ``C``/``T`` without ``D`` is delivered unless the target queue already
  holds the message's unique id from ``mark`` on (the crash came after the store took it).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from itertools import chain

from plugmq.core import (
    AppendRequest,
    AppendResult,
    Prop,
    StoredMessage,
    TransactionCapabilities,
    TransactionContext,
    TransactionDecision,
    TransactionError,
    ValidationError,
)
from plugmq.core.clock import Timer
from plugmq.core.contracts.transaction import TransactionChecker
from plugmq.core.errors import PluginError
from plugmq.core.logs import get_logger
from plugmq.core.message import decode_msg_id
from plugmq.core.names import TRANS_DISCARD_TOPIC, TRANS_HALF_TOPIC, validate_group
from plugmq.plugins.txn import oplog
from plugmq.plugins.txn.halves import (
    HALF_QUEUE,
    checker_view,
    commit_request,
    discard_request,
    half_request,
    immunity_ms,
    real_queue,
)
from plugmq.plugins.txn.oplog import OpLog, OpState, record
from plugmq.plugins.txn.options import TxnOptions
from plugmq.plugins.txn.schedule import OpenTxn, Schedule

__all__ = ["PLUGIN_NAME", "TxnService", "capabilities_for"]

log = get_logger(__name__)

PLUGIN_NAME = "txn"
_SCAN_CHUNK = 1024
_CLEAN_MIN_BYTES = 64 << 10  # retention leaves a smaller op log alone (rewriting it gains nothing)


def capabilities_for(options: TxnOptions) -> TransactionCapabilities:
    return TransactionCapabilities(
        check_immunity=True, delayed_transactions=False, persistent_check_count=True,
        transaction_timeout_ms=options.timeout_ms, check_interval_ms=options.interval_ms,
        check_max=options.check_max, schedule_resolution_ms=0,
    )


class TxnService:
    """RocketMQ's transactional message service with a file op log. Thread-safe."""

    def __init__(self, context: TransactionContext, options: TxnOptions) -> None:
        if context.store is None or context.deliver is None or context.journal is None:
            raise PluginError("the txn plugin needs a TransactionContext with a store, a deliver callback and a "
                              "state journal (a broker gives all three)")
        self._store = context.store
        self._deliver = context.deliver
        self._clock = context.clock
        self._options = options
        self.capabilities = capabilities_for(options)
        self._oplog = OpLog(context.journal, fsync=options.fsync, legacy=context.data_dir / PLUGIN_NAME / "oplog")
        self._lock = threading.RLock()
        self._schedule = Schedule()
        self._decided: dict[int, tuple[int, int]] = {}  # decided, effect not yet recorded as done
        self._decided_at: dict[int, int] = {}  # their halves' commit-log offsets (retention keeps them)
        self._terminal: set[int] = set()  # settled halves at or above the watermark
        self._watermark = 0
        self._half_high = 0
        self._checkers: dict[str, list[TransactionChecker]] = {}
        self._timer: Timer | None = None
        self._armed_ms: int | None = None
        self._arm_seq = 0
        self._compact_at = options.compact_bytes
        self._preparing = 0  # halves appended but not yet open: compaction must not pass them
        self._started = False
        self._closed = False
        self._metrics: Counter[str] = Counter()
        if context.retention is not None:
            # Open and undelivered halves stay in the store however old they get.
            context.retention.hold(PLUGIN_NAME, self._lowest_needed)

    # ------------------------------------------------------------------------------ contract
    def prepare(self, request: AppendRequest, producer_group: str) -> AppendResult:
        self._check_running()
        validate_group(producer_group)
        half = half_request(request, producer_group)
        first = immunity_ms(half.properties)
        with self._lock:
            self._preparing += 1
        try:
            result = self._store.append(half)
        except BaseException:
            with self._lock:
                self._preparing -= 1
            raise
        due = result.store_timestamp_ms + (self._options.timeout_ms if first is None else first)
        with self._lock:
            self._preparing -= 1
            self._schedule.add(OpenTxn(result.queue_offset, result.commit_log_offset, result.size,
                                       producer_group, 0, due))
            self._half_high = max(self._half_high, result.queue_offset + 1)
            self._metrics["prepared"] += 1
        self._arm()
        return result

    def end(self, msg_id: str, decision: TransactionDecision, *, from_check: bool = False) -> bool:
        self._check_running()
        if not isinstance(decision, TransactionDecision):
            raise TransactionError(f"decision must be a TransactionDecision, got {decision!r}")
        try:
            _, commit_log_offset = decode_msg_id(msg_id)
        except ValidationError as exc:
            raise TransactionError(f"{msg_id!r} is not a transaction id: {exc}") from exc
        with self._lock:
            half = self._schedule.by_offset.get(commit_log_offset)
        if half is None:
            self._require_half(msg_id, commit_log_offset)
            if not from_check:
                log.info("decision for a settled transaction ignored", msg_id=msg_id, decision=decision.name)
            with self._lock:
                self._metrics["repeated_decisions"] += 1
            return False
        if decision is TransactionDecision.UNKNOWN:
            return True
        return self._decide(half, oplog.COMMIT if decision is TransactionDecision.COMMIT else oplog.ROLLBACK)

    def register_checker(self, producer_group: str, checker: TransactionChecker) -> None:
        validate_group(producer_group)
        with self._lock:
            self._checkers.setdefault(producer_group, []).append(checker)
            woken = self._schedule.unpark(producer_group, self._now_ms())
        if woken:
            log.info("checks resumed for producer group", group=producer_group, transactions=woken)
        self._arm()

    def unregister_checker(self, producer_group: str, checker: TransactionChecker) -> None:
        with self._lock:
            live = self._checkers.get(producer_group, [])
            if checker in live:
                live.remove(checker)
            if not live:
                self._checkers.pop(producer_group, None)

    def pending(self) -> int:
        with self._lock:
            return len(self._schedule)

    def metrics(self) -> Mapping[str, float]:
        with self._lock:
            return {**self._metrics, "open": len(self._schedule), "op_log_bytes": self._oplog.size}

    def clean_expired(self, now_ms: int) -> int:
        """Rewrite the op log without the records of settled transactions once they make up most
        of it (at least ``_CLEAN_MIN_BYTES``), instead of waiting for ``compact_bytes``, or when its
        latest snapshot holds the store's retention back; returns 1 when a snapshot replaced the
        records, else 0. Half messages live in the store, whose
        retention removes them; open and undelivered ones are held there (``_lowest_needed``)."""
        with self._lock:
            if self._closed or not self._started or self._preparing:
                return 0
            low = min(chain(self._schedule.open, self._decided), default=self._half_high)
            live = 1 + len(self._decided) + sum(1 for h in self._terminal if h >= low) + sum(
                1 for t in self._schedule.open.values() if t.checks)
            if self._oplog.size < max(_CLEAN_MIN_BYTES, 2 * live * oplog.RECORD_SIZE) and not self._oplog.snapshot_due:
                return 0
            before = self._oplog.size
            self._compact()
            log.info("transaction op log compacted by retention", bytes_before=before, bytes_after=self._oplog.size,
                     watermark=self._watermark)
            return 1

    def _lowest_needed(self) -> int | None:
        """The lowest commit-log offset of a half still needed: open, or decided but not yet
        delivered (a restart delivers it from the store). Before ``start`` every half is."""
        with self._lock:
            if not self._started:
                return 0
            return min(chain((t.commit_log_offset for t in self._schedule.open.values()),
                             self._decided_at.values()), default=None)

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            state = self._oplog.replay()
            self._watermark = state.watermark
            self._terminal = state.terminal
            redo = self._load_halves(state)
            self._started = True
        for half, (kind, mark), stored, checks in redo:
            self._complete(half, kind, mark, stored, checks, recovering=True)
        with self._lock:
            self._maybe_compact()
        log.info("transaction service started", open=len(self._schedule), finished_on_recovery=len(redo),
                 watermark=self._watermark)
        self._arm()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._oplog.close()

    # ------------------------------------------------------------------------------ decisions
    def _decide(self, half: int, kind: int, stored: StoredMessage | None = None) -> bool:
        """Record decision ``kind`` for open ``half`` durably, then apply it. False if not open."""
        with self._lock:
            txn = self._schedule.open.get(half)
        if txn is None:
            return False
        return self._apply([(txn, kind, stored)]) == 1

    def _apply(self, decisions: list[tuple[OpenTxn, int, StoredMessage | None]]) -> int:
        """Record a batch of decisions with one op-log sync, then apply them; returns how many
        were taken (a transaction no longer open is skipped: someone else decided it first)."""
        stored_of = {}
        for txn, _kind, stored in decisions:
            stored_of[txn.half] = stored if stored is not None else self._store.read(txn.commit_log_offset, txn.size)
        effects: list[tuple[int, int, int, StoredMessage, int]] = []
        taken = 0
        with self._lock:
            self._check_running()
            records: list[bytes] = []
            chosen: list[tuple[OpenTxn, int, int, StoredMessage]] = []
            seen: set[int] = set()
            for txn, kind, _ in decisions:
                stored = stored_of[txn.half]
                if self._schedule.open.get(txn.half) is not txn or txn.half in seen:
                    continue
                seen.add(txn.half)
                if stored is None:
                    self._lose(txn)
                    continue
                mark = 0
                if kind != oplog.ROLLBACK:
                    topic, queue_id = real_queue(stored) if kind == oplog.COMMIT else (TRANS_DISCARD_TOPIC, 0)
                    mark = self._store.max_offset(topic, queue_id)
                records.append(record(kind, txn.half, mark))
                chosen.append((txn, kind, mark, stored))
            if not chosen:
                return 0
            position = self._oplog.append(b"".join(records))
            for txn, kind, mark, stored in chosen:
                self._schedule.remove(txn.half)
                taken += 1
                if kind == oplog.ROLLBACK:
                    self._terminal.add(txn.half)
                    self._metrics["rolled_back"] += 1
                else:
                    self._decided[txn.half] = (kind, mark)
                    self._decided_at[txn.half] = txn.commit_log_offset
                    effects.append((txn.half, kind, mark, stored, txn.checks))
            self._maybe_compact()
        self._oplog.sync_to(position)  # durable before any effect (group commit across threads)
        for half, kind, mark, stored, checks in effects:
            self._complete(half, kind, mark, stored, checks, recovering=False)
        return taken

    def _complete(self, half: int, kind: int, mark: int, stored: StoredMessage, checks: int, *,
                  recovering: bool) -> None:
        """Apply a recorded commit or discard, then record it done."""
        request = commit_request(stored) if kind == oplog.COMMIT else discard_request(stored, checks)
        if recovering and self._already_stored(request, mark):
            self._metrics["duplicates_avoided"] += 1
            log.info("recorded decision already applied before the restart", half=half,
                     topic=request.topic, unique_id=request.properties.get(Prop.UNIQ_KEY))
        else:
            self._deliver(request)
        if kind == oplog.DISCARD:
            log.warning("transaction discarded: no decision after the maximum number of checks",
                        transaction_id=stored.msg_id, topic=request.properties.get(Prop.REAL_TOPIC),
                        group=stored.properties.get(Prop.PRODUCER_GROUP), checks=checks,
                        discard_topic=TRANS_DISCARD_TOPIC)
        with self._lock:
            if self._closed:
                return  # the D record is lost with the close; recovery will find the message in place
            # No sync of its own: the next synced write or close covers it, and a lost D only
            # makes recovery look for the message before skipping the delivery.
            self._oplog.append(record(oplog.DONE, half))
            self._decided.pop(half, None)
            self._decided_at.pop(half, None)
            self._terminal.add(half)
            self._metrics["committed" if kind == oplog.COMMIT else "discarded"] += 1
            self._maybe_compact()

    def _already_stored(self, request: AppendRequest, mark: int) -> bool:
        """Whether ``request``'s unique id is on its queue at or after ``mark``."""
        unique = request.properties.get(Prop.UNIQ_KEY)
        if not unique:
            return False
        store = self._store
        offset = max(mark, store.min_offset(request.topic, request.queue_id))
        high = store.max_offset(request.topic, request.queue_id)
        while offset < high:
            entries = store.read_queue(request.topic, request.queue_id, offset, _SCAN_CHUNK)
            if not entries:
                break
            for entry in entries:
                offset = entry.queue_offset + 1
                message = store.read(entry.commit_log_offset, entry.size)
                if message is not None and message.unique_id == unique:
                    return True
        return False

    def _lose(self, txn: OpenTxn) -> None:
        """The half is gone from the store (retention): say so loudly and stop tracking it."""
        self._oplog.sync_to(self._oplog.append(record(oplog.LOST, txn.half)))
        self._schedule.remove(txn.half)
        self._terminal.add(txn.half)
        self._metrics["lost"] += 1
        log.error("half message no longer in the store (retention removed it); the transaction cannot be "
                  "committed or discarded", half=txn.half, group=txn.group, checks=txn.checks)

    def _require_half(self, msg_id: str, commit_log_offset: int) -> None:
        stored = self._store.read(commit_log_offset)
        if stored is None or stored.topic != TRANS_HALF_TOPIC:
            raise TransactionError(f"no half message with transaction id {msg_id}; pass the transaction_id "
                                   "that send_in_transaction returned")

    # ------------------------------------------------------------------------------ check-back
    def _arm(self) -> None:
        """Point the one clock timer at the earliest due transaction (never under the clock's
        lock together with ours: a ManualClock runs timers holding its lock)."""
        with self._lock:
            if self._closed or not self._started:
                return
            due = self._schedule.next_due()
            if due is None or (self._armed_ms is not None and self._armed_ms <= due):
                return
            self._armed_ms = due
            self._arm_seq += 1
            token = self._arm_seq
        timer = self._clock.call_at(due / 1000, lambda: self._on_timer(token))
        with self._lock:
            if token == self._arm_seq and not self._closed:
                old, self._timer = self._timer, timer
                if old is not None:
                    old.cancel()
            else:
                timer.cancel()

    def _on_timer(self, token: int) -> None:
        with self._lock:
            if token != self._arm_seq or self._closed:
                return
            self._timer = None
            self._armed_ms = None
        try:
            self._check_due()
        finally:
            self._arm()

    def _check_due(self) -> None:
        options = self._options
        while True:
            now = self._now_ms()
            asks: list[tuple[OpenTxn, TransactionChecker]] = []
            discards: list[OpenTxn] = []
            position = 0
            with self._lock:
                if self._closed:
                    return
                due = self._schedule.pop_due(now, options.check_batch)
                if not due:
                    return
                counted: list[bytes] = []
                for txn in due:
                    live = self._checkers.get(txn.group)
                    if not live:
                        self._schedule.park(txn)
                        self._metrics["checks_waiting"] += 1
                    elif txn.checks >= options.check_max:
                        discards.append(txn)
                    else:
                        txn.checks += 1
                        self._schedule.reschedule(txn, now + options.interval_ms)
                        counted.append(record(oplog.CHECKED, txn.half, txn.checks))
                        asks.append((txn, live[-1]))
                if counted:
                    position = self._oplog.append(b"".join(counted))
                    self._maybe_compact()
            self._oplog.sync_to(position)  # counted before asked: a crash can waste a check, never add one
            decisions: list[tuple[OpenTxn, int, StoredMessage | None]] = [(t, oplog.DISCARD, None) for t in discards]
            for txn, checker in asks:
                answer = self._ask(txn, checker)
                if answer is not None:
                    decisions.append(answer)
            if decisions:
                self._apply_guarded(decisions, now + options.interval_ms)

    def _apply_guarded(self, decisions: list[tuple[OpenTxn, int, StoredMessage | None]], retry_at: int) -> None:
        try:
            self._apply(decisions)
        except TransactionError:
            if not self._closed:
                raise
        except Exception:
            log.exception("applying check-back decisions failed; undecided ones are retried", count=len(decisions))
            with self._lock:
                for txn, _kind, _stored in decisions:
                    if self._schedule.open.get(txn.half) is txn:
                        self._schedule.reschedule(txn, retry_at)

    def _ask(self, txn: OpenTxn, checker: TransactionChecker) -> tuple[OpenTxn, int, StoredMessage] | None:
        """Ask ``checker`` about ``txn``; the decision to apply, or None (UNKNOWN, lost)."""
        stored = self._store.read(txn.commit_log_offset, txn.size)
        if stored is None:
            with self._lock:
                if not self._closed and self._schedule.open.get(txn.half) is txn:
                    self._lose(txn)
            return None
        try:
            decision = checker(checker_view(stored))
        except Exception as exc:  # noqa: BLE001 - user code may raise anything; it means "not known yet"
            log.warning("check listener raised; counted as UNKNOWN", group=txn.group,
                        transaction_id=stored.msg_id, error=repr(exc))
            decision = TransactionDecision.UNKNOWN
        if not isinstance(decision, TransactionDecision):
            log.warning("check listener returned no TransactionDecision; counted as UNKNOWN", group=txn.group,
                        transaction_id=stored.msg_id, returned=repr(decision))
            decision = TransactionDecision.UNKNOWN
        with self._lock:
            self._metrics["checks"] += 1
        if decision is TransactionDecision.UNKNOWN:
            return None
        return txn, oplog.COMMIT if decision is TransactionDecision.COMMIT else oplog.ROLLBACK, stored

    # ------------------------------------------------------------------------------ recovery
    def _load_halves(self, state: OpState) -> list[tuple[int, tuple[int, int], StoredMessage, int]]:
        """Rebuild the open set from the half queue; return recorded decisions to finish."""
        store = self._store
        low = max(state.watermark, store.min_offset(TRANS_HALF_TOPIC, HALF_QUEUE))
        high = store.max_offset(TRANS_HALF_TOPIC, HALF_QUEUE)
        if low > state.watermark:
            missing = [h for h in range(state.watermark, low) if h not in state.terminal]
            if missing:
                log.error("open transactions lost to store retention before a decision", count=len(missing),
                          first=missing[0], last=missing[-1])
        stray = [h for h in state.decided if h >= high]
        if stray:
            log.warning("op log has decisions for half messages the store does not hold (lost in a power "
                        "cut with an async store?)", count=len(stray))
        redo: list[tuple[int, tuple[int, int], StoredMessage, int]] = []
        offset = low
        while offset < high:
            entries = store.read_queue(TRANS_HALF_TOPIC, HALF_QUEUE, offset, _SCAN_CHUNK)
            if not entries:
                break
            for entry in entries:
                offset = half = entry.queue_offset
                offset += 1
                if half in state.terminal:
                    continue
                stored = store.read(entry.commit_log_offset, entry.size)
                if stored is None:
                    log.error("half message unreadable at recovery; skipped", half=half)
                    continue
                checks = state.checks.get(half, 0)
                decided = state.decided.get(half)
                if decided is not None:
                    self._decided[half] = decided
                    self._decided_at[half] = entry.commit_log_offset
                    redo.append((half, decided, stored, checks))
                    continue
                self._schedule.add(OpenTxn(half, entry.commit_log_offset, entry.size,
                                           stored.properties.get(Prop.PRODUCER_GROUP, ""), checks,
                                           self._first_due(stored) + checks * self._options.interval_ms))
        self._half_high = high
        self._metrics["recovered_open"] = len(self._schedule)
        return redo

    def _first_due(self, stored: StoredMessage) -> int:
        try:
            first = immunity_ms(stored.properties)
        except TransactionError:
            first = None
        return stored.store_timestamp_ms + (self._options.timeout_ms if first is None else first)

    def _maybe_compact(self) -> None:
        """Rewrite the op log as the open state once it outgrew ``compact_bytes`` (lock held)."""
        if self._oplog.size < self._compact_at or self._closed or self._preparing:
            return
        self._compact()

    def _compact(self) -> None:
        """Rewrite the op log as the open state (lock held)."""
        low = min(chain(self._schedule.open, self._decided), default=self._half_high)
        records = [record(oplog.WATERMARK, low)]
        records += [record(oplog.CHECKED, t.half, t.checks) for t in self._schedule.open.values() if t.checks]
        records += [record(kind, h, mark) for h, (kind, mark) in self._decided.items()]
        self._terminal = {h for h in self._terminal if h >= low}
        records += [record(oplog.DONE, h) for h in self._terminal]
        self._oplog.rewrite(records)
        self._watermark = low
        self._compact_at = max(self._options.compact_bytes, 2 * self._oplog.size)
        self._metrics["compactions"] += 1

    # ------------------------------------------------------------------------------ helpers
    def _now_ms(self) -> int:
        return round(self._clock.now() * 1000)

    def _check_running(self) -> None:
        if self._closed:
            raise TransactionError("the transaction service is closed (its broker was closed)")
        if not self._started:
            raise TransactionError("the transaction service has not been started; the broker starts it on open")
