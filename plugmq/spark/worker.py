"""One experiment in a process of its own: :func:`run_request`, or ``python -m plugmq.spark.worker REQUEST RESULT``.

REQUEST holds the pickled (experiment, work_dir, window_s, keep_data); the pickled
ExperimentResult is written to RESULT. Plugin logs at warning and above go to stderr (a file of
the parent's choosing for :func:`run_request`), which the parent keeps when the process fails.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from pathlib import Path

__all__ = ["main", "run_request"]


def _configure_logging() -> None:
    import structlog

    # This is a program's entry point (like the CLI), the one place a process configures logging.
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _run(request: Path, response: Path) -> None:
    from plugmq.spark.replay import run_experiment

    exp, work_dir, window_s, keep_data = pickle.loads(request.read_bytes())
    result = run_experiment(exp, work_dir=work_dir, window_s=window_s, keep_data=keep_data)
    tmp = response.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(response)


def run_request(request: str, response: str, stderr_path: str) -> None:
    """Body of a forked experiment process: stderr (and stdout) into ``stderr_path``, then run."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.dup2(fd, 1)
    os.close(fd)
    _configure_logging()
    _run(Path(request), Path(response))


def main(argv: list[str]) -> int:
    _configure_logging()
    _run(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
