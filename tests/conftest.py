"""Shared fixtures of plugmq's own tests."""

from __future__ import annotations

import pytest

from plugmq.core.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()
