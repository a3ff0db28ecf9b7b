"""Option errors name the plugin, the key, the value and what is expected — built-in or third-party."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
import pytest

from plugmq.core import ConfigError, Family, PluginDeclaration
from plugmq.core.plugin_options import describe_type, value_fits
from plugmq.core.pluginmanager import build_options, installed_plugins

#: what a leaked Python internal looks like in an error message
LEAKS = ("not supported between instances", "Attribute(", "<class ", "Traceback", "__init__()")


def error_for(declaration: PluginDeclaration, table: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        build_options(declaration, table, config_path="broker.toml: plugins." + declaration.name)
    text = str(info.value)
    for leak in LEAKS:
        assert leak not in text, f"{leak!r} leaked into: {text}"
    return text


def declaration_of(name: str) -> PluginDeclaration:
    found = {p.name: p.declaration for p in installed_plugins()}
    declaration = found[name]
    assert declaration is not None
    return declaration


def test_third_party_example_plugin_wrong_type() -> None:
    text = error_for(declaration_of("audit"), {"log_every": "5"})
    assert text == ("broker.toml: plugins.audit: plugin 'audit', option log_every = '5': "
                    "expected an integer, got a string")


def test_third_party_example_plugin_refused_value() -> None:
    text = error_for(declaration_of("audit"), {"log_every": -1})
    assert text.startswith("broker.toml: plugins.audit: plugin 'audit', option log_every = -1 is refused: ")
    assert "must be >= 0" in text


def test_attrs_in_validator_without_attribute_repr() -> None:
    text = error_for(declaration_of("store_lmdb"), {"flush": "fast"})
    assert "plugin 'store_lmdb', option flush = 'fast' is refused" in text
    assert "('sync', 'async')" in text


def test_built_in_validator_message_is_kept_with_the_key() -> None:
    text = error_for(declaration_of("store_mmap"), {"flush_interval_ms": -1})
    assert "plugin 'store_mmap', option flush_interval_ms = -1 is refused" in text
    assert "positive integer" in text


@pytest.mark.parametrize("wrong", ["text", 1.5, [1], {"a": 1}, True])
def test_every_option_of_every_installed_plugin_names_key_and_value(wrong: Any) -> None:
    """A wrongly typed value for any option of any installed plugin: one clear message, no internals."""
    checked = 0
    for plugin in installed_plugins():
        declaration = plugin.declaration
        if declaration is None or declaration.options is None:
            continue
        for field in attrs.fields(declaration.options):
            if value_fits(wrong, field.type) or field.converter is not None:
                continue
            try:
                build_options(declaration, {field.alias or field.name: wrong}, config_path="c")
            except ConfigError as exc:
                text = str(exc)
                assert f"plugin {declaration.name!r}" in text and f"option {field.name} = {wrong!r}" in text, text
                assert "expected" in text, text
                for leak in LEAKS:
                    assert leak not in text, f"{leak!r} leaked into: {text}"
                checked += 1
            else:
                pytest.fail(f"{declaration.name}.{field.name} accepted {wrong!r} although it is declared {field.type}")
    assert checked >= 10


# ------------------------------------------------------------------------------ the mechanism


def _declaring(options: type) -> PluginDeclaration:
    return PluginDeclaration(name="third", families={Family.EVENTS}, options=options)


def _odd(_instance: object, _attribute: object, value: int) -> None:
    if value % 2 == 0:
        raise ValueError(f"{value} is even")


def _breaks(_instance: object, _attribute: object, value: str) -> None:
    if value == "boom":
        raise KeyError(value)  # a careless validator: raises something that is not a ValueError


@attrs.frozen
class ThirdPartyOptions:
    low: int = 0
    high: int = attrs.field(default=10)
    ratio: float = 0.5
    mode: Literal["fast", "safe"] = "safe"
    names: tuple[str, ...] = ()
    path: Path = Path("x")
    odd: int = attrs.field(default=1, validator=_odd, metadata={"expected": "an odd integer"})
    careless: str = attrs.field(default="", validator=_breaks)
    either: int | None = None

    @high.validator
    def _above_low(self, _attribute: object, value: int) -> None:
        if value < self.low:
            raise ValueError(f"high ({value}) is below low ({self.low})")


def test_types_of_the_declared_annotations() -> None:
    declaration = _declaring(ThirdPartyOptions)
    built = build_options(declaration, {"ratio": 1, "names": ["a", "b"], "path": "/tmp/p", "either": 3},
                          config_path="c")
    assert built.ratio == 1 and built.names == ["a", "b"] and built.either == 3
    assert "expected one of 'fast', 'safe', got a string" in error_for(declaration, {"mode": "quick"})
    assert "expected a list, each item a string, got a list" in error_for(declaration, {"names": ["a", 1]})
    assert "option ratio = True: expected a number, got a boolean" in error_for(declaration, {"ratio": True})
    assert "option either = 'x': expected an integer or nothing (None)" in error_for(declaration, {"either": "x"})


def test_validator_errors_are_narrowed_to_their_key() -> None:
    declaration = _declaring(ThirdPartyOptions)
    text = error_for(declaration, {"low": 1, "odd": 4})
    assert text == "broker.toml: plugins.third: plugin 'third', option odd = 4 is refused: 4 is even; expected an odd integer"
    text = error_for(declaration, {"careless": "boom"})
    assert "option careless = 'boom' is refused: KeyError" in text


def test_keys_that_only_fail_together_are_named_together() -> None:
    text = error_for(_declaring(ThirdPartyOptions), {"low": 5, "high": 3})
    assert text == ("broker.toml: plugins.third: plugin 'third': options low = 5, high = 3 do not fit together: "
                    "high (3) is below low (5)")


def test_describe_type_words() -> None:
    assert describe_type(bool) == "true or false"
    assert describe_type(dict[str, int]) == "a table of a string -> an integer"
    assert describe_type(tuple[int, str]) == "a list of 2 items: an integer, a string"
