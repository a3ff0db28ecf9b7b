"""Routes over a cluster view, group membership and cluster-wide assignments (no ZooKeeper needed)."""

from __future__ import annotations

from typing import Any

import pytest

from plugmq.broker.routes import registered_topics, topic_route
from plugmq.config.policy import GroupPolicies, GroupPolicy
from plugmq.core import BrokerRegistration, ClusterView, ConfigError, ManualClock, MessageQueue
from plugmq.core.contracts.cluster import ClusterTopic, TopicPermission, TopicRegistration
from plugmq.plugins.alloc.registry import STRATEGIES

pytest.importorskip("rocketmq.grpc_protocol", reason="the server modules need the serve extra")

from plugmq.server.assignment import Assigner, ConsumerMembers


def broker(name: str, port: int, topics: dict[str, int] | None = None, **fields: Any) -> BrokerRegistration:
    return BrokerRegistration("c", name, f"127.0.0.1:{port}",
                              topics={t: TopicRegistration(n) for t, n in (topics or {}).items()}, **fields)


def layout(view: ClusterView, topic: str, **kwargs: Any) -> list[tuple[str, int, int]]:
    return [(r.queue.broker_name, r.broker.broker_id, r.queue.queue_id) for r in topic_route(view, topic, **kwargs)]


# ------------------------------------------------------------------------------------- routes
def test_a_route_interleaves_brokers_queue_by_queue() -> None:
    view = ClusterView("c", (broker("b", 2, {"T": 2}), broker("a", 1, {"T": 3}), broker("c", 3, {"U": 1})))
    assert layout(view, "T") == [("a", 0, 0), ("b", 0, 0), ("a", 0, 1), ("b", 0, 1), ("a", 0, 2)]
    assert layout(view, "Nowhere") == []


def test_a_declared_topic_is_routed_over_every_master_that_applies_it() -> None:
    refuses = broker("c", 3, auto_create_topics=False)
    slave = broker("a", 4, broker_id=1, role="slave")
    view = ClusterView("c", (broker("a", 1, {"T": 4}), slave, broker("b", 2), refuses),
                       topics={"T": ClusterTopic(4, auto_created=True)})
    # Auto-created: masters that auto-create topics; b has not created it yet but will.
    assert {(b, i) for b, i, _ in layout(view, "T")} == {("a", 0), ("b", 0)}
    # Explicit (an admin's): every master, also those that do not auto-create.
    explicit = ClusterView("c", view.brokers, topics={"T": ClusterTopic(2)})
    assert [(b, q) for b, _, q in layout(explicit, "T")] == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1),
                                                              ("c", 1), ("a", 2), ("a", 3)]
    # A declaration this broker just wrote, before any view shows it.
    assert {b for b, _, _ in layout(ClusterView("c", view.brokers), "New",
                                    declared={"New": ClusterTopic(1, auto_created=True)})} == {"a", "b"}
    # Growing: the route shows the declared count while the broker catches up.
    grown = ClusterView("c", view.brokers, topics={"T": ClusterTopic(6, auto_created=True)})
    assert sum(1 for b, _, _ in layout(grown, "T") if b == "a") == 6


def test_a_slave_routes_the_topics_it_registered() -> None:
    view = ClusterView("c", (broker("a", 1, {"T": 2}), broker("a", 4, {"T": 2}, broker_id=1, role="slave")))
    assert layout(view, "T") == [("a", 0, 0), ("a", 1, 0), ("a", 0, 1), ("a", 1, 1)]


def test_a_slave_stands_in_read_only_while_its_broker_name_has_no_master() -> None:
    slave = broker("a", 4, {"T": 2}, broker_id=1, role="slave")
    second = broker("a", 5, {"T": 2}, broker_id=2, role="slave")
    other = broker("b", 2, {"T": 1})
    alone = topic_route(ClusterView("c", (slave, second, other)), "T")
    stand_in = [r for r in alone if r.standing_in]
    # The lowest id stands in, read-only (producers never send there); the other slave stays a slave.
    assert [(r.broker.broker_id, r.queue.queue_id, r.permission) for r in stand_in] == [
        (1, 0, TopicPermission.READ), (1, 1, TopicPermission.READ)]
    assert all(r.readable and not r.writable for r in stand_in)
    assert [r.permission for r in alone if r.broker.broker_id == 2] == [TopicPermission.READ_WRITE] * 2
    assert next(r for r in alone if r.queue.broker_name == "b").standing_in is False
    # A master of the name (back, or a slave elected with an epoch): the slave no longer stands in.
    for master in (broker("a", 1, {"T": 2}), broker("a", 6, {"T": 2}, broker_id=3, role="async_master", epoch=2)):
        assert not any(r.standing_in for r in topic_route(ClusterView("c", (master, slave, second)), "T"))
    # A slave that has not registered the topic stands in for nothing.
    assert not any(r.standing_in for r in topic_route(ClusterView("c", (broker("a", 4, {"U": 1}, broker_id=1,
                                                                                  role="slave"),)), "T"))


def test_brokers_register_client_topics_and_dead_letter_topics_read_only() -> None:
    registered = registered_topics({"T": 4, "%DLQ%g": 1, "%RETRY%g": 1, "SCHEDULE_TOPIC_XXXX": 18,
                                    "RMQ_SYS_TRANS_HALF_TOPIC": 1})
    assert registered == {"T": TopicRegistration(4), "%DLQ%g": TopicRegistration(1, TopicPermission.READ)}


