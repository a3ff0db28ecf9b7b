"""What plugins' option classes share: validators that name the option, and the defaults.

The core checks a ``[plugins.<name>]`` table against the plugin's attrs options class
(:mod:`plugmq.core.plugin_options`); these are validators several plugins' classes use, with
messages that also make sense when a class is built in Python, and the rule every plugin's factory
hook applies to the options the context gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from plugmq.core import ConfigError, PluginContext, validate_topic

__all__ = ["options_or_default", "positive_number", "topic_name"]

OptionsT = TypeVar("OptionsT")

Validator = Callable[[object, "attrs.Attribute[Any]", Any], None]


def positive_number(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    """attrs validator: an int or a float above zero (a boolean is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{attr.name} must be a positive number, got {value!r}")


def topic_name(plugin: str) -> Validator:
    """attrs validator: a legal topic name; the ConfigError names ``plugins.<plugin>.<option>``."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        try:
            validate_topic(value)
        except Exception as exc:
            raise ConfigError(f"plugins.{plugin}.{attr.name}: {exc}") from exc

    return check


def options_or_default(context: PluginContext, plugin: str, options_type: type[OptionsT]) -> OptionsT:
    """The options the core built for ``plugin``, or ``options_type()`` when it has no table.

    A raw mapping (a core that passes the table through unchecked) is built into ``options_type``,
    so its validators still run.
    """
    options = context.options_for(plugin)
    if options is None:
        return options_type()
    if isinstance(options, Mapping):
        return options_type(**options)
    return options
