"""The send path's shortcuts keep their promises: unique ids stay unique (threads, fork), cached
tag codes and topic checks give what the uncached ones give, trusted constructors build what the
validating ones build, and the boundary still refuses bad input."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugmq.broker.broker import Broker
from plugmq.core import AppendRequest, ManualClock, Message, Prop, StoredMessage, ValidationError, tags_code
from plugmq.core.errors import InvalidNameError
from plugmq.core.hashing import java_string_hash
from plugmq.core.message import new_unique_id


def test_unique_ids_are_unique_across_threads_and_keep_their_shape() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def make() -> None:
        ids = [new_unique_id() for _ in range(5000)]
        with lock:
            seen.extend(ids)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == len(seen) == 20000
    assert all(len(i) == 28 and int(i, 16) >= 0 and i == i.upper() for i in seen[:100])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    before = new_unique_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids and leave without running anything else
        os.close(read)
        os.write(write, " ".join(new_unique_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_ids = pipe.read().split()
    os.waitpid(pid, 0)
    parent_ids = [new_unique_id() for _ in range(3)]
    assert len(child_ids) == 3
    assert not set(child_ids) & {before, *parent_ids}
    assert child_ids[0][:8] != parent_ids[0][:8]  # a new random prefix


def _uncached_tags_code(tags: str | None) -> int:
    code = 0
    for name in [t.strip() for t in (tags or "").split("||") if t.strip()]:
        code |= java_string_hash(name)
    return code


@given(st.one_of(st.none(), st.text(max_size=30), st.lists(st.text(min_size=1, max_size=8), max_size=4).map("||".join)))
def test_cached_tag_codes_equal_the_computed_ones(tags: str | None) -> None:
    assert tags_code(tags) == _uncached_tags_code(tags)
    assert tags_code(tags) == _uncached_tags_code(tags)  # second time from the cache


def test_java_hash_matches_java() -> None:
    # values computed by java.lang.String#hashCode
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("\U0001f600") == 1772899  # a surrogate pair: two UTF-16 units
    assert java_string_hash("") == 0


def test_trusted_constructors_build_what_the_validating_ones_build() -> None:
    props = {Prop.TAGS: "TagA", Prop.UNIQ_KEY: "U1", "k": "v"}
    fields: dict[str, Any] = {"tags_code": 7, "born_timestamp_ms": 123, "born_host": "10.0.0.1:5", "reconsume_times": 2,
              "sys_flag": 4, "prepared_transaction_offset": 9}
    trusted = AppendRequest.trusted("T", 3, b"body", dict(props), **fields)
    assert trusted == AppendRequest("T", 3, b"body", props, **fields)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        trusted.topic = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        trusted.properties["k"] = "changed"  # type: ignore[index]
    stored_fields = ("T", 3, b"body", dict(props), 4, 1000, 150, 7, 123, 456, "10.0.0.1:5", "10.0.0.2:6", 2, 4, 9, 11)
    assert StoredMessage.trusted(*stored_fields) == StoredMessage(*stored_fields)


def test_the_topic_cache_does_not_let_bad_names_through() -> None:
    Message("GoodTopic", b"x")
    Message("GoodTopic", b"x")
    for bad in ("bad topic", "../x", "", "x" * 200):
        with pytest.raises(InvalidNameError):
            Message(bad, b"x")
        with pytest.raises(InvalidNameError):
            AppendRequest(bad, 0, b"x")


def test_broker_requests_equal_validated_ones(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000.0)
    with Broker.open(tmp_path, plugins=["store_mmap"], clock=clock) as broker:
        message = Message("Orders", b"payload", tags="TagA", keys=("k1", "k2"), properties={"user": "u"})
        request = broker.build_request(message, 2, reconsume_times=1, extra_properties={"extra": "e"})
        expected = AppendRequest(
            "Orders", 2, b"payload",
            {"user": "u", Prop.TAGS: "TagA", Prop.KEYS: "k1 k2", Prop.UNIQ_KEY: request.properties[Prop.UNIQ_KEY],
             "extra": "e"},
            tags_code=tags_code("TagA"), born_timestamp_ms=clock.now_ms(), reconsume_times=1)
        assert request == expected
        with pytest.raises(ValidationError):
            broker.build_request(message, -1)
        result = broker.put(message, 1)
        stored = broker.query_by_id(result.msg_id)
        assert stored is not None and stored.unique_id == result.unique_id and stored.tags == "TagA"
