"""pytest plugin (entry point ``pytest11``): the ``--plugmq-plugin`` option of the conformance suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("plugmq", "plugmq conformance suite")
    group.addoption(
        "--plugmq-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="installed plugmq plugin (entry-point name) to run the conformance suite against; repeatable",
    )


def plugins_under_test(config: pytest.Config) -> list[str]:
    return list(config.getoption("--plugmq-plugin") or [])
