"""One chaos run: a cluster from the user's config, load, faults in rounds, the read-back, the check.

Each round of a fault: ``steady_s`` of load, the fault injected, held (its length in session
timeouts), healed, then up to ``recover_s`` for the cluster to settle again (one master, every
slave connected and caught up). After the last round the producers stop, the consumers take what
is in flight, and every message is read back through the current master with a new group. The
checker then runs over the whole history (see :mod:`plugmq.chaos.checker`).

:func:`run_chaos` is the API tests use (one fault, one round, a few seconds of load) and what
``plugmq chaos`` runs.
"""

from __future__ import annotations

import functools
import os
import random
import statistics
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from plugmq.chaos.checker import CheckResult, FaultOutcome, check
from plugmq.chaos.cluster import MODES, ChaosCluster, ha_link_supported, load_user_config
from plugmq.chaos.faults import Fault, fault_named
from plugmq.chaos.history import Event, FaultWindow, History, RoleSample, Send
from plugmq.chaos.workload import Workload, drain
from plugmq.core.errors import ConfigError, PlugmqError
from plugmq.core.logs import get_logger
from plugmq.testing.wait import WaitTimeout, wait_for
from plugmq.testing.zookeeper import zookeeper_missing

__all__ = ["ChaosResult", "run_chaos"]

log = get_logger(__name__)


