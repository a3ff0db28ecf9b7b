"""``plugmq chaos`` for real: ZooKeeper, two ``plugmq serve`` children behind forwarders, the
official Python client, one kill -9 round on sync_master (a fault that holds today), the checker
and the report. Also what the run composes from the user's config, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugmq.chaos.cluster import compose_broker_config, load_user_config
from plugmq.chaos.history import FaultWindow, RoleSample, load_history
from plugmq.core.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "chaos" / "failover.toml"


def test_each_broker_s_config_is_the_user_s_composition_wired_for_failover() -> None:
    user: dict[str, Any] = {
        "broker": {"name": "b", "plugins": ["store_lmdb", "filter_tag"]},
        "plugins": {"store_lmdb": {"map_size_mb": 64}, "ha": {"min_in_sync_replicas": 1, "master": "x:1"}},
        "server": {"listen": "0.0.0.0:8081", "long_polling_s": 5}}
    config = compose_broker_config(user, broker_id=2, mode="async_master", zookeeper="127.0.0.1:9", cluster="c",
                                   session_timeout_s=3.0, advertise="127.0.0.1:7")
    assert config["broker"] == {"name": "b", "plugins": ["store_lmdb", "filter_tag", "ha", "cluster_zk"],
                                "broker_id": 2, "role": "async_master", "failover": True, "data_dir": "data"}
    assert config["plugins"]["store_lmdb"] == {"map_size_mb": 64}, "the composition's options are kept"
    assert config["plugins"]["ha"]["min_in_sync_replicas"] == 1 and "master" not in config["plugins"]["ha"]
    assert config["plugins"]["cluster_zk"] == {"hosts": "127.0.0.1:9", "session_timeout_s": 3.0}
    assert config["server"] == {"advertise": "127.0.0.1:7", "long_polling_s": 5}
    assert user["broker"]["plugins"] == ["store_lmdb", "filter_tag"], "the user's config is not changed"


def test_a_config_without_plugins_or_a_bad_mode_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "empty.toml").write_text("[broker]\nname = 'x'\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[broker\] plugins must list the plugins under test"):
        load_user_config(tmp_path / "empty.toml")
    with pytest.raises(ConfigError, match="mode must be one of"):
        compose_broker_config(load_user_config(EXAMPLE), broker_id=1, mode="both", zookeeper="", cluster="",
                              session_timeout_s=2, advertise="")


def test_an_unknown_fault_is_one_error_line_and_nothing_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from plugmq.cli import main; main()", "chaos", str(EXAMPLE), "--faults",
         "kill,meteor", "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == ("plugmq: error: unknown fault 'meteor'; known: kill, kill-master, suspend, "
                                   "partition-zk, partition-pair, loss, delay, zk-down")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ZooKeeper, two serve children, a kill and a restart: about half a minute
def test_one_kill_round_on_sync_master_keeps_every_acked_message(tmp_path: Path) -> None:
    pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")
    pytest.importorskip("kazoo", reason="needs the cluster extra (kazoo)")
    from plugmq.chaos.runner import run_chaos
    from plugmq.testing import zookeeper_missing

    if zookeeper_missing():
        pytest.skip(zookeeper_missing() or "")
    result = run_chaos(EXAMPLE, faults=["kill-master"], rounds=1, mode="sync", out=tmp_path, seed=3, steady_s=1.0,
                       producers=2)
    totals = result.summary["totals"]
    print(json.dumps(result.summary["faults"]), totals)
    assert totals["acked"] > 0 and totals["read_back"] >= totals["acked"]
    assert result.ok and totals["lost"] == 0 and totals["redelivered_after_ack"] == 0
    assert totals["position_conflicts"] == 0
    (window,) = [e for e in result.events if isinstance(e, FaultWindow)]
    roles = [e for e in result.events if isinstance(e, RoleSample)]
    master_before = next(r.broker for r in roles if r.role == "sync_master")
    assert window.target == master_before, "kill-master hits whoever is master"
    assert any(r.role == "sync_master" and r.broker != master_before and r.t > window.t0 for r in roles), \
        "the other broker became master"
    kill = result.summary["faults"]["kill-master"]
    assert kill["rounds"] == 1 and kill["send_recovery_s"]["never"] == 0 and kill["receive_recovery_s"]["never"] == 0
    assert load_history(tmp_path / "history.jsonl") == list(result.events)
    assert json.loads((tmp_path / "summary.json").read_text(encoding="utf-8")) == result.summary
    assert "| kill-master | leader-kill | 1 | 0 | 0 | 0 (0.0) |" in (tmp_path / "report.md").read_text(encoding="utf-8")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_partition_pair_is_refused_with_the_reason_while_the_ha_link_cannot_be_forwarded() -> None:
    from plugmq.chaos.cluster import ha_link_supported
    from plugmq.chaos.runner import run_chaos

    if ha_link_supported(load_user_config(EXAMPLE)) is None:
        pytest.skip("the ha plugin advertises a replication address of chaos's choosing: partition-pair runs")
    with pytest.raises(ConfigError, match=r"fault partition-pair cuts the slave -> master link, but the ha plugin "
                                          r"cannot register .*unknown option 'advertise'"):
        run_chaos(EXAMPLE, faults=["kill", "partition-pair"])


def test_a_padded_body_is_recorded_by_its_unique_name() -> None:
    from types import SimpleNamespace

    from plugmq.chaos.workload import _name, _payload

    assert _payload("p0-1", 0) == b"p0-1"
    padded = _payload("p0-1", 16)
    assert len(padded) == 16 and padded.startswith(b"p0-1|x")
    assert _name(SimpleNamespace(body=padded)) == _name(SimpleNamespace(body=b"p0-1")) == "p0-1"
