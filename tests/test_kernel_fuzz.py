"""Every entry point of the compiled kernels, fuzzed against its Python twin (tests/helpers/kernel_fuzz.py).

Each target runs in a child interpreter with a fixed example budget: a crash in C kills the
child, not pytest, and the failure names the input that crashed it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from plugmq.kit.native import kernel_statuses
from tests.helpers.kernel_fuzz import TARGETS

EXAMPLES = 60  # per entry point: a few seconds each; CLI runs of 3,000 are in the report


@pytest.fixture(scope="module", autouse=True)
def _kernels_built() -> None:
    import plugmq.plugins.delay_schedule
    import plugmq.plugins.store_mmap  # noqa: F401 - loads their kernels

    missing = [s.kernel.module for s in kernel_statuses() if not s.in_use]
    if missing:
        pytest.fail(f"compiled kernels not in use, nothing to fuzz: {missing} (bash scripts/setup.sh)")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_kernel_equals_its_python_twin_on_random_input(target: str, tmp_path: Path) -> None:
    last = tmp_path / "last-input"
    child = subprocess.run([sys.executable, "-X", "faulthandler", "-m", "tests.helpers.kernel_fuzz", target, str(EXAMPLES),
                            str(last)], capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent.parent)
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        tried = last.read_text(encoding="utf-8") if last.exists() else "(none recorded)"
        pytest.fail(f"{target} crashed the interpreter ({name}) on input {tried}\n{child.stderr[-3000:]}")
    assert child.returncode == 0, f"{target}: C and Python differ\n{child.stdout[-3000:]}\n{child.stderr[-6000:]}"
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report == {"target": target, "examples": EXAMPLES}
