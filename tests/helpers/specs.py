"""Experiment specs for the compare tests: a base spec with some keys changed."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["spec_with"]


def spec_with(base: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``base`` with ``changes`` applied: a key is a path of ``__``-separated parts
    (a number indexes a list: ``matrix__0__reseed``); the value None deletes the key."""
    data = copy.deepcopy(dict(base))
    for path, value in changes.items():
        node: Any = data
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if value is None:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return data
