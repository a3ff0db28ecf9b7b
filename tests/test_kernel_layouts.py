"""The layouts the compiled kernels are built for: written once, checked at import.

The C headers are generated from the Python layouts (scripts/kernel_headers.py) and must be
current; a kernel built for another layout is refused with one log line saying what falls back
and what it costs; ``plugmq plugins`` says which kernels are in use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
from click.testing import CliRunner
from structlog.testing import capture_logs

from plugmq.cli import main
from plugmq.kit import native
from plugmq.kit.native import Kernel, c_header, layout_version, load_kernel
from plugmq.plugins.store_mmap import layout

ROOT = Path(__file__).parent.parent


def test_generated_headers_are_current() -> None:
    check = subprocess.run([sys.executable, "scripts/kernel_headers.py", "--check"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr


def test_the_record_layout_is_the_one_the_python_side_packs() -> None:
    """Offsets in the header come from the struct record.py packs with."""
    assert layout.HEAD.size == layout.CONSTANTS["HEADER_SIZE"] == 100
    packed = layout.HEAD.pack(*range(1, 11), b"HOSTHOST", 12, b"STORESTO", *range(14, 18))
    assert packed[layout.CONSTANTS["OFF_BORN_HOST"]:][:8] == b"HOSTHOST"
    assert packed[layout.CONSTANTS["OFF_STORE_HOST"]:][:8] == b"STORESTO"
    assert int.from_bytes(packed[layout.CONSTANTS["OFF_BODY_LEN"]:][:4], "big") == 17
    text = c_header("G", "x.py", {"A": 1, "B": 0xDAA320B7})
    assert "#define B 0xdaa320b7u" in text and f"#define LAYOUT_VERSION {layout_version({'A': 1, 'B': 0xDAA320B7})}" in text


def test_every_kernel_exports_the_layout_its_twin_expects() -> None:
    import plugmq.plugins.delay_schedule
    import plugmq.plugins.delay_wheel
    import plugmq.plugins.store_mmap  # noqa: F401

    statuses = {s.kernel.module: s for s in native.kernel_statuses()}
    assert set(statuses) >= {"plugmq.plugins.store_mmap._appender", "plugmq.plugins.store_mmap._scan",
                             "plugmq.plugins.delay_schedule._segscan", "plugmq.kit._requestcodec"}
    for status in statuses.values():
        assert status.in_use, f"{status.kernel.module}: {status.reason}"


def test_a_kernel_built_for_another_layout_is_refused_once_with_what_it_costs() -> None:
    stale = Kernel(module="plugmq.plugins.store_mmap._scan", layout_version=layout.LAYOUT_VERSION ^ 1,
                   users=("store_mmap",), fallback="the Python twin", cost="2x the time")
    missing = Kernel(module="plugmq.plugins.store_mmap._no_such_kernel", layout_version=1, users=("store_mmap",),
                     fallback="the Python twin", cost="3x the time")
    saved = dict(native._STATUSES)
    try:
        native._STATUSES.pop(stale.module, None)
        with capture_logs() as logs:
            assert load_kernel(stale) is None
            assert load_kernel(stale) is None  # decided once: no second line
            assert load_kernel(missing) is None
        assert [entry["kernel"] for entry in logs] == [stale.module, missing.module]
        assert "built for layout" in logs[0]["reason"] and logs[0]["cost"] == "2x the time"
        assert "not built" in logs[1]["reason"] and logs[1]["fallback"] == "the Python twin"
        assert logs[0]["log_level"] == "warning"
    finally:
        native._STATUSES.clear()
        native._STATUSES.update(saved)


def test_plugmq_plugins_says_which_kernels_are_in_use() -> None:
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    kernels = {k["module"]: k for k in rows["store_mmap"]["kernels"]}
    assert kernels["plugmq.plugins.store_mmap._appender"]["in_use"] is True
    assert {k["module"] for k in rows["delay_wheel"]["kernels"]} == {"plugmq.kit._requestcodec"}
    table = CliRunner().invoke(main, ["plugins"])
    assert "compiled kernels" in table.output and "_segscan" in table.output


def test_a_kernel_built_without_a_function_the_python_side_calls_is_refused() -> None:
    """An older build of the right layout lacking a newer function (store_mmap's bulk read): the
    twin runs rather than a call failing mid-pull."""
    older = attrs.evolve(layout.SCAN_KERNEL, functions=(*layout.SCAN_KERNEL.functions, "not_in_this_build"))
    saved = dict(native._STATUSES)
    try:
        native._STATUSES.pop(older.module, None)
        with capture_logs() as logs:
            assert load_kernel(older) is None
        assert "built without not_in_this_build" in logs[0]["reason"]
        native._STATUSES.pop(older.module, None)
        assert load_kernel(layout.SCAN_KERNEL) is not None
    finally:
        native._STATUSES.clear()
        native._STATUSES.update(saved)
