"""dashboards/plugmq.json: a Grafana dashboard that loads as is, over metrics plugmq serve exports.

The exported names come from the server's own collector over a real broker with the plugins whose
figures the dashboard shows (store_mmap, delay_wheel, txn, and ha as a master for replication).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="needs the serve extra (prometheus_client)")

from plugmq.broker.broker import Broker
from plugmq.server.metrics import BrokerCollector, EventCounter

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboards" / "plugmq.json"
_METRIC = re.compile(r"\b(?:rocketmq|plugmq)_[A-Za-z0-9_]+\b")
_SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "summary": ("", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    directory = tmp_path_factory.mktemp("metrics")
    with Broker.open(directory, plugins=["store_mmap", "delay_wheel", "txn", "filter_tag", "ha"],
                     role="async_master") as broker:
        families = list(BrokerCollector(broker, EventCounter()).collect())
    yield {f"{family.name}{suffix}" for family in families for suffix in _SAMPLE_SUFFIXES[family.type]}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def queries(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v.get("definition")]
    return exprs


def test_every_metric_the_dashboard_queries_is_exported(exported: set[str]) -> None:
    used = {name for expr in queries(dashboard()) for name in _METRIC.findall(expr)}
    assert len(used) >= 15, used
    assert used <= exported, f"not exported by plugmq serve: {sorted(used - exported)}"


def test_the_dashboard_loads_as_is() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        assert panel["type"] in {"row", "timeseries", "stat", "table"}, panel["type"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            for name in re.findall(r"\$(\w+)", target["expr"]):
                assert name in variables or name.startswith("__"), f"{panel['title']}: unknown variable ${name}"