def test_registrations_round_trip_and_reject_what_is_not_one() -> None:
    original = broker("a", 1, {"T": 2}, room="east", epoch=3)
    assert BrokerRegistration.from_dict(original.as_dict()) == original
    with pytest.raises(ValueError, match="not a broker registration"):
        BrokerRegistration.from_dict({"cluster": "c"})
    with pytest.raises(ValueError, match="endpoint must be 'host:port'"):
        broker("a", 0)
    with pytest.raises(ValueError, match="queue_count must be an integer 1..1024"):
        TopicRegistration(0)


# ------------------------------------------------------------------------------------- membership
def test_consumers_are_members_until_they_leave_or_go_silent() -> None:
    clock = ManualClock()
    members = ConsumerMembers(clock, expiry_s=30)
    members.seen("g", "c1")
    members.seen("g", "c2")
    members.seen("h", "c1")
    assert sorted(members.members("g")) == ["c1", "c2"]
    members.leave("c2")
    assert members.members("g") == ["c1"]
    clock.advance(20)
    members.seen("g", "c3")
    clock.advance(20)
    assert members.members("g") == ["c3"] and members.members("h") == []


# ------------------------------------------------------------------------------------- assignment
def assigner(**groups: GroupPolicy) -> Assigner:
    return Assigner(STRATEGIES, GroupPolicies(groups=groups), ConsumerMembers(ManualClock(), 120))


def test_an_allocating_group_shares_the_cluster_wide_sorted_queues() -> None:
    a = assigner(g=GroupPolicy(allocation="AVG"))
    view = ClusterView("c", (broker("broker-b", 2, {"T": 2}), broker("broker-a", 1, {"T": 2})))
    route = topic_route(view, "T")
    a.members.seen("g", "c2")
    mine = {cid: [str(r.queue) for r in a.assign("g", cid, route, view)] for cid in ("c1", "c2")}
    assert mine == {"c1": [str(MessageQueue("T", "broker-a", i)) for i in (0, 1)],
                    "c2": [str(MessageQueue("T", "broker-b", i)) for i in (0, 1)]}
    assert a.allocating("g") and not a.allocating("other")


def test_room_strategies_get_the_brokers_rooms_and_the_consumers_own() -> None:
    # A consumer's room is its own (allocation_params.consumer_rooms: networks, or globs of its host or
    # client id), not the room of the broker it happens to talk to.
    rooms = {"consumer_rooms": {"east": ["c-east"], "west": ["c-west"]}}
    a = assigner(g=GroupPolicy(allocation="MACHINE_ROOM_NEARBY", allocation_params=rooms))
    view = ClusterView("c", (broker("broker-a", 1, {"T": 2}, room="east"), broker("broker-b", 2, {"T": 2}, room="west")))
    route = topic_route(view, "T")
    a.members.access_point("c-east", "127.0.0.1:1")
    a.members.access_point("c-west", "127.0.0.1:2")
    a.members.seen("g", "c-west")
    assert {r.queue.broker_name for r in a.assign("g", "c-east", route, view)} == {"broker-a"}
    assert {r.queue.broker_name for r in a.assign("g", "c-west", route, view)} == {"broker-b"}
    with pytest.raises(ValueError, match=r"allocates with MACHINE_ROOM_NEARBY.*\[broker\] room on every broker"):
        a.assign("g", "c-nowhere", route, view)  # in no configured room
    alone = assigner(g=GroupPolicy(allocation="MACHINE_ROOM_NEARBY"))
    lone = ClusterView("c", (broker("broker-a", 1, {"T": 2}, room="east"),))
    with pytest.raises(ValueError, match=r"consumer_rooms naming the room"):  # one broker: still no room of its own
        alone.assign("g", "c-nowhere", topic_route(lone, "T"), lone)


@pytest.mark.parametrize(("policy", "message"), [
    (GroupPolicy(allocation="AVERAGE"), r"groups.g.allocation = 'AVERAGE' is not an allocation strategy"),
    (GroupPolicy(allocation="CONSISTENT_HASH", allocation_params={"virtual_nodes": -1}),
     r"groups.g.allocation_params: illegal virtualNodeCnt :-1"),
    (GroupPolicy(allocation="AVG", allocation_params={"rooms": ["x"]}), r"groups.g.allocation_params: unknown"),
])
def test_a_bad_allocation_policy_is_a_config_error(policy: GroupPolicy, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        assigner(g=policy)


def test_groups_name_their_allocation_in_the_broker_config() -> None:
    from plugmq.config.broker import load_config

    config = load_config({"groups": {"allocation": "AVG", "allocation_params": {},
                                     "east": {"allocation": "MACHINE_ROOM", "allocation_params": {"rooms": ["r1"]}}}})
    assert (config.groups.policy("east").allocation, config.groups.policy("east").allocation_params) == (
        "MACHINE_ROOM", {"rooms": ["r1"]})
    assert config.groups.policy("other").allocation == "AVG"  # the [groups] default
    assert "allocation_params" not in config.groups.groups  # a setting, not a group's name
    with pytest.raises(ConfigError, match=r"groups.g.allocation must be an allocation strategy name"):
        load_config({"groups": {"g": {"allocation": 3}}})
    with pytest.raises(ConfigError, match=r"groups.g.allocation_params must be a table"):
        load_config({"groups": {"g": {"allocation_params": "rooms=r1"}}})
