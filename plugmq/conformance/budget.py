"""How many examples a Hypothesis clause of the suite tries.

Each property clause names the examples it wants (60 for allocation, 80 for filters); a run may
ask for fewer with ``--plugmq-examples N`` (a quick first pass while writing a plugin, or a test
that runs the suite in a subprocess), which loads a Hypothesis profile capping them. Never more:
a profile asking for more examples leaves each clause's own number.
"""

from __future__ import annotations

from hypothesis import settings

__all__ = ["PROFILE", "cap_examples", "examples"]

PROFILE = "plugmq-conformance"


def cap_examples(limit: int) -> None:
    """Load a profile (the current one with ``max_examples=limit``); call before the suite's modules
    are imported, as the conformance pytest plugin does in ``pytest_configure``."""
    settings.register_profile(PROFILE, settings(max_examples=limit))  # the rest as the current profile
    settings.load_profile(PROFILE)


def examples(wanted: int) -> int:
    """``wanted``, or the loaded profile's ``max_examples`` when that is smaller."""
    return min(wanted, settings().max_examples)
