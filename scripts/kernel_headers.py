"""Write (or ``--check``) the C headers the compiled kernels include, from their Python layouts.

Each layout module defines its constants once and renders them with ``header_text()`` into
``HEADER_PATH`` (see plugmq.kit.native). Run after changing a layout, then rebuild the kernels
(``pip install -e .``). ``--check`` exits 1 naming the headers that are stale (the suite runs it).
"""

from __future__ import annotations

import importlib
import sys

from plugmq.kit.native import check_header

LAYOUTS = (
    "plugmq.plugins.store_mmap.layout",
    "plugmq.plugins.delay_schedule.layout",
    "plugmq.kit.requestcodec",
)


def main(argv: list[str]) -> int:
    write = "--check" not in argv
    stale = []
    for name in LAYOUTS:
        module = importlib.import_module(name)
        if not check_header(module.HEADER_PATH, module.header_text(), write=write):
            stale.append(str(module.HEADER_PATH))
    if stale and not write:
        print("stale kernel headers (run python scripts/kernel_headers.py, then pip install -e .): "
              + ", ".join(stale), file=sys.stderr)
        return 1
    for path in stale:
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
