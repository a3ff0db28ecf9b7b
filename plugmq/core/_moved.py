"""Old import paths of modules that moved out of ``plugmq.core``, kept working with a warning.

Until this round ``plugmq.core`` held the runtime, the clients, the kit plugins share and admin as
well as the plugin SPI. Third-party plugins and applications may still import
``plugmq.core.kvstore`` or ``plugmq.core.broker``: a finder in ``sys.meta_path`` answers
those names with the module at its new place (the same module object, so ``isinstance`` and
identity hold) and a DeprecationWarning naming the new path. It goes first in ``sys.meta_path``:
for ``plugmq.core.kvstore.base`` the path finder would otherwise load the file again under the old
name (a second module object) from the moved package's ``__path__``. It answers only old names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED_MODULES", "install"]

#: Old module (or package) -> new one. A package's submodules follow it.
MOVED_MODULES: dict[str, str] = {
    "plugmq.core.kvstore": "plugmq.kit.kvstore",
    "plugmq.core.requestcodec": "plugmq.kit.requestcodec",
    "plugmq.core.writeback": "plugmq.kit.writeback",
    "plugmq.core.lateness": "plugmq.kit.lateness",
    "plugmq.core.diskspace": "plugmq.kit.diskspace",
    "plugmq.core.admin": "plugmq.admin",
    "plugmq.core.cluster": "plugmq.admin.cluster_session",
    "plugmq.core.config": "plugmq.config.broker",
    "plugmq.core.policy": "plugmq.config.policy",
    "plugmq.core.datadir": "plugmq.config.datadir",
    "plugmq.core.broker": "plugmq.broker.broker",
    "plugmq.core.components": "plugmq.broker.components",
    "plugmq.core.api": "plugmq.broker.api",
    "plugmq.core.allocation_api": "plugmq.broker.allocation_api",
    "plugmq.core.topics": "plugmq.broker.topics",
    "plugmq.core.groups": "plugmq.broker.groups",
    "plugmq.core.journal": "plugmq.broker.journal",
    "plugmq.core.offsets": "plugmq.broker.offsets",
    "plugmq.core.pop": "plugmq.broker.pop",
    "plugmq.core.popstate": "plugmq.broker.popstate",
    "plugmq.core.replication": "plugmq.broker.replication",
    "plugmq.core.failover": "plugmq.broker.failover",
    "plugmq.core.routes": "plugmq.broker.routes",
    "plugmq.core.traffic": "plugmq.broker.traffic",
    "plugmq.core.delayledger": "plugmq.broker.delayledger",
    "plugmq.core.producer": "plugmq.client.producer",
    "plugmq.core.consumer": "plugmq.client.consumer",
    "plugmq.core.simple": "plugmq.client.simple",
    "plugmq.core.transactions": "plugmq.client.transactions",
    "plugmq.core.ports": "plugmq.client.ports",
}


def new_name(old: str) -> str | None:
    """Where ``old`` lives now, or None when it never moved."""
    for prefix, target in MOVED_MODULES.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix):]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.target}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at its new place is already imported."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        moved = new_name(fullname)
        if moved is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(moved))


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
