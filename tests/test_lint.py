"""ruff and mypy are part of the suite: a lint or type error fails it (configuration in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_is_clean() -> None:
    done = run_tool("ruff", "check", "--no-cache", "plugmq", "tests", "examples")
    assert done.returncode == 0, f"ruff check plugmq tests examples:\n{done.stdout}{done.stderr}"


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    done = run_tool("mypy")  # the packages and every option come from [tool.mypy]
    assert done.returncode == 0, f"mypy:\n{done.stdout}{done.stderr}"


def test_import_layers_hold() -> None:
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"lint-imports (contracts in pyproject.toml [tool.importlinter]):\n{done.stdout}{done.stderr}"
