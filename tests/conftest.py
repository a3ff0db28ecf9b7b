"""Shared fixtures of plugmq's own tests."""

from __future__ import annotations

import pytest

from plugmq.core.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(autouse=True)
def _reset_logging():
    """CLI invocations configure structlog and the root logger; later tests must see the library defaults."""
    yield
    import logging

    import structlog

    from plugmq.cli import LOG_HANDLER_NAME

    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == LOG_HANDLER_NAME]:
        root.removeHandler(handler)
        root.setLevel(logging.WARNING)
