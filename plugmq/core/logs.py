"""How plugmq logs: structlog events that end up in the standard library's logging.

Every module (and every plugin) takes its logger with ``get_logger(__name__)`` and logs
structlog-style: ``log.warning("segment cut", topic=t, offset=o)``. plugmq never configures
logging, so as a library it is silent until the application says otherwise:

- structlog not configured (a plain Python application): each event goes to the standard-library
  logger of the module's name (``plugmq.broker.broker``, ...) as ``event key=value ...``, with the
  exception attached for ``log.exception``. The level check is the standard library's, so
  ``logging.basicConfig(level=logging.WARNING)`` shows warnings and errors and nothing below; a
  ``NullHandler`` on the ``plugmq`` logger keeps Python's last-resort handler from printing
  anything while the application configures no logging at all.
- structlog configured (by the application, by the ``plugmq`` command line, by
  ``structlog.testing.capture_logs``): events go through structlog's configuration exactly as
  ``structlog.get_logger(name)`` would, decided at each call, so ``capture_logs`` also sees
  loggers bound before it started.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["LibraryLogger", "get_logger"]

logging.getLogger("plugmq").addHandler(logging.NullHandler())


def _render_for_stdlib(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``event key=value ...`` as the record's message; exc_info / stack_info as logging expects them."""
    event = event_dict.pop("event", "")
    log_kwargs = {key: event_dict.pop(key) for key in ("exc_info", "stack_info") if key in event_dict}
    fields = " ".join(f"{key}={value!r}" for key, value in event_dict.items())
    message = f"{event} {fields}" if fields else str(event)
    return (message,), log_kwargs


_UNCONFIGURED_PROCESSORS: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.PositionalArgumentsFormatter(),
    _render_for_stdlib,
]

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "warn": logging.WARNING,
           "error": logging.ERROR, "exception": logging.ERROR, "critical": logging.CRITICAL,
           "fatal": logging.CRITICAL}


class LibraryLogger:
    """A structlog-style logger that routes each event as the module docstring says.

    ``bind`` / ``new`` / ``unbind`` / ``try_unbind`` return new loggers carrying context, like
    structlog's bound loggers; ``debug`` ... ``critical`` and ``exception`` log an event.
    """

    __slots__ = ("_context", "_name", "_stdlib", "_unconfigured")

    def __init__(self, name: str, context: Mapping[str, Any] | None = None) -> None:
        self._name = name
        self._context = dict(context or {})
        self._stdlib = logging.getLogger(name)
        self._unconfigured: Any = None

    @property
    def name(self) -> str:
        return self._name

    # context ------------------------------------------------------------------------------
    def bind(self, **new_values: Any) -> LibraryLogger:
        return LibraryLogger(self._name, {**self._context, **new_values})

    def new(self, **new_values: Any) -> LibraryLogger:
        return LibraryLogger(self._name, new_values)

    def unbind(self, *keys: str) -> LibraryLogger:
        missing = [key for key in keys if key not in self._context]
        if missing:
            raise KeyError(missing[0])
        return self.try_unbind(*keys)

    def try_unbind(self, *keys: str) -> LibraryLogger:
        return LibraryLogger(self._name, {k: v for k, v in self._context.items() if k not in keys})

    # events -------------------------------------------------------------------------------
    def _emit(self, method: str, event: str | None, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        if structlog.is_configured():
            target: Any = structlog.get_logger(self._name)
            if self._context:
                target = target.bind(**self._context)
            return getattr(target, method)(event, *args, **kw)
        if not self._stdlib.isEnabledFor(_LEVELS[method]):
            return None
        if self._unconfigured is None:
            self._unconfigured = structlog.wrap_logger(
                self._stdlib, processors=_UNCONFIGURED_PROCESSORS, wrapper_class=structlog.stdlib.BoundLogger,
                context_class=dict,
            ).bind(**self._context)
        return getattr(self._unconfigured, method)(event, *args, **kw)

    def debug(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("debug", event, args, kw)

    def info(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("info", event, args, kw)

    def warning(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("warning", event, args, kw)

    def error(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("error", event, args, kw)

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("exception", event, args, kw)

    def critical(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        return self._emit("critical", event, args, kw)


def get_logger(name: str) -> LibraryLogger:
    """The logger of module ``name`` (pass ``__name__``); see the module docstring for where events go."""
    return LibraryLogger(name)
