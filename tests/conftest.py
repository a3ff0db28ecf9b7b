"""Shared fixtures of plugmq's own tests."""

from __future__ import annotations

import pytest

from plugmq.core.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(autouse=True)
def _reset_structlog():
    """CLI invocations configure structlog globally; later tests must see the library defaults."""
    yield
    import structlog

    structlog.reset_defaults()
