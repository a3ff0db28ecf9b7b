"""Checks of ``broker.data_dir``: every problem is a ConfigError naming the key, the value and the fix.

:func:`check_data_dir_value` runs when a config is read (no file-system access);
:func:`prepare_data_dir` when a broker opens (creates the directory); :func:`check_data_dir`
for ``plugmq check-config`` (the same checks, creating nothing).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from plugmq.core.errors import ConfigError

__all__ = ["check_data_dir", "check_data_dir_value", "data_dir_value_problem", "prepare_data_dir"]

_KEY = "broker.data_dir"


def _label(where: str) -> str:
    return f"{where}: {_KEY}" if where else _KEY


def data_dir_value_problem(text: str) -> str | None:
    """What makes ``text`` unable to ever name a directory (empty, blank, a NUL), worded to follow
    the key: ``broker.data_dir <problem>``; None when it could."""
    if not text.strip():
        return f'is empty ({text!r}); set it to the directory the broker keeps its files in, e.g. data_dir = "./data"'
    if "\0" in text:
        return f"= {text!r} contains a NUL character, which no file system allows in a path; remove it"
    return None


def check_data_dir_value(value: str | os.PathLike[str], where: str = "") -> Path:
    """Refuse values that can never name a directory (empty, blank, with a NUL)."""
    text = os.fspath(value)
    if isinstance(text, bytes):
        raise ConfigError(f"{_label(where)} must be a text path, got bytes {text!r}")
    problem = data_dir_value_problem(text)
    if problem is not None:
        raise ConfigError(f"{_label(where)} {problem}")
    return Path(text)


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _usable(path: Path, where: str) -> None:
    label = _label(where)
    if path.exists():
        if not path.is_dir():
            raise ConfigError(
                f"{label} = {str(path)!r} is a file, not a directory; point data_dir at a directory "
                "(the broker creates it if missing) or move the file away"
            )
        target = path
    else:
        ancestor = _nearest_existing(path)
        if not ancestor.is_dir():
            raise ConfigError(
                f"{label} = {str(path)!r} lies below {str(ancestor)!r}, which is a file, not a directory; "
                "point data_dir at a path whose parents are directories"
            )
        target = ancestor
    if _read_only_fs(target):
        raise ConfigError(
            f"{label} = {str(path)!r} is on a read-only file system ({str(target)!r}); "
            "point data_dir at a writable place"
        )
    if not os.access(target, os.W_OK | os.X_OK):
        what = "write to" if target == path else f"create {str(path)!r} in"
        raise ConfigError(
            f"{label} = {str(path)!r}: this user cannot {what} {str(target)!r} (permission denied); "
            "point data_dir at a writable place or fix the permissions"
        )


def check_data_dir(path: str | os.PathLike[str], where: str = "") -> Path:
    """Whether a broker could use ``path``: a writable directory, or creatable. Creates nothing."""
    checked = check_data_dir_value(path, where)
    _usable(checked, where)
    return checked


def prepare_data_dir(path: str | os.PathLike[str], where: str = "") -> Path:
    """Create ``path`` (and its parents) if needed; ConfigError for every reason it cannot be used."""
    checked = check_data_dir_value(path, where)
    _usable(checked, where)
    try:
        checked.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # raced with someone creating a file there
        raise ConfigError(f"{_label(where)} = {str(checked)!r} is a file, not a directory; "
                          "point data_dir at a directory") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = "free space on that file system or point data_dir elsewhere"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "point data_dir at a writable place or fix the permissions"
        else:
            fix = "point data_dir at a usable directory"
        raise ConfigError(f"{_label(where)} = {str(checked)!r} cannot be created: {exc.strerror}; {fix}") from exc
    return checked
