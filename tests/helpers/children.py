"""Running a test module as a child process (crash tests SIGKILL a writer and check what it left).

A test module runs as ``python -m tests.<module>`` from the checkout root, so it imports the helpers
as the test run does; start it with ``cwd=ROOT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["ROOT", "child_command"]

#: The checkout: ``tests`` is importable from here.
ROOT = Path(__file__).resolve().parents[2]


def child_command(module_file: str, *args: str) -> list[str]:
    """The command running the test module at ``module_file`` (its ``__file__``) with ``args``."""
    module = Path(module_file).resolve().relative_to(ROOT).with_suffix("")
    return [sys.executable, "-m", ".".join(module.parts), *args]
