"""Conformance clause of the DirectAppending store capability (mixed into StoreConformance).

A store's direct append is called from C by the broker's compiled single put; here it is called
through ``plugmq.kit.requestcodec.append_direct``, which passes a request's fields exactly as that
put does. Skips without the capability, or when the store offers no direct append now.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from plugmq.conformance._store_support import TOPIC, Opener, StoreUnderTest, request
from plugmq.core import AppendRequest, ManualClock, MessageStore
from plugmq.core.contracts import DirectAppending, ReplicableStore
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE
from plugmq.kit import requestcodec

__all__ = ["DirectAppendClauses"]


def _outcome(call: Callable[[], object]) -> tuple[str, object]:
    """What a call answered, or what it raised (type and words: the errors must be the same)."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the two paths must refuse alike, whatever they refuse with
        return "raised", f"{type(exc).__name__}: {exc}"


def _requests() -> list[AppendRequest]:
    """Plain, keyed and indexed requests, and ones the store must refuse (checked before writing)."""
    trusted = AppendRequest.trusted
    good = [request(queue_id=i % 3, body=f"d{i}".encode(), keys=f"k{i} k{i + 1}" if i % 2 else None, uniq=f"U{i}",
                    tags="T" if i % 3 else None, tags_code=i, born_timestamp_ms=i * 7, sys_flag=i % 2)
            for i in range(12)]
    refused = [
        trusted(TOPIC, 0, b"x" * (DEFAULT_MAX_BODY_SIZE + 1), {}),  # body over the limit
        trusted(TOPIC, 0, b"x", {"a\x01b": "v"}),  # a separator in a property name
        trusted(TOPIC, 0, b"x", {"a": "v" * 40_000}),  # properties over what a record holds
        trusted(TOPIC, -1, b"x", {}),  # a negative queue id
        trusted(TOPIC, 0, b"x", {}, sys_flag=2**40),  # an int field out of range
        trusted("bad/name", 0, b"x", {}),  # a topic name that cannot be a directory
        trusted(TOPIC, 0, b"x", {}, born_host="[::1]:9"),  # an IPv6 born host: kept in a property
    ]
    return [*good[:6], *refused, *good[6:]]


class DirectAppendClauses:
    """The DirectAppending clause (see plugmq.core.contracts.storage.DirectAppending)."""

    def test_direct_append_stores_what_append_stores(self, store_plugin: StoreUnderTest, tmp_path: Path,
                                                     clock: ManualClock) -> None:
        """The same requests through the direct append and through ``append`` (two stores, one
        clock) answer the same results and errors, read back the same and index the same; the
        direct append declines while a log listener is set (``append`` then tells it)."""
        openers = [Opener(store_plugin, tmp_path / name, clock) for name in ("append", "direct")]
        try:
            plain, direct = openers[0](), openers[1]()
            if not isinstance(direct, DirectAppending):
                pytest.skip(f"{store_plugin.plugin}'s store has no direct append (DirectAppending)")
            capsule = direct.direct_append()
            if capsule is None:
                pytest.skip(f"{store_plugin.plugin}'s store offers no direct append with these options")
            if not requestcodec.native_available():
                pytest.skip("plugmq.kit._requestcodec was not built: nothing calls a direct append")
            for req in _requests():
                clock.advance(3)
                expected = _outcome(functools.partial(plain.append, req))
                got = _outcome(functools.partial(requestcodec.append_direct, capsule, req))
                assert got == expected, f"the direct append answered otherwise than append for {req!r}"
            _assert_same_contents(plain, direct)
            if isinstance(direct, ReplicableStore):
                _assert_declines_for_a_listener(direct, capsule)
        finally:
            for opener in openers:
                opener.close_all()


def _assert_same_contents(plain: MessageStore, direct: MessageStore) -> None:
    for queue_id in range(3):
        entries = plain.read_queue(TOPIC, queue_id, 0, 100)
        assert direct.read_queue(TOPIC, queue_id, 0, 100) == entries
        assert [direct.read(e.commit_log_offset) for e in entries] == [plain.read(e.commit_log_offset) for e in entries]
    for key in ("k1", "k2", "k6", "U3"):
        found = [m.commit_log_offset for m in direct.query_by_key(TOPIC, key)]
        assert found, f"key {key!r} not indexed"
        assert found == [m.commit_log_offset for m in plain.query_by_key(TOPIC, key)], key


def _assert_declines_for_a_listener(store: ReplicableStore, capsule: object) -> None:
    heard: list[int] = []
    store.set_log_listener(heard.append)
    try:
        assert requestcodec.append_direct(capsule, request(body=b"listened")) is None, \
            "the direct append stored while a log listener was set (the listener would not hear of it)"
        assert heard == []
    finally:
        store.set_log_listener(None)
    stored = requestcodec.append_direct(capsule, request(body=b"after"))
    assert stored is not None and heard == [], "the direct append did not come back when the listener went"
    read = store.read(stored.commit_log_offset)
    assert read is not None and read.body == b"after"
