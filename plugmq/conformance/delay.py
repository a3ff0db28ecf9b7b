"""Conformance clauses of the delay family, for any DelayScheduler plugin.

Subclass :class:`DelayConformance` and provide one fixture, ``delay_plugin``, returning the
plugin's entry-point name. The suite opens a real store (the first of store_mmap, store_lmdb,
store_rocks that loads, or ``$PLUGMQ_DELAY_CONFORMANCE_STORE``) and the scheduler with
``plugmq.broker.components.open_delay_scheduler`` on a ManualClock; the write-back appends to the
store and ``was_delivered`` asks the store, as the broker does. Requests are built as
``Broker._schedule`` builds them: a level request carries ``delay_level`` and a deliver time
from the strategy's ``levels_ms`` (RocketMQ's list for arbitrary strategies), an arbitrary one
``delay_level=None``.

Clauses: never early and late by at most one ``resolution_ms`` (a tick, in milliseconds: on a
ManualClock a due message must be out one tick after its time at the latest, whatever steps the
clock takes); a burst due at one moment goes out completely within that tick, in sending order;
equal deliver times keep sending order and a tick-earlier time goes first; clean restart,
``kill -9`` mid-dispatch, mid-batch and mid-schedule (a real child process) lose nothing and
duplicate nothing; ``start()`` returns before an overdue backlog goes out, which then comes oldest
first on the clock's thread and shows in ``metrics()``; cancel where declared (unknown ids answer
False, something that is not a message id raises ValidationError; a skip with the reason where
cancel is not declared, plus the refusal the contract asks for); a delay above ``max_delay_ms``
clamped or refused as ``clamps`` says; arbitrary delays refused by level strategies; reschedule
where the scheduler is a ``ReschedulableDelay`` (a skip with the reason where it is not): a moved
message comes once at its new time, also after a clean restart and after ``kill -9`` in the middle
of reschedules, spent / unknown / cancelled / delivered ids answer None; a three-day
run of thousands of messages, with ``clean_expired`` called after every step, equals a
reference model.
"""

from __future__ import annotations

import collections
import heapq
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, cast

import attrs
import pytest

from plugmq.broker.components import plugin_declaration
from plugmq.conformance import _delay_child as child
from plugmq.conformance._delay_harness import STORE_CANDIDATES, DelayHarness
from plugmq.conformance._delay_kill import check_after_kill, child_window, run_child
from plugmq.core import (
    DelayCapabilities,
    DelayScheduler,
    DelayUnsupportedError,
    Family,
    ManualClock,
    ValidationError,
    encode_msg_id,
)
from plugmq.core.contracts.delay import ReschedulableDelay

__all__ = ["DelayConformance", "DelayHarness"]

SECOND = 1000
HOUR = 3_600_000
DAY = 24 * HOUR


