"""The official RocketMQ clients (rocketmq-python-client) in the tests: started and always shut down."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

__all__ = ["started"]


class _Client(Protocol):
    def startup(self) -> object: ...

    def shutdown(self) -> object: ...


C = TypeVar("C", bound=_Client)


@contextmanager
def started(client: C) -> Iterator[C]:
    """``client`` started for the block and shut down after it, even when the block fails."""
    client.startup()
    try:
        yield client
    finally:
        client.shutdown()
