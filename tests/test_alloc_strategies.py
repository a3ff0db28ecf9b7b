"""Hand-checked cases for every rule of shared/spec/allocation.md (RocketMQ 5.3's strategies)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

import plugmq.plugins.alloc as alloc
from plugmq.core import AllocateStrategy, Family, MessageQueue
from plugmq.core.errors import AllocationError
from plugmq.plugins.alloc.consistent_hash import md5_hash

STRATEGIES = alloc.plugmq_allocate_strategies()
CHECKED = ["AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM_NEARBY", "MACHINE_ROOM"]


def mq(broker: str, queue_id: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


def queues(broker: str, n: int, topic: str = "T") -> list[MessageQueue]:
    return [mq(broker, i, topic) for i in range(n)]


def ids_of(result: list[MessageQueue]) -> list[int]:
    return [q.queue_id for q in result]


def share(strategy: str, current: str, qs: list[MessageQueue], cids: list[str], **params) -> list[MessageQueue]:
    return STRATEGIES[strategy](**params).allocate("group", current, qs, cids)


def room_params(strategy: str) -> dict:
    return {"rooms": ["room1"]} if strategy == "MACHINE_ROOM" else {}


# ----------------------------------------------------------------------------------------------
# shared input checks
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", CHECKED)
def test_empty_current_id_is_checked_first(strategy: str) -> None:
    with pytest.raises(AllocationError, match=r"^currentCID is empty$"):
        share(strategy, "", [], [], **room_params(strategy))


@pytest.mark.parametrize("strategy", CHECKED)
def test_no_queues_is_checked_before_no_consumers(strategy: str) -> None:
    with pytest.raises(AllocationError, match=r"^mqAll is null or mqAll empty$"):
        share(strategy, "c1", [], [], **room_params(strategy))


@pytest.mark.parametrize("strategy", CHECKED)
def test_no_consumers(strategy: str) -> None:
    with pytest.raises(AllocationError, match=r"^cidAll is null or cidAll empty$"):
        share(strategy, "c1", queues("room1@b", 2), [], **room_params(strategy))


@pytest.mark.parametrize("strategy", CHECKED)
def test_current_id_not_among_consumers_gets_nothing_without_error(strategy: str) -> None:
    qs = queues("room1@b", 4)
    assert share(strategy, "c1", qs, ["c1", "c2"], **room_params(strategy)) != []
    assert share(strategy, "c9", qs, ["c1", "c2"], **room_params(strategy)) == []


def test_membership_is_checked_before_rooms_are_resolved() -> None:
    # Unresolvable names would be an error, but a non-member returns before looking at them.
    assert share("MACHINE_ROOM_NEARBY", "x-c9", queues("-bad", 2), ["-c1"]) == []
    assert share("MACHINE_ROOM", "c9", queues("room1@b", 2), ["c1"]) == []  # rooms unset, no error


# ----------------------------------------------------------------------------------------------
# AVG
# ----------------------------------------------------------------------------------------------


def test_avg_remainder_goes_to_the_first_consumers() -> None:
    qs, cids = queues("b", 10), ["c1", "c2", "c3"]
    # 10 % 3 = 1: c1 gets 4 from 0; c2, c3 get 3 from 1*3+1 = 4 and 2*3+1 = 7.
    assert [ids_of(share("AVG", c, qs, cids)) for c in cids] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    qs = queues("b", 8)
    assert [ids_of(share("AVG", c, qs, cids)) for c in cids] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_avg_more_consumers_than_queues() -> None:
    qs, cids = queues("b", 3), ["c1", "c2", "c3", "c4", "c5"]
    assert [ids_of(share("AVG", c, qs, cids)) for c in cids] == [[0], [1], [2], [], []]
    qs = queues("b", 3)
    assert [ids_of(share("AVG", c, qs, cids[:3])) for c in cids[:3]] == [[0], [1], [2]]


def test_avg_takes_positions_of_the_input_as_given() -> None:
    qs = list(reversed(queues("b", 4)))
    assert ids_of(share("AVG", "c1", qs, ["c1", "c2"])) == [3, 2]
    assert ids_of(share("AVG", "c1", qs, ["c2", "c1"])) == [1, 0]  # c1 is second in this list


def test_avg_duplicate_id_uses_the_first_occurrence() -> None:
    qs, cids = queues("b", 6), ["a", "a", "b"]
    assert ids_of(share("AVG", "a", qs, cids)) == [0, 1]
    assert ids_of(share("AVG", "b", qs, cids)) == [4, 5]  # queues 2 and 3 stay unowned


# ----------------------------------------------------------------------------------------------
# AVG_BY_CIRCLE
# ----------------------------------------------------------------------------------------------


def test_circle_deals_round_robin() -> None:
    qs, cids = queues("b", 10), ["c1", "c2", "c3"]
    assert [ids_of(share("AVG_BY_CIRCLE", c, qs, cids)) for c in cids] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [ids_of(share("AVG_BY_CIRCLE", c, qs[:2], cids)) for c in cids] == [[0], [1], []]


def test_circle_duplicate_id_uses_the_first_occurrence() -> None:
    qs, cids = queues("b", 6), ["a", "a", "b"]
    assert ids_of(share("AVG_BY_CIRCLE", "a", qs, cids)) == [0, 3]
    assert ids_of(share("AVG_BY_CIRCLE", "b", qs, cids)) == [2, 5]


# ----------------------------------------------------------------------------------------------
# CONSISTENT_HASH
# ----------------------------------------------------------------------------------------------


def test_md5_hash_is_first_four_digest_bytes_big_endian_unsigned() -> None:
    # Values printed by Java's MessageDigest.getInstance("MD5") through RocketMQ's MD5Hash code.
    assert md5_hash("MessageQueue [topic=T, brokerName=broker-a, queueId=0]") == 1630488180
    assert md5_hash("c1-0") == 3886541579  # above 2**31: unsigned, as the Java long holds it
    assert md5_hash("c1-9") == 1522780571
    assert md5_hash("é") == 1725812119  # UTF-8 bytes


def test_consistent_hash_queue_key_is_rocketmq_to_string() -> None:
    seen: list[str] = []

    def recording(key: str) -> int:
        seen.append(key)
        return 0

    share("CONSISTENT_HASH", "c1", [mq("broker-a", 3, "TopicX")], ["c1"], virtual_nodes=2, hash_function=recording)
    assert seen == ["c1-0", "c1-1", "MessageQueue [topic=TopicX, brokerName=broker-a, queueId=3]"]


def test_consistent_hash_golden_md5_case() -> None:
    # Computed by running RocketMQ's ConsistentHashRouter code (default 10 virtual nodes, MD5).
    qs, cids = queues("broker-a", 8), ["c1", "c2", "c3"]
    got = [ids_of(share("CONSISTENT_HASH", c, qs, cids)) for c in cids]
    assert got == [[0, 4], [1, 2, 5, 6, 7], [3]]


def _table_hash(table: dict[str, int]):
    def h(key: str) -> int:
        if key in table:
            return table[key]
        return int(key.rsplit("queueId=", 1)[1].rstrip("]"))  # queue N hashes to N

    return h


def test_consistent_hash_routes_to_first_entry_at_or_after_the_queue_hash_wrapping() -> None:
    ring = {"a-0": 10, "a-1": 50, "b-0": 30, "b-1": 70}
    qs = [mq("x", n) for n in (5, 10, 11, 30, 31, 50, 51, 70, 71, 99)]
    params = {"virtual_nodes": 2, "hash_function": _table_hash(ring)}
    assert ids_of(share("CONSISTENT_HASH", "a", qs, ["a", "b"], **params)) == [5, 10, 31, 50, 71, 99]
    assert ids_of(share("CONSISTENT_HASH", "b", qs, ["a", "b"], **params)) == [11, 30, 51, 70]


def test_consistent_hash_collision_later_entry_wins() -> None:
    ring = {"a-0": 10, "b-0": 10, "c-0": 40}
    qs = [mq("x", 5), mq("x", 20)]
    params = {"virtual_nodes": 1, "hash_function": _table_hash(ring)}
    assert ids_of(share("CONSISTENT_HASH", "b", qs, ["a", "b", "c"], **params)) == [5]
    assert share("CONSISTENT_HASH", "a", qs, ["a", "b", "c"], **params) == []
    # Listed the other way round, a's entry is the later one.
    assert ids_of(share("CONSISTENT_HASH", "a", qs, ["b", "a", "c"], **params)) == [5]


def test_consistent_hash_duplicate_id_numbers_its_nodes_on() -> None:
    seen: list[str] = []

    def recording(key: str) -> int:
        seen.append(key)
        return len(seen) * 1000

    share("CONSISTENT_HASH", "a", [mq("x", 0)], ["a", "b", "a"], virtual_nodes=2, hash_function=recording)
    assert seen[:6] == ["a-0", "a-1", "b-0", "b-1", "a-2", "a-3"]


def test_consistent_hash_duplicate_numbering_counts_what_the_ring_holds() -> None:
    # RocketMQ counts a node's entries on the ring: one lost to a collision is not counted.
    seen: list[str] = []

    def colliding(key: str) -> int:
        seen.append(key)
        return 7 if key in ("a-0", "b-0") else 100 + len(seen)

    share("CONSISTENT_HASH", "a", [mq("x", 0)], ["a", "b", "a"], virtual_nodes=1, hash_function=colliding)
    assert seen[:3] == ["a-0", "b-0", "a-0"]


def test_consistent_hash_result_in_input_order_and_independent_of_consumer_order() -> None:
    qs, cids = queues("broker-a", 30), ["c1", "c2", "c3", "c4"]
    forward = {c: share("CONSISTENT_HASH", c, qs, cids) for c in cids}
    assert {c: share("CONSISTENT_HASH", c, qs, list(reversed(cids))) for c in cids} == forward
    backward = {c: share("CONSISTENT_HASH", c, list(reversed(qs)), cids) for c in cids}
    assert backward == {c: list(reversed(v)) for c, v in forward.items()}


def test_consistent_hash_zero_virtual_nodes_gives_nobody_anything() -> None:
    qs, cids = queues("b", 5), ["c1", "c2"]
    assert [share("CONSISTENT_HASH", c, qs, cids, virtual_nodes=0) for c in cids] == [[], []]
    with pytest.raises(AllocationError, match="mqAll is null"):
        share("CONSISTENT_HASH", "c1", [], cids, virtual_nodes=0)  # the checks still run


@pytest.mark.parametrize("count", [-1, -7])
def test_consistent_hash_negative_virtual_nodes(count: int) -> None:
    with pytest.raises(AllocationError, match=rf"^illegal virtualNodeCnt :{count}$"):
        STRATEGIES["CONSISTENT_HASH"](virtual_nodes=count)


def test_consistent_hash_ring_cache_follows_membership() -> None:
    strategy = STRATEGIES["CONSISTENT_HASH"]()
    qs = queues("broker-a", 8)
    three = strategy.allocate("g", "c1", qs, ["c1", "c2", "c3"])
    alone = strategy.allocate("g", "c1", qs, ["c1"])
    assert ids_of(three) == [0, 4] and alone == qs
    assert strategy.allocate("g", "c1", qs, ["c1", "c2", "c3"]) == three


# ----------------------------------------------------------------------------------------------
# MACHINE_ROOM_NEARBY
# ----------------------------------------------------------------------------------------------

ROOMS_QUEUES = queues("bj-b1", 2) + queues("gz-b1", 3) + queues("hz-b1", 5) + queues("sh-b1", 2)


def names(result: list[MessageQueue]) -> list[str]:
    return [f"{q.broker_name.split('-')[0]}{q.queue_id}" for q in result]


def test_nearby_own_room_first_then_consumerless_rooms_over_everyone() -> None:
    cids = ["hz-c1", "hz-c2", "sh-c1"]
    got = {c: names(share("MACHINE_ROOM_NEARBY", c, ROOMS_QUEUES, cids)) for c in cids}
    assert got == {
        # hz: 5 over the 2 hz consumers; then bj (2) and gz (3) each over all 3 consumers
        "hz-c1": ["hz0", "hz1", "hz2", "bj0", "gz0"],
        "hz-c2": ["hz3", "hz4", "bj1", "gz1"],
        "sh-c1": ["sh0", "sh1", "gz2"],
    }


def test_nearby_consumerless_rooms_in_sorted_room_order() -> None:
    unsorted = queues("gz-b1", 2) + queues("bj-b1", 2)
    assert names(share("MACHINE_ROOM_NEARBY", "hz-c1", unsorted, ["hz-c1"])) == ["bj0", "bj1", "gz0", "gz1"]


def test_nearby_consumer_in_a_room_without_brokers_gets_only_consumerless_shares() -> None:
    qs, cids = queues("a-b", 2) + queues("z-b", 4), ["a-c1", "x-c1"]
    assert names(share("MACHINE_ROOM_NEARBY", "x-c1", qs, cids)) == ["z2", "z3"]
    assert names(share("MACHINE_ROOM_NEARBY", "a-c1", qs, cids)) == ["a0", "a1", "z0", "z1"]


def test_nearby_no_consumer_in_any_broker_room_splits_every_room_separately() -> None:
    qs, cids = queues("a-b", 3) + queues("b-b", 2), ["x-c1", "y-c1"]
    assert names(share("MACHINE_ROOM_NEARBY", "x-c1", qs, cids)) == ["a0", "a1", "b0"]
    assert names(share("MACHINE_ROOM_NEARBY", "y-c1", qs, cids)) == ["a2", "b1"]
    # Not the same as AVG over everything (x would get a0, a1, a2).
    assert names(share("AVG", "x-c1", qs, cids)) == ["a0", "a1", "a2"]


def test_nearby_inner_strategy_and_its_params() -> None:
    cids = ["hz-c1", "hz-c2", "sh-c1"]
    got = names(share("MACHINE_ROOM_NEARBY", "hz-c1", ROOMS_QUEUES, cids, inner="AVG_BY_CIRCLE"))
    assert got == ["hz0", "hz2", "hz4", "bj0", "gz0"]
    with pytest.raises(AllocationError, match=r"illegal virtualNodeCnt :-1"):
        STRATEGIES["MACHINE_ROOM_NEARBY"](inner="CONSISTENT_HASH", inner_params={"virtual_nodes": -1})
    with pytest.raises(AllocationError, match=r"inner must name a strategy.*'AVG_CIRCLE'.*AVG_BY_CIRCLE"):
        STRATEGIES["MACHINE_ROOM_NEARBY"](inner="AVG_CIRCLE")
    with pytest.raises(AllocationError, match=r"inner_params must be a dict"):
        STRATEGIES["MACHINE_ROOM_NEARBY"](inner_params=[1])


def test_nearby_default_resolver_and_custom_resolver() -> None:
    # No "-": the whole name is the room, so "hz" consumers and broker "hz" share a room.
    assert names(share("MACHINE_ROOM_NEARBY", "hz", queues("hz", 2) + queues("sh-b", 1), ["hz", "sh-c"])) == [
        "hz0",
        "hz1",
    ]
    rooms = {"b1": "east", "b2": "west", "c1": "east", "c2": "west"}
    qs = queues("b1", 2) + queues("b2", 2)
    got = share("MACHINE_ROOM_NEARBY", "c2", qs, ["c1", "c2"], resolver=rooms.__getitem__)
    assert [(q.broker_name, q.queue_id) for q in got] == [("b2", 0), ("b2", 1)]
    with pytest.raises(AllocationError, match="resolver must be a callable"):
        STRATEGIES["MACHINE_ROOM_NEARBY"](resolver="by-dash")


def test_nearby_empty_room_is_an_error_naming_the_queue_or_consumer() -> None:
    with pytest.raises(
        AllocationError, match=r"^Machine room is null for mq MessageQueue \[topic=T, brokerName=-b, queueId=1\]"
    ):
        share("MACHINE_ROOM_NEARBY", "a-c", [mq("a-b", 0), mq("-b", 1)], ["a-c"])
    with pytest.raises(AllocationError, match=r"^Machine room is null for consumer id -c2"):
        share("MACHINE_ROOM_NEARBY", "a-c", [mq("a-b", 0)], ["a-c", "-c2"])
    with pytest.raises(AllocationError, match=r"^Machine room is null for consumer id c1.*None"):
        share("MACHINE_ROOM_NEARBY", "c1", [mq("a-b", 0)], ["c1"], resolver=lambda n: None if n == "c1" else "a")


# ----------------------------------------------------------------------------------------------
# MACHINE_ROOM
# ----------------------------------------------------------------------------------------------


def test_machine_room_split_and_remainder() -> None:
    qs, cids = queues("room1@b", 5), ["c1", "c2"]
    assert ids_of(share("MACHINE_ROOM", "c1", qs, cids, rooms=["room1"])) == [0, 1, 4]
    assert ids_of(share("MACHINE_ROOM", "c2", qs, cids, rooms=["room1"])) == [2, 3]


def test_machine_room_only_two_part_names_of_configured_rooms_qualify() -> None:
    qs = [
        mq("room1@b", 0),
        mq("room1@", 1),  # trailing empty part dropped: one part
        mq("room1@b@c", 2),  # three parts
        mq("room1@b@", 3),  # "room1", "b" after the trailing empty part is dropped
        mq("room2@b", 4),  # room not configured
        mq("@b", 5),  # room ""
        mq("plain", 6),
        mq("room1@x", 7),
    ]
    assert ids_of(share("MACHINE_ROOM", "c1", qs, ["c1"], rooms=["room1"])) == [0, 3, 7]
    assert ids_of(share("MACHINE_ROOM", "c1", qs, ["c1"], rooms=[""])) == [5]
    assert ids_of(share("MACHINE_ROOM", "c1", qs, ["c1"], rooms="room1,room2")) == [0, 3, 4, 7]


def test_machine_room_leaves_other_queues_unassigned() -> None:
    qs, cids = queues("room1@b", 2) + queues("room9@b", 3), ["c1", "c2", "c3"]
    assert [ids_of(share("MACHINE_ROOM", c, qs, cids, rooms=["room1"])) for c in cids] == [[0], [1], []]


def test_machine_room_without_rooms() -> None:
    with pytest.raises(AllocationError, match=r"no rooms configured.*'room1@b'.*rooms=\["):
        share("MACHINE_ROOM", "c1", queues("room1@b", 1), ["c1"])
    assert share("MACHINE_ROOM", "c1", queues("broker-a", 3), ["c1"]) == []  # nothing names a room
    with pytest.raises(AllocationError, match="rooms must be a list of room names"):
        STRATEGIES["MACHINE_ROOM"](rooms=[1, 2])


# ----------------------------------------------------------------------------------------------
# room resolvers: what a live broker passes (configured rooms instead of names)
# ----------------------------------------------------------------------------------------------

BROKER_ROOMS = {"broker-a": "r1", "broker-b": "r1", "broker-c": "r2", "broker-d": None}


def test_machine_room_with_configured_rooms_equals_rocketmqs_answer_on_room_named_brokers() -> None:
    # RocketMQ reads rooms from "<room>@<broker>" names; renaming keeps the sort order here.
    plain = [mq(b, i) for b in BROKER_ROOMS for i in range(3)]
    named = [mq(f"{room}@{b}" if room else b, i) for b, room in BROKER_ROOMS.items() for i in range(3)]
    cids = ["c1", "c2", "c3"]
    for rooms in (["r1"], ["r2"], ["r1", "r2"]):
        for c in cids:
            configured = share("MACHINE_ROOM", c, plain, cids, rooms=rooms, broker_room=BROKER_ROOMS.get)
            by_name = share("MACHINE_ROOM", c, named, cids, rooms=rooms)
            assert [(q.broker_name, q.queue_id) for q in configured] == [
                (q.broker_name.split("@")[-1], q.queue_id) for q in by_name]
    # A broker with no room never qualifies; a broker in a room with no configured set is an error.
    assert share("MACHINE_ROOM", "c1", queues("broker-d", 2), ["c1"], broker_room=BROKER_ROOMS.get) == []
    with pytest.raises(AllocationError, match="'broker-a' is in room 'r1'"):
        share("MACHINE_ROOM", "c1", queues("broker-a", 1), ["c1"], broker_room=BROKER_ROOMS.get)


def test_nearby_with_configured_rooms_equals_rocketmqs_answer_on_room_named_brokers_and_consumers() -> None:
    consumer_rooms = {"x-1": "r1", "x-2": "r1", "y-1": "r2"}
    plain = [mq(b, i) for b in ("broker-a", "broker-b", "broker-c") for i in range(3)]
    named = [mq(f"{BROKER_ROOMS[b]}-{b}", i) for b in ("broker-a", "broker-b", "broker-c") for i in range(3)]
    cids = list(consumer_rooms)
    named_cids = [f"{consumer_rooms[c]}-{c}" for c in cids]
    for c, named_c in zip(cids, named_cids, strict=True):
        configured = share("MACHINE_ROOM_NEARBY", c, plain, cids, broker_room=BROKER_ROOMS.get,
                           consumer_room=consumer_rooms.get)
        by_name = share("MACHINE_ROOM_NEARBY", named_c, named, named_cids)
        assert [(q.broker_name, q.queue_id) for q in configured] == [
            (q.broker_name.split("-", 1)[1], q.queue_id) for q in by_name]
    # The consumer side defaults to the shared resolver; each side can be set on its own.
    assert share("MACHINE_ROOM_NEARBY", "y-1", plain, cids, broker_room=BROKER_ROOMS.get,
                 resolver=lambda cid: consumer_rooms.get(cid)) == plain[6:]
    with pytest.raises(AllocationError, match=r"Machine room is null for mq .*brokerName=broker-d"):
        share("MACHINE_ROOM_NEARBY", "x-1", queues("broker-d", 1), ["x-1"], broker_room=BROKER_ROOMS.get,
              consumer_room=consumer_rooms.get)
    for param in ("broker_room", "consumer_room"):
        with pytest.raises(AllocationError, match=f"parameter {param} must be a callable"):
            STRATEGIES["MACHINE_ROOM_NEARBY"](**{param: "r1"})
        with pytest.raises(AllocationError, match=f"parameter {param} must be a callable"):
            STRATEGIES["MACHINE_ROOM"](**{param: "r1"})


def test_room_strategies_say_they_take_room_resolvers() -> None:
    capabilities = alloc.plugmq_declare().capabilities
    assert {name for name, c in capabilities.items() if c.room_aware} == {"MACHINE_ROOM", "MACHINE_ROOM_NEARBY"}


# ----------------------------------------------------------------------------------------------
# CONFIG
# ----------------------------------------------------------------------------------------------


def test_config_returns_configured_list_as_is_to_everyone() -> None:
    configured = [mq("elsewhere", 9), mq("broker-a", 0)]
    strategy = STRATEGIES["CONFIG"](message_queues=configured)
    assert strategy.allocate("g", "c1", queues("broker-a", 2), ["c1", "c2"]) == configured
    assert strategy.allocate("g", "c9", queues("broker-a", 2), ["c1"]) == configured  # no membership check
    assert strategy.allocate("g", "", [], []) == configured  # no input checks at all
    strategy.allocate("g", "c1", [], []).clear()
    assert strategy.allocate("g", "c1", [], []) == configured  # callers get their own copy


def test_config_accepts_queue_dicts() -> None:
    strategy = STRATEGIES["CONFIG"](message_queues=[{"topic": "T", "broker_name": "b", "queue_id": 3}])
    assert strategy.allocate("g", "c1", [], []) == [mq("b", 3)]
    with pytest.raises(AllocationError, match="must be a list of MessageQueue"):
        STRATEGIES["CONFIG"](message_queues=["T:b:3"])
    with pytest.raises(AllocationError, match="must be a list of queues"):
        STRATEGIES["CONFIG"](message_queues="T:b:3")


def test_config_never_configured_gives_nothing_with_a_warning() -> None:
    strategy = STRATEGIES["CONFIG"]()
    with capture_logs() as logs:
        assert strategy.allocate("grp", "c1", queues("b", 3), ["c1"]) == []
    assert [(e["log_level"], e["consumer_group"], e["current_id"]) for e in logs] == [("warning", "grp", "c1")]
    assert "no message_queues configured" in logs[0]["event"]
    with capture_logs() as logs:
        STRATEGIES["CONFIG"](message_queues=[]).allocate("grp", "c1", [], [])
    assert logs == []  # configured empty is not "never configured"


# ----------------------------------------------------------------------------------------------
# parameters and declaration
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "params", "pattern"),
    [
        ("AVG", {"virtual_nodes": 3}, r"'virtual_nodes' for allocation strategy AVG; accepted parameters: none"),
        ("CONSISTENT_HASH", {"virtual_node": 3}, r"'virtual_node'.*accepted parameters: virtual_nodes, hash_function"),
        ("MACHINE_ROOM_NEARBY", {"room": "a"}, r"'room'.*accepted parameters: inner, inner_params, resolver"),
        ("MACHINE_ROOM", {"room": "a", "x": 1}, r"parameters 'room', 'x'.*accepted parameters: rooms, broker_room"),
        ("CONFIG", {"queues": []}, r"'queues'.*accepted parameters: message_queues"),
    ],
)
def test_unknown_parameter_names_the_parameter_and_the_accepted_ones(strategy, params, pattern) -> None:
    with pytest.raises(AllocationError, match=pattern):
        STRATEGIES[strategy](**params)


@pytest.mark.parametrize("bad", ["10", True, 2.0])
def test_virtual_nodes_must_be_an_int(bad) -> None:
    with pytest.raises(AllocationError, match="virtual_nodes must be an int"):
        STRATEGIES["CONSISTENT_HASH"](virtual_nodes=bad)


def test_hash_function_must_be_callable_and_return_ints() -> None:
    with pytest.raises(AllocationError, match="hash_function must be a callable"):
        STRATEGIES["CONSISTENT_HASH"](hash_function="md5")
    with pytest.raises(AllocationError, match="must return an int, got 'x'"):
        share("CONSISTENT_HASH", "c1", queues("b", 1), ["c1"], hash_function=lambda key: "x")


def test_declaration() -> None:
    declaration = alloc.plugmq_declare()
    assert declaration.name == "alloc" and declaration.families == {Family.ALLOCATION}
    assert declaration.options is None
    unassigned = {n for n, caps in declaration.capabilities.items() if caps.may_leave_queues_unassigned}
    assert unassigned == {"MACHINE_ROOM", "CONFIG"}
    assert set(declaration.capabilities) == set(STRATEGIES) == set(CHECKED) | {"CONFIG"}
    # MACHINE_ROOM's example rooms must select queues of the conformance suite's "r<k>@b<n>" brokers.
    example = STRATEGIES["MACHINE_ROOM"](**declaration.capabilities["MACHINE_ROOM"].example_params)
    assert ids_of(example.allocate("g", "c1", [mq("r0@b1", 0), mq("r1@b2", 1), mq("r3@b1", 2)], ["c1"])) == [0, 1]
    for name, factory in STRATEGIES.items():
        built = factory(**room_params(name))
        assert isinstance(built, AllocateStrategy)
        assert built.name == name and built.capabilities == declaration.capabilities[name]
