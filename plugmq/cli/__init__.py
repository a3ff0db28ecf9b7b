"""The ``plugmq`` command line: the only place that configures logging and reports errors.

Errors: every failure a user can cause (a PlugmqError, an OSError such as a missing or unreadable
file, a click usage error) ends as one line on stderr, ``plugmq: error: <what and how to fix
it>``, and a non-zero exit status (2 for usage errors, 1 otherwise), never a traceback. An
unexpected exception (a bug) is also one line; ``PLUGMQ_TRACEBACK=1`` shows its traceback.

Logging: structlog events of the library and plugins (see ``plugmq.core.logs``) and records of
other libraries go through the standard library's logging to stderr, rendered as readable text
or, with ``--log-json``, as JSON lines; ``--log-level`` picks the lowest level shown.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click


def _import_structlog_without_rich() -> None:
    """Import structlog with rich hidden, when nothing imported structlog yet.

    structlog imports rich (and with it pygments) when it is imported, only to offer pretty
    tracebacks; that is about a tenth of a second of CPU before ``plugmq serve`` can answer, more
    on a busy machine. The command line renders tracebacks plainly (see ``configure_logging``),
    so it does not need them; the verbs that print tables import rich themselves, afterwards.
    """
    if "structlog" in sys.modules:
        return
    hidden = [name for name in ("rich",) if name not in sys.modules]
    for name in hidden:
        # a None entry is documented to make that import raise ImportError
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import structlog  # noqa: F401
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


_import_structlog_without_rich()

import structlog  # noqa: E402 - after the function above imported it without rich
from structlog.typing import Processor  # noqa: E402

from plugmq.core.errors import PlugmqError  # noqa: E402

__all__ = ["ERROR_PREFIX", "LOG_HANDLER_NAME", "configure_logging", "main"]

ERROR_PREFIX = "plugmq: error: "
LOG_HANDLER_NAME = "plugmq-cli"

# verb -> "module:attribute"; modules load lazily so one verb's heavy imports (Spark) cost the others nothing.
_COMMANDS = {
    "plugins": "plugmq.cli.plugins_cmd:plugins",
    "check-config": "plugmq.cli.plugins_cmd:check_config",
    "demo": "plugmq.cli.demo:demo",
    "allocate": "plugmq.cli.allocate:command",
    "filter": "plugmq.cli.filter:command",
    "query": "plugmq.cli.query:command",
    "bench": "plugmq.cli.bench:bench",
    "conformance": "plugmq.cli.conformance:conformance",
    "compare": "plugmq.spark.cli:command",
    "serve": "plugmq.cli.serve:command",
    "admin": "plugmq.cli.admin:command",
    "chaos": "plugmq.cli.chaos:command",
    "console": "plugmq.cli.console:command",
    "send": "plugmq.cli.messaging:send",
    "consume": "plugmq.cli.messaging:consume",
}


class _StderrHandler(logging.StreamHandler[Any]):
    """Writes to whatever ``sys.stderr`` is when a record comes (test runners swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logging(json_lines: bool, level: str) -> None:
    """Send every log record to stderr: readable text, or JSON lines; ``level`` and above only.

    Configures structlog to hand its events to the standard library, and the root logger with
    one handler (replaced, not added, when called again).
    """
    timestamper = structlog.processors.TimeStamper(fmt="iso")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.processors.add_log_level,
            structlog.stdlib.PositionalArgumentsFormatter(),
            timestamper,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    renderer: Any = (structlog.processors.JSONRenderer() if json_lines else
                     structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback))
    rendering: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if json_lines:
        rendering.append(structlog.processors.format_exc_info)
    formatter = structlog.stdlib.ProcessorFormatter(
        processors=[*rendering, renderer],
        # records of other libraries (grpc, kazoo, ...) get the same fields
        foreign_pre_chain=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, timestamper],
    )
    handler = _StderrHandler()
    handler.set_name(LOG_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == LOG_HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


def _fail(message: str, exit_code: int) -> NoReturn:
    click.echo(ERROR_PREFIX + _one_line(message), err=True)
    sys.exit(exit_code)


def _usage_message(error: click.UsageError) -> str:
    path = error.ctx.command_path if error.ctx is not None else "plugmq"
    return f"{path}: {error.format_message()} (see '{path} --help')"


def _os_message(error: OSError) -> str:
    if error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    return str(error) or type(error).__name__


class _LazyGroup(click.Group):
    """Lists only the verbs whose module is part of this installation."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | {n for n in self._lazy if self._load(n)})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or self._load(name)

    def _load(self, name: str) -> click.Command | None:
        target = self._lazy.get(name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None  # that verb's module is not part of this installation
            raise
        command = getattr(module, attribute)
        return command


class _Main(_LazyGroup):
    """The top-level group: runs a verb and turns every user-facing failure into one line."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:  # a caller that handles errors itself
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        no_args_is_help = getattr(click.exceptions, "NoArgsIsHelpError", ())
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except no_args_is_help as shown:  # `plugmq` alone prints the help: not an error line
            shown.show()
            sys.exit(shown.exit_code)
        except click.UsageError as error:
            _fail(_usage_message(error), error.exit_code)
        except click.ClickException as error:
            _fail(error.format_message(), error.exit_code)
        except click.Abort:
            _fail("aborted", 1)
        except PlugmqError as error:
            _fail(str(error), 1)
        except OSError as error:
            _fail(_os_message(error), 1)
        except Exception as error:
            if os.environ.get("PLUGMQ_TRACEBACK"):
                raise
            _fail(f"unexpected {type(error).__name__}: {error} (a bug in plugmq or a plugin; "
                  "run again with PLUGMQ_TRACEBACK=1 to see where)", 1)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=_Main, lazy=_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-json", is_flag=True, help="Log JSON lines (for machines) instead of readable text.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Lowest level logged (to stderr).")
@click.version_option(package_name="plugmq")
def main(log_json: bool, log_level: str) -> None:
    """plugmq: a message-queue broker built from plugins."""
    configure_logging(log_json, log_level)
