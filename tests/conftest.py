"""Shared fixtures of plugmq's own tests: ``clock`` here, the rest in the fixture plugins below."""

from __future__ import annotations

import pytest

from plugmq.core.clock import ManualClock

pytest_plugins = ["tests.fixtures.brokers", "tests.fixtures.browser", "tests.fixtures.spark", "tests.fixtures.zookeeper"]


@pytest.fixture
def clock() -> ManualClock:
    """Virtual time the test moves (``advance``, ``set``); brokers from ``make_broker`` run on it."""
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
