"""The rebalance sort order helper and the allocate-by-name API."""

from __future__ import annotations

import pytest

import plugmq
import plugmq.plugins.alloc as alloc
from plugmq.broker.allocation_api import allocate_with
from plugmq.core import MessageQueue
from plugmq.core.errors import AllocationError
from plugmq.core.rebalance_order import rocketmq_sorted

STRATEGIES = alloc.plugmq_allocate_strategies()


def test_queues_sort_by_topic_then_broker_string_then_numeric_queue_id() -> None:
    given = [
        MessageQueue("T", "broker-9", 0),
        MessageQueue("T", "broker-10", 10),
        MessageQueue("T", "broker-10", 2),
        MessageQueue("A", "broker-9", 1),
    ]
    got, _ = rocketmq_sorted(given, [])
    assert [(q.topic, q.broker_name, q.queue_id) for q in got] == [
        ("A", "broker-9", 1),
        ("T", "broker-10", 2),
        ("T", "broker-10", 10),
        ("T", "broker-9", 0),
    ]


def test_consumer_ids_sort_as_plain_strings_keeping_duplicates() -> None:
    _, ids = rocketmq_sorted([], ["192.168.0.2@x", "192.168.0.10@x", "192.168.0.2@x", "10.0.0.1@y"])
    assert ids == ["10.0.0.1@y", "192.168.0.10@x", "192.168.0.2@x", "192.168.0.2@x"]


def test_duplicate_queue_appears_once_as_from_rocketmqs_queue_set() -> None:
    q = MessageQueue("T", "b", 1)
    got, _ = rocketmq_sorted([q, MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)], [])
    assert got == [MessageQueue("T", "b", 0), q]


def test_java_utf16_order_beyond_the_basic_plane() -> None:
    # Java compares UTF-16 code units: U+1F600 is D83D DE00, below U+FF21. Python's code-point
    # order would put it last.
    smiley, fullwidth_a = "c\U0001F600", "c\uFF21"
    _, ids = rocketmq_sorted([], [fullwidth_a, smiley])
    assert ids == [smiley, fullwidth_a]
    assert sorted([fullwidth_a, smiley]) == [fullwidth_a, smiley]
    queues, _ = rocketmq_sorted([MessageQueue("T", fullwidth_a, 0), MessageQueue("T", smiley, 0)], [])
    assert [q.broker_name for q in queues] == [smiley, fullwidth_a]


def test_helper_is_pure() -> None:
    queues = [MessageQueue("T", "b", 2), MessageQueue("T", "b", 1)]
    ids = ["c2", "c1"]
    rocketmq_sorted(queues, ids)
    assert queues == [MessageQueue("T", "b", 2), MessageQueue("T", "b", 1)] and ids == ["c2", "c1"]


def test_sorted_duplicate_id_takes_the_first_occurrences_share() -> None:
    queues, ids = rocketmq_sorted([MessageQueue("T", "b", i) for i in range(6)], ["b", "a", "a"])
    assert ids == ["a", "a", "b"]
    share = allocate_with(STRATEGIES, "AVG", "a", queues, ids)
    assert [q.queue_id for q in share] == [0, 1]


def test_allocate_with_runs_the_named_strategy_with_params() -> None:
    queues = [MessageQueue("T", "broker-a", i) for i in range(8)]
    got = allocate_with(STRATEGIES, "CONSISTENT_HASH", "c1", queues, ["c1", "c2", "c3"], virtual_nodes=10)
    assert [q.queue_id for q in got] == [0, 4]
    got = allocate_with(STRATEGIES, "AVG_BY_CIRCLE", "c2", iter(queues), iter(["c1", "c2"]), consumer_group="g")
    assert [q.queue_id for q in got] == [1, 3, 5, 7]


def test_allocate_with_does_not_sort() -> None:
    queues = [MessageQueue("T", "b", i) for i in (3, 2, 1, 0)]
    assert [q.queue_id for q in allocate_with(STRATEGIES, "AVG", "c1", queues, ["c1", "c2"])] == [3, 2]


def test_unknown_strategy_lists_known_names_and_suggests_a_close_one() -> None:
    with pytest.raises(AllocationError, match=r"'AVG_CIRCLE'\. Did you mean 'AVG_BY_CIRCLE'\? Known strategies: AVG, "):
        allocate_with(STRATEGIES, "AVG_CIRCLE", "c1", [], [])
    with pytest.raises(AllocationError) as info:
        allocate_with(STRATEGIES, "ROUND_ROBIN_XYZ", "c1", [], [])
    assert "Did you mean" not in str(info.value) and "CONSISTENT_HASH, MACHINE_ROOM" in str(info.value)
    with pytest.raises(AllocationError, match="no allocation plugin is installed"):
        allocate_with({}, "AVG", "c1", [], [])


def test_unknown_parameter_reaches_the_caller() -> None:
    with pytest.raises(AllocationError, match="'virtual_node'"):
        allocate_with(STRATEGIES, "CONSISTENT_HASH", "c1", [MessageQueue("T", "b", 0)], ["c1"], virtual_node=3)


def test_public_allocate_uses_the_installed_alloc_plugin() -> None:
    queues = [MessageQueue("T", "b", i) for i in range(5)]
    assert [q.queue_id for q in plugmq.allocate("AVG", "c2", queues, ["c1", "c2"])] == [3, 4]
