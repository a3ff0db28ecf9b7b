"""A lane's deadline heaps answer as a look at every message in flight would.

Pop receives find the messages whose invisible time ran out through two heaps per lane
(plugmq.broker.popstate.Lane) instead of scanning what is in flight. A Hypothesis state machine
drives a lane through the journal's operations (hand out, deliver again, change the invisible
time, ack, reset) with time moving on, and checks every answer against that plain scan.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from plugmq.broker import popstate
from plugmq.broker.popstate import Inflight, Lane, _Lanes

_OFFSETS = st.integers(0, 40)
_SPANS = st.integers(0, 50)


class LaneDeadlines(RuleBasedStateMachine):
    """The lane as the journal's operations change it; the reference is its ``inflight`` dict."""

    def __init__(self) -> None:
        super().__init__()
        # A small slack, so that runs reach the heap's rebuild (1,024 stale items in production).
        self._slack, popstate._STALE_SLACK = popstate._STALE_SLACK, 3
        self.lanes = _Lanes()
        self.lanes.apply(["L", 1, "G", "T", 0, 0])
        self.lane: Lane = self.lanes.by_id[1]
        self.now = 0
        self.seq = 0

    def teardown(self) -> None:
        popstate._STALE_SLACK = self._slack

    def _row(self, offset: int, attempt: int, span: int) -> list[object]:
        self.seq += 1
        return [offset, attempt, self.now + span, self.seq, offset * 100, 10, None]

    @rule(offsets=st.lists(_OFFSETS, min_size=1, max_size=6, unique=True), span=_SPANS, attempt=st.integers(1, 4))
    def hand_out(self, offsets: list[int], span: int, attempt: int) -> None:
        """A receive: new messages, or ones delivered again (a new row for an offset in flight)."""
        self.lanes.apply(["P", 1, max(offsets) + 1, [self._row(offset, attempt, span) for offset in offsets]])
        self._bounded()

    @precondition(lambda self: self.lane.inflight)
    @rule(data=st.data(), span=_SPANS)
    def change_invisible_time(self, data: st.DataObject, span: int) -> None:
        offset = data.draw(st.sampled_from(sorted(self.lane.inflight)))
        self.seq += 1
        self.lanes.apply(["C", 1, offset, self.now + span, self.seq])
        self._bounded()

    def _bounded(self) -> None:
        """Right after a deadline is set, the heap holds at most twice what is in flight plus the
        slack: stale items (acked messages) are dropped by a rebuild."""
        assert len(self.lane.deadlines) <= 2 * len(self.lane.inflight) + popstate._STALE_SLACK

    @precondition(lambda self: self.lane.inflight)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        offsets = data.draw(st.lists(st.sampled_from(sorted(self.lane.inflight)), min_size=1, max_size=5))
        self.lanes.apply(["A", 1, offsets])

    @rule(offsets=st.lists(_OFFSETS, min_size=1, max_size=3, unique=True))
    def ack_some_maybe_unknown(self, offsets: list[int]) -> None:
        self.lanes.apply(["A", 1, offsets])

    @rule()
    def reset(self) -> None:
        self.lanes.apply(["R", 1, 0])

    @rule(step=st.integers(0, 30))
    def time_passes(self, step: int) -> None:
        self.now += step

    def _timed_out(self) -> list[Inflight]:
        return sorted((e for e in self.lane.inflight.values() if e.until_ms <= self.now), key=lambda e: e.offset)

    @rule(want=st.integers(1, 8), spent_from=st.integers(1, 5))
    def first_timed_out(self, want: int, spent_from: int) -> None:
        """Those ``want`` first, passing over (and returning) the ones ``skip`` names."""
        taken, skipped = self.lane.first_timed_out(self.now, want, lambda e: e.attempt >= spent_from)
        expected_taken: list[Inflight] = []
        expected_skipped: list[Inflight] = []
        for entry in self._timed_out():
            if len(expected_taken) >= want:
                break
            (expected_skipped if entry.attempt >= spent_from else expected_taken).append(entry)
        assert taken == expected_taken
        assert skipped == expected_skipped

    @invariant()
    def timed_out_is_every_message_past_its_deadline(self) -> None:
        assert self.lane.timed_out(self.now) == self._timed_out()

    @invariant()
    def next_deadline_is_the_earliest_still_ahead(self) -> None:
        ahead = [e.until_ms for e in self.lane.inflight.values() if e.until_ms > self.now]
        assert self.lane.next_deadline(self.now) == min(ahead, default=None)



LaneDeadlines.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
test_lane_deadlines = LaneDeadlines.TestCase


def test_stale_deadlines_of_acked_messages_are_dropped() -> None:
    """Messages acked before their deadline leave no more than a bounded heap behind."""
    lanes = _Lanes()
    lanes.apply(["L", 1, "G", "T", 0, 0])
    lane = lanes.by_id[1]
    for offset in range(20_000):
        lanes.apply(["P", 1, offset + 1, [[offset, 1, 10_000_000, offset + 1, offset, 10, None]]])
        lanes.apply(["A", 1, [offset]])
    assert not lane.inflight
    assert len(lane.deadlines) <= 1025
    assert lane.timed_out(20_000_000) == []
