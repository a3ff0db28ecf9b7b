"""The storage family's model-based clause: a Hypothesis state machine against plain Python lists."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
)

from plugmq.conformance._store_support import TOPIC, Opener, StoreUnderTest, assert_stored, capabilities_of, request
from plugmq.core import (
    AppendRequest,
    AppendResult,
    ManualClock,
)

__all__ = ["store_machine"]

# ---------------------------------------------------------------------------------------------
# the model-based clause
# ---------------------------------------------------------------------------------------------

_KEYS = ["alpha", "beta", "gamma"]
_messages = st.builds(
    lambda topic, qid, body, key: (topic, qid, body, key),
    st.sampled_from([TOPIC, "ModelB"]), st.integers(0, 2), st.binary(max_size=300), st.sampled_from([None, *_KEYS]),
)


def store_machine(sut: StoreUnderTest, root: Path) -> type[RuleBasedStateMachine]:
    caps = capabilities_of(sut.plugin)

    class StoreModel(RuleBasedStateMachine):
        """Appends, batches, reads, queries and reopens, checked against plain Python lists."""

        def __init__(self) -> None:
            super().__init__()
            self.dir = Path(tempfile.mkdtemp(dir=root))
            self.clock = ManualClock()
            self.opener = Opener(sut, self.dir, self.clock)
            self.store = self.opener()
            self.queues: dict[tuple[str, int], list[tuple[AppendRequest, AppendResult]]] = {}

        def _record(self, req: AppendRequest, res: AppendResult) -> None:
            mine = self.queues.setdefault((req.topic, req.queue_id), [])
            assert res.queue_offset == len(mine)
            mine.append((req, res))

        @staticmethod
        def _request(spec: tuple[str, int, bytes, str | None]) -> AppendRequest:
            topic, qid, body, key = spec
            return request(topic, qid, body, keys=key)

        @rule(spec=_messages)
        def append(self, spec: tuple[str, int, bytes, str | None]) -> None:
            req = self._request(spec)
            self._record(req, self.store.append(req))

        @rule(specs=st.lists(_messages, min_size=1, max_size=6))
        def append_batch(self, specs: list[tuple[str, int, bytes, str | None]]) -> None:
            reqs = [self._request(s) for s in specs]
            for req, res in zip(reqs, self.store.append_batch(reqs), strict=True):
                self._record(req, res)

        @rule(ms=st.integers(0, 3000))
        def advance_clock(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @rule()
        def reopen(self) -> None:
            self.store = self.opener.reopen(self.store)

        @rule(data=st.data())
        def read_one(self, data: st.DataObject) -> None:
            if not self.queues:
                return
            queue = data.draw(st.sampled_from(sorted(self.queues)))
            req, res = data.draw(st.sampled_from(self.queues[queue]))
            assert_stored(self.store.read(res.commit_log_offset), req, res)
            assert_stored(self.store.query_by_id(res.msg_id), req, res)

        @rule(topic=st.sampled_from([TOPIC, "ModelB"]), qid=st.integers(0, 2), offset=st.integers(0, 40),
              count=st.integers(1, 12))
        def read_queue(self, topic: str, qid: int, offset: int, count: int) -> None:
            model = self.queues.get((topic, qid), [])[offset:offset + count]
            got = self.store.read_queue(topic, qid, offset, count)
            assert [(e.queue_offset, e.commit_log_offset, e.size) for e in got] == [
                (res.queue_offset, res.commit_log_offset, res.size) for _, res in model]

        @rule(topic=st.sampled_from([TOPIC, "ModelB"]), key=st.sampled_from(_KEYS))
        def query_key(self, topic: str, key: str) -> None:
            if not caps.query_by_key:
                return
            expected = {res.commit_log_offset for (t, _), pairs in self.queues.items() if t == topic
                        for req, res in pairs if key in req.keys}
            got = self.store.query_by_key(topic, key, max_results=10_000)
            assert {m.commit_log_offset for m in got} == expected

        @rule(data=st.data())
        def time_search(self, data: st.DataObject) -> None:
            if not caps.query_by_time or not self.queues:
                return
            topic, qid = data.draw(st.sampled_from(sorted(self.queues)))
            pairs = self.queues[(topic, qid)]
            stamps = [res.store_timestamp_ms for _, res in pairs]
            probe = data.draw(st.integers(stamps[0] - 10, stamps[-1] + 10))
            expected = next((i for i, s in enumerate(stamps) if s >= probe), len(stamps))
            assert self.store.offset_for_timestamp(topic, qid, probe) == expected

        @invariant()
        def offsets_match_model(self) -> None:
            for (topic, qid), pairs in self.queues.items():
                assert self.store.max_offset(topic, qid) == len(pairs)
                assert self.store.min_offset(topic, qid) == 0

        def teardown(self) -> None:
            self.opener.close_all()
            shutil.rmtree(self.dir, ignore_errors=True)

    return StoreModel