class DelayConformance:
    """The delay contract. Needs the fixture ``delay_plugin`` -> the plugin's entry-point name.

    ``store_plugins``: the stores to try, first that loads wins (a subclass may reorder them).
    """

    store_plugins: tuple[str, ...] = STORE_CANDIDATES

    @pytest.fixture
    def harness(self, delay_plugin: str, tmp_path: Path) -> Iterator[DelayHarness]:
        h = DelayHarness(delay_plugin, tmp_path / "data", ManualClock(1_700_000_000.0), self.store_plugins)
        try:
            yield h
        finally:
            h.close()

    # -- declaration ----------------------------------------------------------------------------

    def test_declares_consistent_capabilities(self, delay_plugin: str, harness: DelayHarness) -> None:
        """The scheduler's capabilities equal the declared ones and are consistent: resolution >= 1, levels
        only for a level strategy, the longest level as maximum."""
        declaration = plugin_declaration(delay_plugin)
        assert Family.DELAY in declaration.families
        caps = declaration.capabilities
        assert isinstance(caps, DelayCapabilities), f"{delay_plugin} must declare DelayCapabilities"
        assert caps.resolution_ms >= 1
        if caps.arbitrary_delay:
            assert caps.levels_ms is None, "an arbitrary-delay strategy takes the broker's default levels"
        else:
            assert caps.levels_ms, "a strategy without arbitrary delay must list its levels"
            assert all(ms > 0 for ms in caps.levels_ms)
            assert caps.max_delay_ms == max(caps.levels_ms)
        assert harness.open().capabilities == caps, "a scheduler with default options must carry the declared capabilities"
        assert harness.scheduler is not None and harness.scheduler.pending() == 0

    # -- timing ---------------------------------------------------------------------------------

    def test_never_early_and_late_by_at_most_one_tick(self, harness: DelayHarness) -> None:
        """No message is written back before its deliver time, nor later than one resolution after it,
        after every step of the clock."""
        h = harness
        h.open()
        rng = random.Random(11)
        for burst in range(4):
            for i in range(25):
                h.send(f"t{burst}-{i}", **h.some_delay(rng, longest_ms=90_000))
            h.advance_to(h.clock.now_ms() + rng.randint(1, 2500))
        assert h.scheduler is not None
        assert h.scheduler.pending() + len(h.deliveries) == len(h.sent)
        while h.clock.now_ms() <= h.latest_due() + h.caps.resolution_ms:
            h.advance_to(h.clock.now_ms() + rng.choice([1, 7, 333, 1000, 2900]))
            now = h.clock.now_ms()
            for delivery in h.deliveries:  # nothing delivered yet may be due later than now
                assert h.sent[delivery.uid].effective_due <= now
            out = {d.uid for d in h.deliveries}
            late = [u for u, s in h.sent.items() if s.effective_due + h.caps.resolution_ms <= now and u not in out]
            assert not late, f"more than one tick ({h.caps.resolution_ms} ms) late at {now}: {late[:5]}"
        h.check_timing()
        counts = collections.Counter(d.uid for d in h.deliveries)
        assert set(counts) == set(h.sent), f"never delivered: {sorted(set(h.sent) - set(counts))[:5]}"
        assert max(counts.values()) == 1, f"delivered twice: {[u for u, n in counts.items() if n > 1][:5]}"
        for delivery in h.deliveries:
            h.check_restored(delivery)
        assert h.scheduler.pending() == 0
        assert h.stored_uids() == collections.Counter(list(h.sent)), "the store must hold each write-back once"
        assert h.scheduler.metrics()["delivered"] >= len(h.sent)

    def test_a_burst_due_at_once_goes_out_within_one_tick_in_order(self, harness: DelayHarness) -> None:
        """A burst due at one moment is written back completely within one tick, in sending order."""
        h = harness
        h.open()
        h.advance_to(h.clock.now_ms() + 3)  # off any whole second
        count = 1500
        if h.caps.arbitrary_delay:
            due = h.clock.now_ms() + 20 * SECOND + 7
            for i in range(count):
                h.send(f"burst-{i}", due_ms=due, queue_id=i % 2)
        else:
            for i in range(count):  # one level, one sending millisecond: one deliver time
                h.send(f"burst-{i}", level=1, queue_id=i % 2)
            due = h.sent["burst-0"].effective_due
        h.advance_to(due - 1)
        assert not h.deliveries, "a burst was delivered before its time"
        h.advance_to(due + h.caps.resolution_ms)
        assert [d.uid for d in h.deliveries] == [f"burst-{i}" for i in range(count)], "burst lost, doubled or reordered"
        h.check_timing()
        assert h.scheduler is not None and h.scheduler.pending() == 0
        assert h.stored_uids() == collections.Counter(list(h.sent))

    def test_order_within_a_level_or_tick(self, harness: DelayHarness) -> None:
        """Messages with equal deliver times keep their sending order; an earlier tick is written back
        first."""
        h = harness
        h.open()
        if h.caps.arbitrary_delay:
            target = h.clock.now_ms() + 30 * SECOND + 250
            for i in range(15):  # one deliver time, sent at different moments
                h.send(f"same-{i}", due_ms=target)
                h.advance_to(h.clock.now_ms() + 400)
            for i in range(15):  # sent latest-first, due earliest-last
                h.send(f"rev-{i}", due_ms=target + (15 - i) * 2 * h.caps.resolution_ms)
        else:
            for i in range(40):  # two levels interleaved, several sends per millisecond
                h.send(f"lv-{i}", level=1 + i % 2)
                if i % 3 == 2:
                    h.advance_to(h.clock.now_ms() + 137)
        h.run_past_all()
        assert collections.Counter(d.uid for d in h.deliveries) == collections.Counter(list(h.sent))
        h.check_order()
        if not h.caps.arbitrary_delay:
            for level in (1, 2):
                got = [d.uid for d in h.deliveries if h.sent[d.uid].level == level]
                assert got == [u for u, s in h.sent.items() if s.level == level], f"level {level} out of order"

    # -- restarts -------------------------------------------------------------------------------

    def test_clean_restart_loses_and_repeats_nothing(self, harness: DelayHarness) -> None:
        """A clean close and reopen keeps every pending message and writes back nothing twice."""
        h = harness
        scheduler = h.open()
        rng = random.Random(5)
        for i in range(60):
            h.send(f"r{i}", **h.some_delay(rng, longest_ms=60_000))
        h.advance_to(h.clock.now_ms() + 20 * SECOND)
        before = len(h.deliveries)
        assert 0 < before < len(h.sent), "the clause wants a restart with some delivered and some pending"
        assert scheduler.pending() == len(h.sent) - before
        scheduler = h.restart()
        assert scheduler.pending() == len(h.sent) - before, "pending changed across a clean restart"
        assert len(h.deliveries) == before, "a clean restart re-delivered (or delivered early)"
        h.advance_to(h.clock.now_ms() + 3 * SECOND)
        scheduler = h.restart()  # a second restart, right after more deliveries
        h.run_past_all()
        h.check_timing()
        assert h.stored_uids() == collections.Counter(list(h.sent)), "lost or duplicated across restarts"
        assert scheduler.pending() == 0
        h.restart()
        h.advance_to(h.clock.now_ms() + HOUR)
        assert h.stored_uids() == collections.Counter(list(h.sent)), "a restart with nothing pending delivered again"

    def test_overdue_at_start_oldest_first_and_in_metrics(self, harness: DelayHarness) -> None:
        """What came due while the broker was down goes out right after start, oldest first, within one
        resolution, and shows in metrics."""
        h = harness
        h.open()
        rng = random.Random(3)
        for i in range(40):
            h.send(f"o{i}", **h.some_delay(rng, longest_ms=60_000))
        h.close()
        downtime_end = h.latest_due() + HOUR
        h.clock.set(downtime_end / 1000)
        scheduler = h.open(start=False)
        scheduler.start()
        assert not h.deliveries, "start() must return at once; the backlog goes out on the clock's thread"
        h.advance_to(h.clock.now_ms() + h.caps.resolution_ms)
        assert collections.Counter(d.uid for d in h.deliveries) == collections.Counter(list(h.sent))
        h.check_order()
        assert all(d.at_ms <= downtime_end + h.caps.resolution_ms for d in h.deliveries), "overdue ones waited"
        metrics = scheduler.metrics()
        assert metrics.get("overdue_at_start") == len(h.sent), f"overdue_at_start missing or wrong: {metrics}"
        late = max((v for k, v in metrics.items() if "late" in k and k.endswith("max")), default=0.0)
        assert late >= HOUR, f"the lateness of overdue deliveries (>= 1 h) is not in metrics(): {metrics}"
        assert scheduler.pending() == 0

    def test_restart_after_kill_mid_dispatch(self, harness: DelayHarness, tmp_path: Path) -> None:
        """After a SIGKILL while dispatching, every accepted message is written back exactly once."""
        h = harness
        count = 2000
        start, until = child_window(h, count)
        first = run_child(h, tmp_path, start=start, count=count, until=until, kill_after=("D", 300))
        assert first.accepted == set(range(count))
        left = count - len(first.delivered)
        second = run_child(h, tmp_path, start=first.clock_ms, count=0, until=until, kill_after=("D", max(1, left // 4)))
        assert len(second.delivered) > 0, "the resumed child delivered nothing before the kill"
        h.clock.set(second.clock_ms / 1000)
        h.open()
        h.advance_to(until + h.caps.resolution_ms)
        check_after_kill(h, first.due)
        for delivery in h.deliveries:
            index = int(delivery.uid.split("-")[1])
            assert delivery.at_ms >= first.due[index], f"{delivery.uid} delivered early after the restart"

    def test_kill_right_after_a_write_back(self, harness: DelayHarness, tmp_path: Path) -> None:
        """The worst moment: the write-back returned, the strategy has not recorded it yet."""
        h = harness
        count = 400
        start, until = child_window(h, count)
        run = run_child(h, tmp_path, start=start, count=count, until=until, kill_after=None, self_kill_after=137)
        assert len(run.delivered) == 137
        h.clock.set(run.clock_ms / 1000)
        h.open()
        h.advance_to(until + h.caps.resolution_ms)
        check_after_kill(h, run.due)

    def test_restart_after_kill_mid_schedule(self, harness: DelayHarness, tmp_path: Path) -> None:
        """After a SIGKILL while scheduling, every accepted message is written back exactly once and
        nothing never accepted is."""
        h = harness
        start = h.clock.now_ms()
        run = run_child(h, tmp_path, start=start, count=100_000, until=start, kill_after=("S", 400))
        h.clock.set(run.clock_ms / 1000)
        h.open()
        accepted = max(run.accepted)
        h.advance_to(start + 60 * SECOND)
        counts = h.stored_uids(child.TOPIC)
        lost = [i for i in range(accepted + 1) if counts[child.uid_of(i)] != 1]
        assert not lost, f"accepted messages lost or duplicated after kill -9: {lost[:10]}"
        extra = {u: n for u, n in counts.items() if u not in {child.uid_of(i) for i in range(accepted + 2)}}
        assert not extra, f"messages never scheduled were delivered: {list(extra)[:5]}"
        assert counts[child.uid_of(accepted + 1)] <= 1, "the in-flight schedule was delivered twice"

    # -- cancel ---------------------------------------------------------------------------------

    def test_cancel_honoured(self, harness: DelayHarness) -> None:
        """A cancelled message that was not yet due is never written back, also across a restart; cancel
        answers False once it was delivered."""
        h = harness
        scheduler = h.open()
        if not h.caps.cancel:
            pytest.skip(f"{h.plugin} does not declare capability cancel")
        rng = random.Random(8)
        sent = [h.send(f"c{i}", **h.some_delay(rng, longest_ms=30_000)) for i in range(12)]
        cancelled = {s.uid for s in sent[::3]}
        for s in sent[::3]:
            assert scheduler.cancel(s.msg_id) is True, f"cancel of pending {s.uid} refused"
        assert scheduler.pending() == len(sent) - len(cancelled)
        keep = h.send("kept-over-restart", delay_ms=40 * SECOND) if h.caps.arbitrary_delay else h.send("kept", level=1)
        gone = h.send("cancelled-before-restart", **({"delay_ms": 45 * SECOND} if h.caps.arbitrary_delay else {"level": 2}))
        assert scheduler.cancel(gone.msg_id) is True
        cancelled.add(gone.uid)
        scheduler = h.restart()
        h.run_past_all()
        delivered = collections.Counter(d.uid for d in h.deliveries)
        assert not cancelled & set(delivered), f"cancelled messages delivered: {sorted(cancelled & set(delivered))}"
        assert set(delivered) == set(h.sent) - cancelled and max(delivered.values()) == 1
        assert keep.uid in delivered
        assert scheduler.cancel(sent[1].msg_id) is False, "cancel of an already delivered message must say False"
        assert scheduler.pending() == 0

    def test_cancel_of_unknown_and_malformed_ids(self, harness: DelayHarness) -> None:
        """cancel answers False for an id of another broker or of no message, and raises ValidationError
        for something that is not a message id."""
        h = harness
        scheduler = h.open()
        if not h.caps.cancel:
            pytest.skip(f"{h.plugin} does not declare capability cancel")
        kept = h.send("kept", delay_ms=30 * SECOND) if h.caps.arbitrary_delay else h.send("kept", level=2)
        offset = int(kept.msg_id[16:], 16)
        for unknown in (encode_msg_id("10.99.99.99:10911", offset),  # another broker's
                        encode_msg_id(child.STORE_HOST, offset + 10**9)):  # a well-formed id of nothing
            assert scheduler.cancel(unknown) is False, f"cancel of unknown id {unknown} must answer False"
        for malformed in ("not-a-message-id", "", "00" * 7):
            with pytest.raises(ValidationError):
                scheduler.cancel(malformed)
        h.run_past_all()
        assert [d.uid for d in h.deliveries] == ["kept"], "an answered cancel must not touch other messages"

    def test_cancel_refused_where_not_declared(self, harness: DelayHarness) -> None:
        """Without the cancel capability, cancel raises DelayUnsupportedError and the message stays
        scheduled."""
        h = harness
        scheduler = h.open()
        if h.caps.cancel:
            pytest.skip(f"{h.plugin} declares cancel; test_cancel_honoured covers it")
        sent = h.send("not-cancellable", level=1)
        with pytest.raises(DelayUnsupportedError):
            scheduler.cancel(sent.msg_id)
        h.run_past_all()
        assert [d.uid for d in h.deliveries] == [sent.uid], "a refused cancel must leave the message scheduled"

    # -- reschedule (ReschedulableDelay) --------------------------------------------------------

    def test_reschedule_moves_a_pending_message(self, harness: DelayHarness) -> None:
        h = harness
        scheduler = _reschedulable(h)
        rng = random.Random(21)
        for i in range(36):
            h.send(f"m{i}", **h.some_delay(rng, longest_ms=60_000))
        h.advance_to(h.clock.now_ms() + 2 * SECOND)
        out = {d.uid for d in h.deliveries}
        waiting = [uid for uid in h.sent if uid not in out and h.sent[uid].effective_due > h.clock.now_ms() + 100]
        assert len(waiting) >= 12, "the clause wants a dozen messages still waiting"
        pending = scheduler.pending()
        now = h.clock.now_ms()
        for n, uid in enumerate(waiting):
            old_due = h.sent[uid].due_ms
            target = (old_due + rng.randint(1, 90_000),  # later
                      rng.randint(now, old_due),  # earlier
                      now - rng.randint(1, 5000),  # in the past: now
                      old_due)[n % 4]  # the same time, moved behind its equals
            assert h.reschedule(uid, target) is not None, f"reschedule of pending {uid} answered None"
        assert scheduler.pending() == pending, "a reschedule changed how many messages are pending"
        h.advance_to(h.clock.now_ms() + 500)
        h.restart()  # a clean restart keeps the new times
        h.run_past_all(step_ms=997)
        counts = collections.Counter(d.uid for d in h.deliveries)
        assert counts == collections.Counter(list(h.sent)), "a moved message was lost or delivered twice"
        h.check_timing()  # against the new times: never early, at most a tick late (so never at the old one)
        h.check_order()
        for delivery in h.deliveries:
            h.check_restored(delivery)
        assert h.stored_uids() == counts
        assert h.scheduler is not None and h.scheduler.pending() == 0

    def test_reschedule_of_spent_unknown_and_malformed_ids(self, harness: DelayHarness) -> None:
        h = harness
        scheduler = _reschedulable(h)
        now = h.clock.now_ms()
        first = h.send("a", due_ms=now + 30 * SECOND)
        h.send("b", due_ms=now + 5 * SECOND)
        gone = h.send("c", due_ms=now + 40 * SECOND)
        moved = h.reschedule("a", now + 20 * SECOND)
        assert moved is not None
        assert scheduler.reschedule(first.msg_id, now + 25 * SECOND) is None, "a spent id moved a message again"
        if h.caps.cancel:
            assert scheduler.cancel(first.msg_id) is False, "cancel of a moved message's old id must answer False"
            assert scheduler.cancel(gone.msg_id) is True
            assert scheduler.reschedule(gone.msg_id, now + 10 * SECOND) is None, "a cancelled message came back"
            del h.sent["c"]
        again = h.reschedule("a", now + 22 * SECOND)  # the new id moves it again
        assert again is not None
        h.advance_to(now + 6 * SECOND)
        assert [d.uid for d in h.deliveries] == ["b"]
        assert scheduler.reschedule(h.sent["b"].msg_id, now + 50 * SECOND) is None, "a delivered message moved"
        offset = int(again.msg_id[16:], 16)
        for unknown in (encode_msg_id("10.99.99.99:10911", offset), encode_msg_id(child.STORE_HOST, offset + 10**9)):
            assert scheduler.reschedule(unknown, now + 9 * SECOND) is None, f"reschedule of unknown id {unknown}"
        for malformed in ("not-a-message-id", "", "00" * 7):
            with pytest.raises(ValidationError):
                scheduler.reschedule(malformed, now + 9 * SECOND)
        h.run_past_all()
        assert collections.Counter(d.uid for d in h.deliveries) == collections.Counter(["a", "b", *(["c"] if not h.caps.cancel else [])])
        h.check_timing()
        assert h.stored_uids() == collections.Counter(list(h.sent))

    def test_reschedule_beyond_the_maximum_clamped_or_refused(self, harness: DelayHarness) -> None:
        h = harness
        scheduler = _reschedulable(h)
        caps = h.caps
        if caps.max_delay_ms is None:
            pytest.skip(f"{h.plugin} declares no maximum delay")
        now = h.clock.now_ms()
        h.send("m", due_ms=now + 10 * SECOND)
        if not caps.clamps:
            with pytest.raises(DelayUnsupportedError):
                h.reschedule("m", now + caps.max_delay_ms + HOUR)
            assert scheduler.pending() == 1
            h.advance_to(now + 10 * SECOND + caps.resolution_ms)
            assert [d.uid for d in h.deliveries] == ["m"], "a refused reschedule must leave the message at its time"
            return
        moved = h.reschedule("m", now + caps.max_delay_ms + HOUR)
        assert moved is not None
        h.sent["m"] = attrs.evolve(moved, due_ms=now + caps.max_delay_ms)
        h.advance_to(now + caps.max_delay_ms - 1)
        assert not h.deliveries, "a clamped reschedule was delivered before the maximum delay"
        h.advance_to(now + caps.max_delay_ms + caps.resolution_ms)
        assert [d.uid for d in h.deliveries] == ["m"]
        h.check_timing()

    def test_restart_after_kill_mid_reschedule(self, harness: DelayHarness, tmp_path: Path) -> None:
        h = harness
        _reschedulable(h)
        h.close()
        start = h.clock.now_ms()
        count = 1200
        run = run_child(h, tmp_path, start=start, count=count, until=start + HOUR, kill_after=("R", 150),
                         reschedule=True)
        assert run.accepted == set(range(count)) and len(run.moved) >= 150
        h.clock.set(run.clock_ms / 1000)
        h.open()
        moments = sorted({t + extra for i in range(count)
                          for t in (run.due[i], child.moved_due(i, start)) for extra in (0, h.caps.resolution_ms)})
        for moment in moments:
            h.advance_to(moment)
        check_after_kill(h, run.due)
        tick = h.caps.resolution_ms
        for delivery in h.deliveries:
            index = int(delivery.uid.split("-")[1])
            old, new = run.due[index], child.moved_due(index, start)
            allowed = [new] if index in run.moved else [old, new] if index == len(run.moved) else [old]
            assert any(due <= delivery.at_ms <= due + tick for due in allowed), (
                f"{delivery.uid} delivered at {delivery.at_ms}; it was due at {allowed} (moved: {index in run.moved})")

    # -- refusals -------------------------------------------------------------------------------

    def test_delay_above_max_clamped_or_refused_as_declared(self, harness: DelayHarness) -> None:
        """A delay above max_delay_ms is clamped when the strategy clamps, else refused with
        DelayUnsupportedError leaving nothing behind."""
        h = harness
        scheduler = h.open()
        caps = h.caps
        if caps.max_delay_ms is None:
            pytest.skip(f"{h.plugin} declares no maximum delay")
        if caps.levels_ms is not None and not caps.arbitrary_delay:
            top = len(caps.levels_ms)
            h.send("top-level", level=top)
            over = {"level": top + 2}
            expect_due = h.clock.now_ms() + caps.levels_ms[-1]
        else:
            h.send("at-max", delay_ms=caps.max_delay_ms)
            over = {"delay_ms": caps.max_delay_ms + HOUR}
            expect_due = h.clock.now_ms() + caps.max_delay_ms
        if not caps.clamps:
            with pytest.raises(DelayUnsupportedError):
                h.send("over-max", **over)
            assert "over-max" not in h.sent and scheduler.pending() == 1, "a refused delay left something behind"
            h.advance_to(expect_due + HOUR)
            assert [d.uid for d in h.deliveries] == list(h.sent), "only the accepted message may be delivered"
            return
        h.send("over-max", **over)
        assert scheduler.pending() == 2
        h.advance_to(expect_due - 1)
        assert not h.deliveries, "a clamped message was delivered before the maximum delay"
        h.advance_to(expect_due + caps.resolution_ms)
        assert {d.uid for d in h.deliveries} >= {"over-max"}, "a clamped message was not delivered at the maximum delay"
        late = [d.at_ms - expect_due for d in h.deliveries if d.uid == "over-max"]
        assert 0 <= late[0] <= caps.resolution_ms

    def test_arbitrary_delay_refused_by_level_strategy(self, harness: DelayHarness) -> None:
        """A strategy without arbitrary_delay refuses every non-level request, even one equal to a level."""
        h = harness
        scheduler = h.open()
        if h.caps.arbitrary_delay:
            pytest.skip(f"{h.plugin} declares arbitrary delays")
        for delay in (h.levels[0], 1234):  # even a delay that equals a level is not a level request
            with pytest.raises(DelayUnsupportedError):
                h.send(f"arbitrary-{delay}", delay_ms=delay)
        assert scheduler.pending() == 0 and not h.sent

    # -- long horizon ---------------------------------------------------------------------------

    def test_three_simulated_days_match_a_reference_model(self, harness: DelayHarness) -> None:
        """Thousands of messages over three simulated days, with a restart half way.

        The reference model is a heap of (deliver time, send order): after every step everything
        due at least one tick ago must have been delivered, nothing not yet due may have been,
        and at the end every message was delivered exactly once, in model order up to one tick.
        """
        h = harness
        h.open()
        rng = random.Random(2024)
        begin = h.clock.now_ms()
        horizon = begin + 3 * DAY
        model: list[tuple[int, int, str]] = []
        delivered: set[str] = set()
        seen = 0
        restarted = False
        count = 0
        while h.clock.now_ms() < horizon:
            for _ in range(rng.randint(0, 12)):
                if h.caps.arbitrary_delay:
                    kwargs = rng.choice([{"delay_ms": rng.randint(0, 6 * HOUR)}, {"delay_ms": rng.randint(0, 2 * DAY)},
                                         {"delay_ms": rng.randint(0, 90 * SECOND)}, {"level": rng.randint(1, 18)}])
                else:
                    kwargs = {"level": rng.randint(1, len(h.levels))}
                sent = h.send(f"h{count}", **kwargs)
                heapq.heappush(model, (sent.effective_due, sent.seq, sent.uid))
                count += 1
            h.advance_to(h.clock.now_ms() + rng.choice([1, 999, 60 * SECOND, 10 * 60 * SECOND, HOUR // 2]))
            assert h.scheduler is not None
            removed = h.scheduler.clean_expired(h.clock.now_ms())  # retention must never cost a message
            assert isinstance(removed, int) and removed >= 0
            if not restarted and h.clock.now_ms() > begin + 3 * DAY // 2:
                h.restart()
                restarted = True
            delivered.update(d.uid for d in h.deliveries[seen:])
            seen = len(h.deliveries)
            now = h.clock.now_ms()
            while model and model[0][0] + h.caps.resolution_ms <= now:
                due, _, uid = heapq.heappop(model)
                assert uid in delivered, f"{uid} due at {due} not delivered by {now} (model says it must be)"
        assert count >= 2000, "the run is meant to cover thousands of messages"
        h.run_past_all()
        counts = collections.Counter(d.uid for d in h.deliveries)
        assert counts == collections.Counter(list(h.sent)), "model and strategy disagree on what was delivered"
        h.check_timing()
        h.check_order()
        assert h.stored_uids() == counts


class _Movable(DelayScheduler, ReschedulableDelay, Protocol):
    """A delay scheduler that offers reschedule."""


def _reschedulable(h: DelayHarness) -> _Movable:
    """The opened scheduler as a ReschedulableDelay; a skip with the reason where it is not one."""
    scheduler = h.open()
    if not isinstance(scheduler, ReschedulableDelay):
        pytest.skip(f"{h.plugin} does not offer reschedule (plugmq.core.contracts.ReschedulableDelay)")
    return cast(_Movable, scheduler)
