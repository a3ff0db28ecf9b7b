"""Every hook is documented (datasette-style meta-test): the hookspec module is the architecture's map."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import pluggy
import pytest

from plugmq.core import hookspecs

HOOKS: list[tuple[str, Callable[..., Any]]] = [
    (name, obj) for name, obj in vars(hookspecs).items()
    if inspect.isfunction(obj) and hasattr(obj, "plugmq_spec")
]


def spec_options(name: str) -> Mapping[str, Any]:
    """The options pluggy read from the hook's ``@hookspec`` marker (firstresult, historic, ...)."""
    manager = pluggy.PluginManager("plugmq")
    manager.add_hookspecs(hookspecs)
    spec = getattr(manager.hook, name).spec
    assert spec is not None, f"{name} is not a hook spec"
    return spec.opts


def test_hooks_exist_and_are_prefixed() -> None:
    assert len(HOOKS) >= 10
    public = [n for n, o in vars(hookspecs).items() if inspect.isfunction(o) and not n.startswith("_")]
    assert sorted(public) == sorted(n for n, _ in HOOKS), "every function in hookspecs is a hook spec"
    assert all(name.startswith("plugmq_") for name, _ in HOOKS)


@pytest.mark.parametrize(("name", "hook"), HOOKS, ids=[n for n, _ in HOOKS])
def test_hook_is_documented(name: str, hook: Callable[..., Any]) -> None:
    doc = inspect.getdoc(hook) or ""
    assert len(doc.splitlines()) >= 3, f"{name} needs a docstring saying who calls it and when"
    assert "firstresult" in doc, f"{name}: say whether it is firstresult"
    assert "Called " in doc, f"{name}: say who calls it and when ('Called by ...')"
    signature = inspect.signature(hook)
    for parameter in signature.parameters.values():
        assert parameter.annotation is not inspect.Parameter.empty, f"{name}({parameter.name}) is untyped"
        assert f":param {parameter.name}:" in doc, f"{name}: document parameter {parameter.name}"
    assert signature.return_annotation is not inspect.Signature.empty, f"{name} has no return type"
    if signature.return_annotation not in ("None", None):
        assert ":return:" in doc, f"{name}: say what the return value means"
    firstresult = spec_options(name)["firstresult"]
    assert ("Not firstresult" in doc) == (not firstresult), f"{name}: firstresult={firstresult} not stated"
