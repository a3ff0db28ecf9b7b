"""The ``plugmq`` command line. The only place that configures logging."""

from __future__ import annotations

import importlib
import logging
import sys

import click
import structlog

__all__ = ["main"]

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
}


def configure_logging(json_lines: bool, level: str) -> None:
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


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


@click.group(cls=_LazyGroup, lazy=_COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--log-json", is_flag=True, help="Log JSON lines (for machines) instead of readable text.")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Lowest level logged (to stderr).")
@click.version_option(package_name="plugmq")
def main(log_json: bool, log_level: str) -> None:
    """plugmq: a message-queue broker built from plugins."""
    configure_logging(log_json, log_level)
