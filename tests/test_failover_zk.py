"""Automatic failover on a real ZooKeeper: two ``plugmq serve`` children of one broker name, the
official Python client's producers on 8 threads, kill -9 of the elected master.

sync_master: no acked message is lost. async_master: what is lost is bounded by the lag the master
last reported plus what it acked after that report. In both modes the other broker takes sends as
master under a newer epoch, and the killed one, restarted, follows it as a slave (its log cut back
to the new master's history; it never takes a write under its old epoch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rocketmq.grpc_protocol", reason="needs the serve extra (rocketmq-python-client)")

from plugmq.testing import ZooKeeperServer
from plugmq.testing.failover import run_kill, run_pause, run_restart_all, run_unclean

pytestmark = pytest.mark.slow  # two serve children, a kill and a restart per mode: about a minute


@pytest.mark.parametrize("mode", ["sync_master", "async_master"])
def test_kill_9_of_the_master_elects_the_slave_and_the_old_master_rejoins_as_its_slave(
        mode: str, zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    run = run_kill(tmp_path, zookeeper, mode=mode, threads=8, steady_s=1.0)
    print(f"{mode}: failover {run.failover_s:.2f} s (routed {run.routed_s:.2f} s), {len(run.acked)} acked, {len(run.lost)} lost, "
          f"last reported lag {run.last_lag_messages} msgs, {run.acked_after_report} acked after it")
    assert run.acked, f"no send succeeded before the kill: {run.errors[:3]}"
    assert run.new_epoch > run.old_epoch >= 1
    if mode == "sync_master":
        assert not run.lost, f"{len(run.lost)} acked messages lost, e.g. {sorted(run.lost)[:5]}"
    else:
        assert len(run.lost) <= run.last_lag_messages + run.acked_after_report
    assert run.rejoined["role"] == "slave"
    assert run.rejoined["epoch"] == run.new_epoch, "the returning master took the new master's epochs"


def test_a_master_frozen_past_its_session_steps_down_and_cuts_its_unreplicated_tail(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    run = run_pause(tmp_path, zookeeper)
    print(f"frozen master: failover {run.failover_s:.2f} s, stepped down {run.demoted_s:.2f} s after the thaw, "
          f"old master {run.old_end - run.slave_end} B ahead of its slave when it froze")
    assert run.old_end > run.slave_end, "the old master held records its slave never got"
    assert run.stale_write_refused, "the thawed old master took a write"
    assert run.rejoined["epoch"] == run.new_master["epoch"] >= 2
    assert run.rejoined["replication"]["end_offset"] == run.new_master["replication"]["end_offset"]
    assert run.cut_logged


def test_when_every_broker_restarts_the_last_master_stands_and_keeps_its_tail(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    run = run_restart_all(tmp_path, zookeeper)
    assert run.new_master_id == run.old_master_id, "the broker that led the newest epoch is master again"
    assert run.new_epoch > run.old_epoch
    assert run.held_after >= run.held_before, "the tail its slave never got is kept"


def test_an_unclean_election_lets_a_lagging_slave_stand_once_no_master_was_seen_for_the_set_time(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    run = run_unclean(tmp_path, zookeeper, unclean_after_s=3.0)
    print(f"unclean election {run.elected_s:.2f} s after the restart; the old master held "
          f"{run.held_before - run.slave_end} B its slave never got")
    assert run.held_before > run.slave_end, "the old master acked records the slave never got"
    assert run.elected_s >= 3.0, "never before failover_unclean_after_s without a master"
    assert run.epoch >= 2 and run.lost_logged
    assert run.new_end < run.held_before, "the new master's log does not have the old master's tail"
    assert run.rejoined["role"] == "slave" and run.rejoined["epoch"] == run.epoch, "cut back under the new epoch"
