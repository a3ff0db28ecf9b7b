"""Modules that moved out of ``plugmq.core`` this round: the old paths still work (same module, with a
DeprecationWarning naming the new one), and neither plugmq nor its tests import them any more."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from plugmq.core._moved import MOVED_MODULES, new_name
from tests.helpers.children import ROOT

# Every module of plugmq imported in a fresh interpreter, the moved-module warning an error there.
_IMPORT_ALL = """
import importlib, pkgutil, sys, warnings
import plugmq
warnings.filterwarnings("error", message=r".* moved to .*; import it from there", category=DeprecationWarning)
failed = []
for info in pkgutil.walk_packages(plugmq.__path__, "plugmq."):
    if info.name.rpartition(".")[2] == "__main__":
        continue  # runs the command line
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""

# A package's submodules follow it: one each of those is checked too.
OLD_PATHS = [*MOVED_MODULES, "plugmq.core.kvstore.base", "plugmq.core.admin.operations"]


@pytest.mark.parametrize("old", OLD_PATHS)
def test_an_old_path_still_imports_the_same_module_with_a_warning(old: str, monkeypatch: pytest.MonkeyPatch) -> None:
    new = new_name(old)
    assert new is not None
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported before (by another test): import it afresh
    with pytest.warns(DeprecationWarning, match=f"^{old} moved to {new}; import it from there$"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_an_old_name_imports_the_same_class() -> None:
    from plugmq.broker.broker import Broker

    with pytest.warns(DeprecationWarning, match="plugmq.core.broker moved to plugmq.broker.broker"):
        sys.modules.pop("plugmq.core.broker", None)
        from plugmq.core.broker import Broker as Old  # type: ignore[import-not-found]  # mypy sees no alias
    assert Old is Broker


def test_importing_every_plugmq_module_raises_no_moved_module_warning() -> None:
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def _old_imports(path: Path) -> list[str]:
    """``file:line module`` for each import statement in ``path`` naming a moved module's old path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names if new_name(name) is not None]
    return found


def test_plugmq_and_its_tests_import_only_the_new_paths() -> None:
    """Also the imports inside functions, which importing every module does not run."""
    sources = [*sorted((ROOT / "plugmq").rglob("*.py")), *sorted((ROOT / "tests").rglob("*.py"))]
    old = [hit for path in sources if path != Path(__file__) for hit in _old_imports(path)]  # not the check above
    assert old == [], "old import paths (see plugmq/core/_moved.py for the new ones):\n" + "\n".join(old)
