from __future__ import annotations

import pytest

from plugmq import ConfigError, PluginCardinalityError, PluginError
from plugmq.core import Family
from plugmq.core.pluginmanager import available_plugins, build_options, load_plugins
from tests.helpers.example_plugins import (
    Declares,
    ExampleOptions,
    MisspelledHook,
    OffersFilter,
    OffersStrategy,
    WrongName,
)


def store(name: str = "my_store") -> Declares:
    return Declares(name, Family.STORAGE, options=ExampleOptions)


def test_built_in_plugins_are_entry_points() -> None:
    names = set(available_plugins())
    assert {"store_mmap", "filter_tag", "alloc"} <= names


def test_unknown_plugin_names_known_ones_and_suggests() -> None:
    with pytest.raises(PluginError) as info:
        load_plugins(["store_mmapp"], config_path="broker.toml: broker.plugins")
    text = str(info.value)
    assert "broker.toml: broker.plugins: unknown plugin 'store_mmapp'" in text
    assert "Did you mean 'store_mmap'?" in text
    assert "Installed plugins:" in text and "filter_tag" in text


def test_two_storage_plugins() -> None:
    with pytest.raises(PluginCardinalityError, match=r"2 storage plugins \(a, b\); a broker takes exactly one"):
        load_plugins(["a", "b"], objects={"a": store("a"), "b": store("b")})


def test_missing_storage_plugin_names_candidates() -> None:
    with pytest.raises(PluginCardinalityError, match="no storage plugin; a broker needs exactly one. Add one of"):
        load_plugins(["f"], objects={"f": OffersFilter("f", "TAG")})


def test_two_delay_plugins() -> None:
    objects = {"s": store("s"), "d1": Declares("d1", Family.DELAY), "d2": Declares("d2", Family.DELAY)}
    with pytest.raises(PluginCardinalityError, match=r"2 delay plugins \(d1, d2\); a broker takes at most one"):
        load_plugins(["s", "d1", "d2"], objects=objects)


def test_two_transaction_plugins() -> None:
    objects = {"s": store("s"), "t1": Declares("t1", Family.TRANSACTION), "t2": Declares("t2", Family.TRANSACTION)}
    with pytest.raises(PluginCardinalityError, match="2 transaction plugins"):
        load_plugins(["s", "t1", "t2"], objects=objects)


def test_same_filter_type_twice() -> None:
    objects = {"s": store("s"), "f1": OffersFilter("f1", "TAG"), "f2": OffersFilter("f2", "TAG")}
    with pytest.raises(PluginError, match="filter expression type 'TAG' is offered by both 'f1' and 'f2'"):
        load_plugins(["s", "f1", "f2"], objects=objects)


def test_same_strategy_name_twice() -> None:
    objects = {"s": store("s"), "a1": OffersStrategy("a1", "AVG"), "a2": OffersStrategy("a2", "AVG")}
    with pytest.raises(PluginError, match="allocation strategy 'AVG' is offered by both 'a1' and 'a2'"):
        load_plugins(["s", "a1", "a2"], objects=objects)


def test_hook_that_does_not_exist() -> None:
    objects = {"s": store("s"), "typo": MisspelledHook("typo", Family.EVENTS)}
    with pytest.raises(PluginError, match=r"implements a hook that plugmq does not define \(typo.plugmq_make_stor\)"):
        load_plugins(["s", "typo"], objects=objects)


def test_declared_name_must_match() -> None:
    with pytest.raises(PluginError, match="registered as 'w' declares the name 'something-else'"):
        load_plugins(["w"], objects={"w": WrongName("w")}, check_cardinality=False)


def test_plugin_listed_twice() -> None:
    with pytest.raises(ConfigError, match="plugin 's' is listed twice"):
        load_plugins(["s", "s"], objects={"s": store("s")})


def test_unknown_option_suggests_and_lists() -> None:
    declaration = load_plugins(["s"], objects={"s": store("s")}).declarations["s"]
    with pytest.raises(ConfigError) as info:
        build_options(declaration, {"flsh": "sync"}, config_path="broker.toml: plugins.s")
    assert str(info.value) == (
        "broker.toml: plugins.s: unknown option 'flsh' for plugin 's'. Did you mean 'flush'? "
        "Known options: flush, segment_size"
    )
    assert build_options(declaration, {"flush": "sync"}, config_path="x") == ExampleOptions(flush="sync")


def test_options_for_a_plugin_without_options() -> None:
    declaration = load_plugins(["e"], objects={"e": Declares("e", Family.EVENTS)},
                               check_cardinality=False).declarations["e"]
    with pytest.raises(ConfigError, match="plugin 'e' takes no options, got x"):
        build_options(declaration, {"x": 1}, config_path="c")


def test_plugin_that_fails_to_import_is_named() -> None:
    from importlib.metadata import EntryPoint

    from plugmq.core.pluginmanager import _load_entry_point

    broken = EntryPoint(name="broken", value="plugmq_no_such_module_xyz", group="plugmq.plugins")
    with pytest.raises(PluginError, match=r"plugin 'broken' \(entry point 'plugmq_no_such_module_xyz' .*failed to import: "
                                          r"ModuleNotFoundError"):
        _load_entry_point("broken", broken)
