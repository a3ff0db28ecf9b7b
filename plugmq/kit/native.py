"""Compiled kernels: one policy for using them, and the layouts they are built for, written once.

A kernel is an optional C extension with a Python twin that computes the same thing (the twin is
its reference and its fallback). Every kernel is loaded through :func:`load_kernel`, which decides
the same way for all of them: the extension is used when it imports and exports the
``LAYOUT_VERSION`` its Python twin expects; otherwise the twin runs, and one warning per kernel
and process says what falls back and what it costs. :func:`kernel_statuses` tells which kernels
are in use (``plugmq plugins`` prints it).

A layout (record offsets, magics, sizes) lives in one Python module, which packs and unpacks
records with it; the C kernel includes a header generated from the same constants by
:func:`c_header` (checked in, and a test fails when it is stale). ``LAYOUT_VERSION`` is a
fingerprint of those constants: a kernel compiled from an older header (an editable install whose
extension was not rebuilt) carries another one and is refused.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import attrs

from plugmq.core.logs import get_logger

__all__ = [
    "Kernel",
    "KernelStatus",
    "c_header",
    "check_header",
    "kernel_statuses",
    "layout_version",
    "load_kernel",
    "struct_offsets",
]

log = get_logger(__name__)


@attrs.frozen
class Kernel:
    """A compiled kernel: its module, the layout its twin expects, and what runs without it."""

    module: str  # e.g. "plugmq.plugins.store_mmap._appender"
    layout_version: int  # the LAYOUT_VERSION the Python side expects
    users: tuple[str, ...]  # the plugins it speeds up
    fallback: str  # what runs instead
    cost: str  # what the fallback costs, measured
    #: Functions the Python side calls: a build older than one of them is refused like a build for
    #: another layout (the bytes are the same, the interface is not). A dotted name is a method of
    #: one of the module's types ("Appender.append_columns").
    functions: tuple[str, ...] = ()


@attrs.frozen
class KernelStatus:
    kernel: Kernel
    in_use: bool
    reason: str  # why not in use ("" when it is)


_STATUSES: dict[str, KernelStatus] = {}


def _has(module: ModuleType, dotted: str) -> bool:
    found: object = module
    for part in dotted.split("."):
        if not hasattr(found, part):
            return False
        found = getattr(found, part)
    return True


def load_kernel(kernel: Kernel) -> ModuleType | None:
    """The extension module of ``kernel``, or None when it is missing or built for another layout
    (logged once per kernel: what falls back and what it costs)."""
    known = _STATUSES.get(kernel.module)
    if known is not None and known.kernel == kernel:
        return importlib.import_module(kernel.module) if known.in_use else None
    try:
        module: ModuleType | None = importlib.import_module(kernel.module)
        reason = ""
    except ImportError as exc:
        module, reason = None, f"not built ({exc}); reinstall plugmq with a C compiler (bash scripts/setup.sh)"
    if module is not None:
        built_for = getattr(module, "LAYOUT_VERSION", None)
        if built_for != kernel.layout_version:
            reason = (f"built for layout {_hex(built_for)}, the Python side is at {_hex(kernel.layout_version)} "
                      "(rebuild it: pip install -e .)")
            module = None
    missing = [name for name in kernel.functions if module is not None and not _has(module, name)]
    if missing:
        reason = f"built without {', '.join(missing)} (an older build; rebuild it: pip install -e .)"
        module = None
    _STATUSES[kernel.module] = KernelStatus(kernel, module is not None, reason)
    if module is None:
        log.warning("compiled kernel not in use", kernel=kernel.module, reason=reason, fallback=kernel.fallback,
                    cost=kernel.cost)
    return module


def _hex(version: object) -> str:
    return f"{version:#010x}" if isinstance(version, int) else "none"


def kernel_statuses() -> list[KernelStatus]:
    """Every kernel loaded so far in this process (importing a plugin loads its kernels)."""
    return list(_STATUSES.values())


# ------------------------------------------------------------------------------ layouts


def struct_offsets(fields: Sequence[tuple[str, str]], prefix: str = "") -> dict[str, int]:
    """``{prefix + name: offset}`` of big-endian ``struct`` fields laid end to end (no padding)."""
    import struct

    offsets = {}
    at = 0
    for name, code in fields:
        offsets[prefix + name] = at
        at += struct.calcsize(">" + code)
    return offsets


def layout_version(constants: Mapping[str, int]) -> int:
    """The fingerprint of a layout: CRC-32 of its ``NAME=value`` lines, as a positive int32."""
    text = "".join(f"{name}={value}\n" for name, value in constants.items())
    return zlib.crc32(text.encode("ascii")) & 0x7FFFFFFF


def _c_int(value: int) -> str:
    if value < 0:
        raise ValueError(f"a layout constant must not be negative, got {value}")
    return f"{value:#x}u" if value > 0x7FFFFFFF else str(value)


def c_header(guard: str, source: str, constants: Mapping[str, int]) -> str:
    """A C header defining ``constants`` and their ``LAYOUT_VERSION``, generated from ``source``."""
    lines = [f"/* Generated from {source} by `python scripts/kernel_headers.py`: do not edit.",
             " * A kernel exports LAYOUT_VERSION; the Python side refuses one built for another. */",
             f"#ifndef {guard}", f"#define {guard}", ""]
    lines += [f"#define {name} {_c_int(value)}" for name, value in constants.items()]
    lines += ["", f"#define LAYOUT_VERSION {layout_version(constants)}", "", "#endif", ""]
    return "\n".join(lines)


def check_header(path: Path, text: str, *, write: bool = False) -> bool:
    """Whether the header at ``path`` is ``text``; with ``write``, make it so. Returns the answer
    before writing."""
    current = path.read_text(encoding="ascii") if path.exists() else None
    if write and current != text:
        path.write_text(text, encoding="ascii")
    return current == text
