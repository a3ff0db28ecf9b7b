"""``plugmq allocate`` and a small run of ``plugmq bench alloc``, through click's CliRunner."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from plugmq.bench.alloc import command as bench_command
from plugmq.bench.alloc import make_inputs
from plugmq.cli.allocate import command, format_queues, parse_params, parse_queues
from plugmq.core import MessageQueue


def run(*args: str):
    return CliRunner().invoke(command, list(args))


def test_parse_queues_ranges_and_topic_reuse() -> None:
    got = parse_queues("T:broker-a:0-2,broker-b:5,U:room1@b:1-2")
    assert got == [
        MessageQueue("T", "broker-a", 0),
        MessageQueue("T", "broker-a", 1),
        MessageQueue("T", "broker-a", 2),
        MessageQueue("T", "broker-b", 5),
        MessageQueue("U", "room1@b", 1),
        MessageQueue("U", "room1@b", 2),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("broker-a:0-3", "has no topic"),
        ("T:broker-a:x", "queue ids must be N or N-M"),
        ("T:broker-a:3-1", "is empty"),
        ("T:broker-a", "has no topic"),
        ("T:a:b:c", "is not TOPIC:BROKER:IDS"),
        ("T::0", "empty topic or broker"),
    ],
)
def test_parse_queues_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_queues(spec)


def test_parse_params_values() -> None:
    params = parse_params(
        ["virtual_nodes=5", "rooms=room1,room2", 'inner_params={"virtual_nodes": 3}', "message_queues=T:b:0-1"]
    )
    assert params == {
        "virtual_nodes": 5,
        "rooms": "room1,room2",
        "inner_params": {"virtual_nodes": 3},
        "message_queues": [MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)],
    }
    with pytest.raises(ValueError, match="NAME=VALUE"):
        parse_params(["virtual_nodes"])
    with pytest.raises(ValueError, match="does not parse"):
        parse_params(["inner_params={bad"])
    with pytest.raises(ValueError, match="given twice"):
        parse_params(["a=1", "a=2"])


def test_format_queues_collapses_runs() -> None:
    qs = parse_queues("T:a:0-3,b:7,a:5")
    assert format_queues(qs) == "T:a:0-3, T:b:7, T:a:5"


def test_table_shows_every_consumers_queues() -> None:
    result = run("--strategy", "AVG", "--queues", "T:broker-a:0-7,broker-b:0-3", "--consumers", "c1,c2,c3")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.startswith("│")}
    assert "T:broker-a:0-3" in rows["c1"] and "T:broker-a:4-7" in rows["c2"] and "T:broker-b:0-3" in rows["c3"]


def test_json_sorts_inputs_like_the_rebalance() -> None:
    result = run("-s", "AVG", "-q", "T:broker-9:0,broker-10:0-1", "-c", "x2,x10", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["consumers"] == ["x10", "x2"]
    assert [q["broker_name"] for q in data["queues"]] == ["broker-10", "broker-10", "broker-9"]
    assert data["assignment"] == {
        "x10": [{"topic": "T", "broker_name": "broker-10", "queue_id": 0},
                {"topic": "T", "broker_name": "broker-10", "queue_id": 1}],
        "x2": [{"topic": "T", "broker_name": "broker-9", "queue_id": 0}],
    }
    assert data["unassigned"] == []


def test_params_reach_the_strategy_and_unassigned_queues_are_listed() -> None:
    result = run("-s", "MACHINE_ROOM", "-q", "T:room1@b:0-4,room2@b:0-1", "-c", "c1,c2", "-p", "rooms=room1", "--json")
    data = json.loads(result.output)
    assert [q["queue_id"] for q in data["assignment"]["c1"]] == [0, 1, 4]
    assert [(q["broker_name"], q["queue_id"]) for q in data["unassigned"]] == [("room2@b", 0), ("room2@b", 1)]
    table = run("-s", "MACHINE_ROOM", "-q", "T:room1@b:0-4,room2@b:0-1", "-c", "c1,c2", "-p", "rooms=room1")
    assert "(unassigned)" in table.output and "T:room2@b:0-1" in table.output


def test_broker_names_are_not_rendered_as_emoji() -> None:
    result = run("-s", "AVG", "-q", "T:b:0,x:3", "-c", "c1")
    assert "T:b:0, T:x:3" in result.output


def test_parse_errors_are_bad_parameters() -> None:
    result = run("-s", "AVG", "-q", "broker-a:0-3", "-c", "c1")
    assert result.exit_code == 2 and "Invalid value for --queues" in result.output and "has no topic" in result.output
    result = run("-s", "AVG", "-q", "T:b:0", "-c", "c1", "-p", "oops")
    assert result.exit_code == 2 and "Invalid value for --param" in result.output
    result = run("-s", "AVG", "-q", "T:b:0", "-c", "c1,,c2")
    assert result.exit_code == 2 and "Invalid value for --consumers" in result.output


def test_strategy_errors_are_reported_cleanly() -> None:
    result = run("-s", "AVG_CIRCLE", "-q", "T:b:0", "-c", "c1")
    assert result.exit_code == 1 and "Did you mean 'AVG_BY_CIRCLE'?" in result.output
    result = run("-s", "CONSISTENT_HASH", "-q", "T:b:0", "-c", "c1", "-p", "virtual_nodes=-1")
    assert result.exit_code == 1 and "illegal virtualNodeCnt :-1" in result.output
    result = run("-s", "AVG", "-q", "T:b:0", "-c", "c1", "-p", "foo=1")
    assert result.exit_code == 1 and "'foo'" in result.output


def test_bench_inputs_and_small_run() -> None:
    queues, ids = make_inputs(100, 12)
    assert len(set(queues)) == 100 and len(set(ids)) == 12
    assert {q.broker_name.split("@")[0] for q in queues} == {"room0", "room1", "room2", "room3"}
    result = CliRunner().invoke(bench_command, ["--queues", "60", "--consumers", "6", "--samples", "2"])
    assert result.exit_code == 0, result.output
    for name in ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "MACHINE_ROOM_NEARBY", "MACHINE_ROOM", "CONFIG"):
        assert any(line.startswith(f"│ {name} ") for line in result.output.splitlines()), name
    assert "baseline (plain loop copying the queue list)" in result.output


def test_commands_are_click_commands_with_the_right_names() -> None:
    assert isinstance(command, click.Command) and command.name == "allocate"
    assert isinstance(bench_command, click.Command) and bench_command.name == "alloc"
