"""Failover as a comparison dimension: a ``plugmq chaos`` schedule run against one plugin set.

The plugin set is the composition under test (:func:`chaos_config`): its plugins and their
options, its ``[broker]`` settings; chaos adds ``ha``, ``cluster_zk`` and ``filter_tag`` when absent and runs a
failover cluster of ``brokers`` brokers on a ZooKeeper of its own, the official client producing
and consuming while each fault is injected ``rounds`` times (:func:`plugmq.chaos.run_chaos`). The
checker's verdict over every acknowledged message and the recovery seconds of each round become
the experiment's metrics (:func:`chaos_metrics`); a plugin set with a replication plugin and a
``broker.role`` runs the master in that role, the others in the workload's ``chaos.mode``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugmq.spark.experiments import Experiment
from plugmq.spark.results import ExperimentResult

if TYPE_CHECKING:
    from plugmq.chaos.checker import CheckResult

__all__ = ["UNITS", "ChaosReplay", "chaos_config", "chaos_metrics", "chaos_mode"]

# [broker] keys chaos decides for every broker of its cluster.
_CHAOS_OWNS = ("role", "broker_id", "data_dir", "failover", "plugins")


def chaos_config(exp: Experiment) -> dict[str, Any]:
    """The broker config chaos composes its cluster from: the plugin set's plugins and options, plus
    ``filter_tag`` when absent (the official client's consumers subscribe with a TAG expression,
    ``*`` included)."""
    broker = {k: v for k, v in exp.plugin_set.broker.items() if k not in _CHAOS_OWNS}
    plugins = list(exp.plugin_set.plugins)
    plugins += [] if "filter_tag" in plugins else ["filter_tag"]
    return {"broker": {**broker, "name": f"broker-{exp.plugin_set.name}", "plugins": plugins},
            "plugins": exp.store_options(), "server": dict(exp.plugin_set.server)}


def chaos_mode(exp: Experiment) -> str:
    """The master's role: the plugin set's own when it replicates, else the workload's chaos mode."""
    assert exp.workload.chaos is not None
    if exp.plugin_set.replication is not None and "role" in exp.plugin_set.broker:
        return exp.plugin_set.role
    return f"{exp.workload.chaos.mode}_master"


# Each metric's unit (all are counts of messages but the seconds).
UNITS = {"chaos_lost_acked": "msg", "chaos_redelivered_after_ack": "msg", "chaos_acked": "msg",
         "chaos_send_failures": "msg", "chaos_acked_by_deposed_master": "msg", "chaos_split_brain_s": "s",
         "chaos_rounds": "", "chaos_send_never_recovered": "", "chaos_receive_never_recovered": "",
         "chaos_send_recovery_s": "s",
         "chaos_send_recovery_max_s": "s", "chaos_receive_recovery_s": "s", "chaos_receive_recovery_max_s": "s"}


def chaos_metrics(check: CheckResult) -> dict[str, float]:
    """A chaos run's check as the metrics of a ``kind = "chaos"`` experiment: the verdict over every
    acknowledged message, and each direction's recovery over all rounds of all faults (median and
    max; a round never recovered counts as the time it was watched, and
    ``chaos_<direction>_never_recovered`` says how many rounds that was)."""
    metrics = {"chaos_lost_acked": float(len(check.lost)),
               "chaos_redelivered_after_ack": float(len(check.redelivered_after_ack)),
               "chaos_acked": float(check.acked), "chaos_send_failures": float(check.send_failures),
               "chaos_acked_by_deposed_master": float(len(check.stale_acks)),
               "chaos_split_brain_s": check.split_brain_s, "chaos_rounds": float(len(check.faults))}
    for direction in ("send", "receive"):
        seen = [getattr(o, f"{direction}_recovery_s") for o in check.faults]
        bounded = [o.watched_s if s is None else s for s, o in zip(seen, check.faults, strict=True)]
        metrics[f"chaos_{direction}_never_recovered"] = float(sum(1 for s in seen if s is None))
        if bounded:
            metrics[f"chaos_{direction}_recovery_s"] = statistics.median(bounded)
            metrics[f"chaos_{direction}_recovery_max_s"] = max(bounded)
    return metrics


class ChaosReplay:
    """Runs the workload's chaos schedule against the experiment's plugin set."""

    def __init__(self, exp: Experiment, data_dir: Path, result: ExperimentResult, window_s: float) -> None:
        self.exp = exp
        self.data_dir = data_dir
        self.result = result

    def run(self) -> None:
        from plugmq.chaos.runner import run_chaos

        w, spec = self.exp.workload, self.exp.workload.chaos
        assert spec is not None
        outcome = run_chaos(chaos_config(self.exp), faults=spec.faults, rounds=spec.rounds, mode=chaos_mode(self.exp),
                            brokers=spec.brokers, session_timeout_s=spec.session_timeout_s,
                            out=self.data_dir / "chaos", seed=self.exp.seed, steady_s=spec.steady_s,
                            recover_s=spec.recover_s, producers=w.producers_per_topic,
                            groups=w.subscriptions_per_topic, consumers=w.consumers_per_subscription,
                            body_bytes=w.message_size, report=False)
        for name, value in chaos_metrics(outcome.check).items():
            self.result.metric(name, value, UNITS[name])
        self.result.info["chaos_mode"] = outcome.summary["mode"]
        self.result.info["chaos_notes"] = "; ".join(outcome.notes)
        self.result.info["chaos_load_average"] = str(outcome.summary["load_average"])
