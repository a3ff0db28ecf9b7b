"""``python -m plugmq.spark.worker REQUEST RESULT``: one experiment in a process of its own.

REQUEST holds the pickled (experiment, work_dir, window_s, keep_data); the pickled
ExperimentResult is written to RESULT. Plugin logs at warning and above go to stderr, which the
parent keeps when the process fails.
"""

from __future__ import annotations

import logging
import pickle
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import structlog

    # This is a program's entry point (like the CLI), the one place a process configures logging.
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    from plugmq.spark.replay import run_experiment

    request, response = Path(argv[0]), Path(argv[1])
    exp, work_dir, window_s, keep_data = pickle.loads(request.read_bytes())
    result = run_experiment(exp, work_dir=work_dir, window_s=window_s, keep_data=keep_data)
    tmp = response.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    tmp.replace(response)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