@attrs.frozen
class ChaosResult:
    """What a run found: the check, the summary (JSON-ready), where its files are (None: not kept)."""

    check: CheckResult
    summary: dict[str, Any]
    events: tuple[Event, ...]
    out: Path | None
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No acknowledged message lost and none redelivered after an OK ack."""
        return not self.check.promise_broken


class _RoleSampler:
    """Records each broker's role, epoch and acks by epoch into the history whenever they change."""

    def __init__(self, cluster: ChaosCluster, history: History, interval_s: float = 0.25) -> None:
        self._cluster = cluster
        self._history = history
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._last: dict[str, tuple[str, int | None, dict[str, int] | None]] = {}
        self._thread = threading.Thread(target=self._run, name="chaos-roles", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, status in self._cluster.statuses(timeout_s=self._interval_s * 2).items():
                acked = None if status is None else status.get("acked_by_epoch")
                now = ("down", None, None) if status is None else (str(status.get("role")), status.get("epoch"),
                                                                    dict(acked) if acked is not None else None)
                if self._last.get(name) != now:
                    self._last[name] = now
                    self._history.record(RoleSample(self._history.now(), name, now[0], now[1], now[2]))
            self._stop.wait(self._interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _mode(mode: str) -> str:
    full = mode if mode.endswith("_master") else f"{mode}_master"
    if full not in MODES:
        raise ConfigError(f"--mode must be sync or async (sync_master / async_master), got {mode!r}")
    return full


def _rounds(cluster: ChaosCluster, load: Workload, history: History, plan: Sequence[Fault], rounds: int, *,
            steady_s: float, recover_s: float, rng: random.Random) -> list[str]:
    """Inject every fault of ``plan`` ``rounds`` times; notes on rounds that could not run or recover.

    After each heal: up to ``recover_s`` for the cluster to settle and for the clients to be served
    again (a send and a receive invoked after the heal succeeded), so the next round starts from a
    healthy cluster and the recovery time of this one is measured - except between the rounds of
    a fault that strikes again at once (kill-master).
    """
    notes: list[str] = []
    pause = threading.Event()  # never set: waits of the schedule
    for fault in plan:
        for round_ in range(1, rounds + 1):
            pause.wait(steady_s)
            try:
                injected = fault.inject(cluster, rng)
            except RuntimeError as exc:
                notes.append(f"{fault.name} round {round_}: not injected: {exc}")
                continue
            t0 = history.now()  # in effect from here (a killed broker has exited)
            log.info("chaos fault injected", fault=fault.name, round=round_, target=injected.target)
            pause.wait(fault.hold_sessions * cluster.session_timeout_s)
            injected.heal()
            healed = history.now()
            history.record(FaultWindow(t0, healed, fault.name, round_, injected.target, injected.detail))
            if not fault.awaits_recovery and round_ < rounds:
                continue
            for what, done in (("the cluster to settle (one master, every slave connected and caught up)",
                                cluster.settled),
                               ("the clients to be served again (a send and a receive)",
                                functools.partial(load.served_since, healed))):
                try:
                    wait_for(done, max(0.0, recover_s - (history.now() - healed)), what)
                except WaitTimeout:
                    notes.append(f"{fault.name} round {round_}: gave up waiting for {what} {recover_s:g} s "
                                 "after the heal")
                    break
    return notes


def _seconds(values: list[float | None], watched: list[float]) -> dict[str, Any]:
    """Recovery seconds of a fault's rounds; a round that never recovered counts as at least the
    time it was watched (``never`` says how many, and the max is then a lower bound)."""
    bounded = [w if v is None else v for v, w in zip(values, watched)]
    return {"per_round": [None if v is None else round(v, 3) for v in values],
            "median": round(statistics.median(bounded), 3) if bounded else None,
            "max": round(max(bounded), 3) if bounded else None, "never": sum(1 for v in values if v is None)}


def _per_fault(outcomes: Sequence[FaultOutcome], plan: Sequence[Fault]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for fault in plan:
        mine = [o for o in outcomes if o.name == fault.name]
        table[fault.name] = {
            "openchaos": fault.openchaos, "rounds": len(mine), "lost": sum(o.lost for o in mine),
            "lost_per_round": [o.lost for o in mine],
            "redelivered_after_ack": sum(o.redelivered_after_ack for o in mine),
            "acked_by_deposed_master": sum(o.stale_acks for o in mine),
            "split_brain_s": round(max((o.split_brain_s for o in mine), default=0.0), 3),
            "send_recovery_s": _seconds([o.send_recovery_s for o in mine], [o.watched_s for o in mine]),
            "receive_recovery_s": _seconds([o.receive_recovery_s for o in mine], [o.watched_s for o in mine]),
            "targets": [o.target for o in mine]}
    return table


def run_chaos(config: Path | Mapping[str, Any], *, faults: Sequence[str] = ("kill",), rounds: int = 1,
              mode: str = "sync_master", brokers: int = 2, session_timeout_s: float = 2.0, out: Path | None = None,
              seed: int | None = None, steady_s: float = 3.0, recover_s: float = 60.0, producers: int = 4,
              groups: int = 1, consumers: int = 2, body_bytes: int = 0, report: bool = True) -> ChaosResult:
    """Run ``faults`` (names, see :mod:`plugmq.chaos.faults`) ``rounds`` times each on a cluster of
    ``brokers`` brokers composed from ``config``; history and report in ``out`` (kept) or a
    temporary directory (removed)."""
    user = load_user_config(config)
    plan = [fault_named(name) for name in faults]
    mode = _mode(mode)
    if rounds < 1:
        raise ConfigError(f"rounds must be at least 1, got {rounds}")
    missing = zookeeper_missing()
    if missing:
        raise PlugmqError(f"plugmq chaos needs a ZooKeeper server: {missing}")
    ha_problem = ha_link_supported(user)
    for fault in plan:
        if fault.needs_ha_link and ha_problem is not None:
            raise ConfigError(f"fault {fault.name} cuts the slave -> master link, but {ha_problem}")
    with tempfile.TemporaryDirectory(prefix="plugmq-chaos-") as scratch:
        where = (out or Path(scratch)).resolve()  # children run elsewhere: absolute paths only
        where.mkdir(parents=True, exist_ok=True)
        return _run(user, plan, where, keep=out is not None, rounds=rounds, mode=mode, brokers=brokers,
                    session_timeout_s=session_timeout_s, forward_ha=ha_problem is None,
                    rng=random.Random(seed), seed=seed, steady_s=steady_s, recover_s=recover_s,
                    workload={"producers": producers, "groups": groups, "consumers": consumers,
                              "body_bytes": body_bytes}, report=report,
                    source=str(config) if not isinstance(config, Mapping) else "<mapping>")


def _run(user: dict[str, Any], plan: list[Fault], where: Path, *, keep: bool, rounds: int, mode: str, brokers: int,
         session_timeout_s: float, forward_ha: bool, rng: random.Random, seed: int | None, steady_s: float,
         recover_s: float, workload: dict[str, int], report: bool, source: str) -> ChaosResult:
    load_before = os.getloadavg()
    cluster = ChaosCluster(where / "cluster", user, brokers=brokers, mode=mode, session_timeout_s=session_timeout_s,
                           forward_ha=forward_ha, seed=seed)
    notes: list[str] = [] if forward_ha else ["the slave -> master ha link is not forwarded (the ha plugin cannot "
                                              "advertise another address): loss and delay leave it alone"]
    sampler: _RoleSampler | None = None
    load: Workload | None = None
    history = History(where / "history.jsonl")  # its times count from here; the load starts once settled
    try:
        cluster.start()
        wait_for(cluster.settled, recover_s, "one master and caught-up slaves")
        history.restart_clock()
        sampler = _RoleSampler(cluster, history)
        load = Workload(cluster.endpoints, history, names={n.grpc.address: n.name for n in cluster.nodes}, **workload)
        load.start()
        notes += _rounds(cluster, load, history, plan, rounds, steady_s=steady_s, recover_s=recover_s, rng=rng)
        threading.Event().wait(steady_s)  # load after the last heal: the recovery shows
        load.stop()
        load = None
        try:
            wait_for(cluster.settled, recover_s, "the cluster to settle before the read-back")
        except AssertionError:
            notes.append("the cluster had not settled for the read-back; it went through whichever master there was")
        drain(cluster.endpoints, history, wanted={e.body for e in history.events() if isinstance(e, Send) and e.ok})
    finally:
        if load is not None:
            load.stop(drain_s=0)
        if sampler is not None:
            sampler.stop()
        cluster.stop()
        history.close()
    load_after = os.getloadavg()
    events = tuple(history.events())
    checked = check(events)
    summary = {
        "config": source, "mode": mode, "brokers": brokers, "session_timeout_s": session_timeout_s,
        "rounds": rounds, "seed": seed, "steady_s": steady_s, "workload": workload,
        "load_average": {"before": [round(v, 2) for v in load_before], "after": [round(v, 2) for v in load_after]},
        "totals": checked.summary(), "faults": _per_fault(checked.faults, plan), "notes": notes}
    if report:
        from plugmq.chaos.report import write_report

        write_report(where, summary, checked, events)
    return ChaosResult(checked, summary, events, where if keep else None, tuple(notes))
