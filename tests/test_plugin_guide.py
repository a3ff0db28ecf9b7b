"""The plugin guide's examples (```py blocks of docs/plugins.md) load as plugins and keep their contracts."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from plugmq.conformance.allocation import AllocationConformance
from plugmq.conformance.filters import FilterConformance
from plugmq.core import AllocationCapabilities, Family
from plugmq.core.pluginmanager import LoadedPlugins, load_plugins

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
_BLOCK = re.compile(r"```py\n(.*?)```", re.DOTALL)


def _plugins() -> dict[str, LoadedPlugins]:
    loaded = {}
    for index, code in enumerate(_BLOCK.findall(GUIDE.read_text(encoding="utf-8"))):
        module = types.ModuleType(f"readme_plugin_{index}")
        exec(compile(code, f"docs/plugins.md py block {index}", "exec"), vars(module))
        name = module.plugmq_declare().name
        loaded[name] = load_plugins([name], objects={name: module}, check_cardinality=False)
    return loaded


@pytest.fixture(scope="module")
def plugins() -> dict[str, LoadedPlugins]:
    return _plugins()


def test_the_guide_shows_an_allocation_and_a_filter_plugin(plugins: dict[str, LoadedPlugins]) -> None:
    families = {name: set(p.declarations[name].families) for name, p in plugins.items()}
    assert families == {"my_alloc": {Family.ALLOCATION}, "my_filter": {Family.FILTER}}


def test_the_guide_allocation_strategy_assigns_every_queue_once(plugins: dict[str, LoadedPlugins]) -> None:
    loaded = plugins["my_alloc"]
    (name, factory), = loaded.hooks.allocate_strategies().items()
    capabilities = loaded.declarations["my_alloc"].capabilities[name]
    assert isinstance(capabilities, AllocationCapabilities)
    suite = AllocationConformance()
    suite.test_every_queue_assigned_exactly_once((name, factory, capabilities))
    suite.test_consumer_not_in_list_gets_nothing((name, factory, capabilities))


def test_the_guide_filter_keeps_its_declared_examples(plugins: dict[str, LoadedPlugins]) -> None:
    (compiler,) = plugins["my_filter"].hooks.filter_compilers().values()
    suite = FilterConformance()
    suite.test_capabilities_name_the_expression_type(compiler)
    suite.test_declared_examples_match_as_declared(compiler)
    suite.test_fuzzed_token_soup_raises_only_filter_syntax_errors(compiler)
