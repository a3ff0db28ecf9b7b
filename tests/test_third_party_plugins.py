"""Third-party plugins written from the plugin guide (docs/plugins.md) alone pass `plugmq conformance` with no clause skipped.

examples/plugmq-rendezvous (allocation) and examples/plugmq-glob (filter) are installed in the venv
by scripts/setup.sh like any third-party package. The runs here cap Hypothesis at a few examples
per property clause (``--plugmq-examples``); every clause still runs. A broken plugin (installed
for the run through a ``.dist-info`` on PYTHONPATH) shows what a failure looks like.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

PLUGMQ = Path(sys.executable).with_name("plugmq")
pytestmark = pytest.mark.slow


def conformance(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Run the suite; its output and each clause's outcome (passed, skipped, failed) by test id."""
    junit = tmp_path / "junit.xml"
    done = subprocess.run([str(PLUGMQ), "conformance", *args, "--plugmq-examples", "10", "-q", f"--junitxml={junit}"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("skipped", "failure", "error")]
        outcomes[f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"] = kinds[0] if kinds else "passed"
    return done.stdout + done.stderr, outcomes


def clauses_of(outcomes: dict[str, str], contract: str) -> Counter[str]:
    return Counter(outcome for test, outcome in outcomes.items() if test.startswith(contract + "::"))


def test_the_rendezvous_allocation_plugin_passes_every_clause(tmp_path: Path) -> None:
    out, outcomes = conformance(tmp_path, "--plugin", "rendezvous")
    assert set(outcomes.values()) == {"passed"}, out
    allocation = [t for t in outcomes if t.startswith("TestAllocationContract::")]
    assert {t.rsplit("[", 1)[1] for t in allocation} == {"rendezvous:RENDEZVOUS]", "rendezvous:RENDEZVOUS_PER_GROUP]"}
    assert len(allocation) == 12  # six clauses per strategy
    assert clauses_of(outcomes, "TestBrokerContract") == {"passed": 9}
    assert "broker clauses of rendezvous: plugins rendezvous, " in out and "consumers on RENDEZVOUS" in out


def test_the_glob_filter_plugin_passes_every_clause(tmp_path: Path) -> None:
    out, outcomes = conformance(tmp_path, "--plugin", "glob")
    assert set(outcomes.values()) == {"passed"}, out
    semantic = ("test_declared_examples_match_as_declared", "test_valid_expressions_compile_to_a_filter",
                "test_precheck_never_rejects_a_message_the_exact_check_accepts",
                "test_evaluate_is_three_valued_and_matches_agrees")
    for clause in semantic:
        assert outcomes[f"TestFilterContract::{clause}[glob:GLOB]"] == "passed"
    assert clauses_of(outcomes, "TestFilterContract")["passed"] >= 20  # fuzz clauses and pathological inputs
    assert outcomes["TestBrokerContract::test_filters_in_pull[glob]"] == "passed"


def test_naming_the_builtin_alloc_beside_a_third_party_strategy_works(tmp_path: Path) -> None:
    out, outcomes = conformance(tmp_path, "--plugin", "rendezvous", "--plugin", "alloc", "-k", "TestBrokerContract")
    assert clauses_of(outcomes, "TestBrokerContract") == {"passed": 18}, out
    assert "broker clauses of rendezvous: plugins rendezvous, alloc, " in out and "consumers on RENDEZVOUS" in out
    assert "broker clauses of alloc: plugins alloc, rendezvous, " in out and "consumers on AVG" in out


BROKEN = '''
from plugmq.core import AllocationCapabilities, Family, PluginDeclaration, hookimpl

class Greedy:
    """Every consumer takes every queue."""
    name = "GREEDY"
    capabilities = AllocationCapabilities()

    def allocate(self, group, current_id, all_queues, all_consumer_ids):
        return list(all_queues) if current_id in all_consumer_ids else []

class Picky(Greedy):
    """Refuses to answer at all."""
    name = "PICKY"

    def allocate(self, group, current_id, all_queues, all_consumer_ids):
        raise ValueError("too many queues for me")

@hookimpl
def plugmq_declare():
    return PluginDeclaration(name="greedy", families={Family.ALLOCATION},
                             capabilities={"GREEDY": Greedy.capabilities, "PICKY": Picky.capabilities})

@hookimpl
def plugmq_allocate_strategies():
    return {"GREEDY": Greedy, "PICKY": Picky}
'''


def test_a_broken_plugin_is_reported_clause_rule_and_answer(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "greedy-0.1.dist-info").mkdir(parents=True)
    (site / "greedy.py").write_text(textwrap.dedent(BROKEN))
    (site / "greedy-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: greedy\nVersion: 0.1\n")
    (site / "greedy-0.1.dist-info" / "entry_points.txt").write_text("[plugmq.plugins]\ngreedy = greedy\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out, outcomes = conformance(tmp_path, "--plugin", "greedy", "-k", "exactly_once", env=env)
    assert set(outcomes.values()) == {"failure"} and len(outcomes) == 2, out
    failures = out[out.index("= FAILURES ="):out.index("short test summary")]
    greedy, picky = failures.split("_ TestAllocationContract.")[1:]
    assert "clause   TestAllocationContract::test_every_queue_assigned_exactly_once[greedy:GREEDY]\n" in greedy
    assert "rule     The consumers' answers, each computed with its own id over the same lists, are disjoint" in greedy
    assert "answer   GREEDY: queues given to more than one consumer: [MessageQueue(" in greedy  # the clause's words
    assert "example  Failing test case:" in greedy  # Hypothesis' smallest input
    assert "answer   ValueError: too many queues for me" in picky
    assert re.search(r"raised +\S*greedy.py:17 in allocate  \(in the plugin\)", picky), picky
    assert "Traceback" not in failures and "def test_" not in failures
    assert len(failures.splitlines()) < 60, failures
