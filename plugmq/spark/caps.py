"""Known caps: the waits and timeouts a latency figure of an experiment can be stuck at.

A percentile at one of them measured the wait, not the plugins under comparison. Two end-to-end
p99s both at 501 ms on embedded push consumers are the consumer's 500 ms idle wait (a message
stored just as the consumer went to sleep waits it out; 501.19 ms is the upper edge of the
histogram bucket that holds 500 ms). The report marks such values and headlines nothing on them.

The caps of an experiment come from its row of the experiments table: the served workload's
long-polling wait, invisible time and request timeout; the push consumer's idle wait on the real
clock; and every ``*_timeout_ms`` / ``*_timeout_s`` option of its plugins (a sync master's slave
timeout), defaults included.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import attrs

from plugmq.kit.histogram import bucket_of

__all__ = ["Cap", "at_cap", "caps_of", "lower_bound"]

_LATENCIES = ("end_to_end_latency", "publish_latency", "delay_lateness")


@attrs.frozen
class Cap:
    """A wait or timeout of ``ms`` milliseconds that can stick the metrics named by ``bounds``
    (prefixes such as ``end_to_end_latency``); ``verb`` and ``meaning`` word a value held by it."""

    ms: float
    what: str
    bounds: tuple[str, ...] = _LATENCIES
    verb: str = "is at"
    meaning: str = "it measured the wait, not the plugins"

    def text(self) -> str:
        amount = f"{self.ms / 1000:g} s" if self.ms >= 1000 else f"{self.ms:g} ms"
        return f"{self.what} ({amount})"


def lower_bound(metric: str, value: float, unmet: float) -> Cap:
    """A figure only known to be at least ``value`` (in ``metric``'s unit, ``_s``: seconds): ``unmet``
    rounds never showed what it times (a recovery never seen counts as the time it was watched)."""
    ms = value * 1000 if metric.endswith("_s") else value
    return Cap(ms, f"the time watched, {unmet:g} round(s) never recovered", (metric,), "is a lower bound:",
               "a recovery never seen counts as the time it was watched")


def _option_timeouts(plugins: list[str], options: Mapping[str, Any]) -> list[Cap]:
    """Every resolved ``*_timeout_ms`` / ``*_timeout_s`` option of the plugins (defaults too)."""
    from plugmq.core.pluginmanager import build_options, load_plugins

    caps = []
    try:
        loaded = load_plugins(plugins)
        for name, declaration in loaded.declarations.items():
            built = build_options(declaration, options.get(name), config_path=f"plugins.{name}")
            if built is None:
                continue
            for key, value in attrs.asdict(built).items():
                if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                    continue
                if key.endswith("_timeout_ms"):
                    caps.append(Cap(float(value), f"{name}.{key}"))
                elif key.endswith("_timeout_s"):
                    caps.append(Cap(float(value) * 1000, f"{name}.{key}"))
    except Exception:  # noqa: BLE001 - caps are advice on a finished run; a plugin gone since is no reason to fail it
        return []
    return caps


def caps_of(info: Mapping[str, Any]) -> tuple[Cap, ...]:
    """The caps in force for one experiment, from its row of the experiments table."""
    from plugmq.client.consumer import PushConsumer

    workload = json.loads(info.get("workload_json") or "{}")
    caps: list[Cap] = []
    serve = workload.get("serve")
    if serve:
        caps += [Cap(serve["long_polling_s"] * 1000, "the receive's long-polling wait (serve.long_polling_s)",
                     ("end_to_end_latency",)),
                 Cap(serve["invisible_s"] * 1000, "the invisible time before a redelivery (serve.invisible_s)",
                     ("end_to_end_latency",)),
                 Cap(serve["request_timeout_s"] * 1000, "the client's request timeout (serve.request_timeout_s)")]
    elif info.get("clock") == "real":
        caps.append(Cap(PushConsumer.idle_wait_s * 1000, "the push consumer's idle wait (PushConsumer.idle_wait_s)",
                        ("end_to_end_latency",)))
    plugins = info.get("plugins")
    if plugins:
        names = json.loads(plugins) if isinstance(plugins, str) else list(plugins)
        caps += _option_timeouts(names, json.loads(info.get("options") or "{}"))
    return tuple(caps)


def at_cap(metric: str, value: float | None, caps: tuple[Cap, ...]) -> Cap | None:
    """The cap ``value`` of ``metric`` sits at: in the histogram bucket holding the cap or the next
    one up (a percentile is a bucket's upper edge, so a wait of exactly 500 ms reads 501.19)."""
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    for cap in caps:
        if any(metric.startswith(prefix) for prefix in cap.bounds) and \
                bucket_of(cap.ms) <= bucket_of(value) <= bucket_of(cap.ms) + 1:
            return cap
    return None
