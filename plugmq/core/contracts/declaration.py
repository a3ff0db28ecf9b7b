"""Declaration and contexts: who a plugin is, and what every factory hook gets.

``plugmq_declare`` returns a :class:`PluginDeclaration`; every factory hook gets a
:class:`PluginContext` (or a family's subclass of it). :class:`CleansExpired` is the one
capability several families share: the broker's retention rounds call it on the store and on
the delay and transaction services.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from plugmq.core.clock import Clock
from plugmq.core.retention import RetentionFloor

__all__ = [
    "SYSTEM_RECORD_HEADROOM",
    "CleansExpired",
    "Family",
    "PluginContext",
    "PluginDeclaration",
]


class Family(enum.Enum):
    """The plugin families and how many plugins of each a broker may hold."""

    STORAGE = "storage"  # exactly one
    DELAY = "delay"  # zero or one
    FILTER = "filter"  # any number, keyed by expression type
    ALLOCATION = "allocation"  # any number, keyed by strategy name
    TRANSACTION = "transaction"  # zero or one
    EVENTS = "events"  # any number
    CLUSTER = "cluster"  # zero or one
    REPLICATION = "replication"  # zero or one


def _families(value: Iterable[Family]) -> frozenset[Family]:
    return frozenset(value)


@attrs.frozen
class PluginDeclaration:
    """What a plugin says about itself (returned by ``plugmq_declare``).

    ``name`` must equal the plugin's entry-point name. ``families``: any iterable of
    :class:`Family` (a set literal is fine). ``capabilities`` is the family's capability value
    (for keyed families, a mapping key -> capability value).

    ``options`` is an attrs class whose fields are the keys allowed in the plugin's
    ``[plugins.<name>]`` config table (None: the plugin takes no options). Every field has a
    default and a type annotation; the core checks each value against the annotation before the
    class is built, so validators only see values of the declared type. Validators (attrs'
    own, or functions raising ValueError / TypeError / ConfigError) say what else a value must
    satisfy, in words a user can act on; ``metadata={"expected": "..."}`` words the expectation
    when the type does not. The core reports any failure as one ConfigError naming the plugin,
    the key, the value and what is expected (``plugmq.core.plugin_options``).
    """

    name: str
    families: frozenset[Family] = attrs.field(converter=_families)
    description: str = ""
    options: type | None = None
    capabilities: Any = None


SYSTEM_RECORD_HEADROOM = 1024 * 1024
"""How much larger than a client body a broker-written record may be (see PluginContext)."""


@attrs.frozen
class PluginContext:
    """What a component factory gets: the broker's identity, its clock, where its files go.

    ``options`` maps plugin name -> that plugin's validated options object; a plugin reads its own
    with ``context.options_for("store_mmap")``. ``plugin_dir(name)`` is the directory a plugin
    owns under the broker's data dir (created on first use).

    ``retention`` (None outside a broker) is the floor retention never cleans below: a store asks
    ``retention.lowest()`` for the lowest commit-log offset a consumer group or a service still
    needs; a service that keeps messages in the store registers what it needs with
    ``retention.hold(name, source)``.

    ``max_message_size`` is the broker's limit for a client's message body (the broker checks it
    before a store sees the message). ``store_body_limit`` is the largest body a store must accept:
    larger by ``SYSTEM_RECORD_HEADROOM``, because the broker's own records (state snapshot parts,
    delay intents that wrap a whole client message) go into the same store.
    """

    broker_name: str
    data_dir: Path
    clock: Clock
    store_host: str = "127.0.0.1:10911"
    max_message_size: int = 4 * 1024 * 1024
    options: Mapping[str, Any] = attrs.field(factory=dict)
    retention: RetentionFloor | None = None
    store_body_limit: int = attrs.field()

    @store_body_limit.default
    def _client_limit_plus_headroom(self) -> int:
        return self.max_message_size + SYSTEM_RECORD_HEADROOM

    def options_for(self, plugin: str) -> Any:
        return self.options.get(plugin)

    def plugin_dir(self, plugin: str) -> Path:
        path = self.data_dir / plugin
        path.mkdir(parents=True, exist_ok=True)
        return path


@runtime_checkable
class CleansExpired(Protocol):
    """A component with files of its own that retention removes once nothing needs them.

    The store, the delay scheduler and the transaction service all have it; the broker's retention
    rounds call it every few seconds of its clock (see each family's ``clean_expired``).
    """

    def clean_expired(self, now_ms: int) -> int:
        """Remove what is no longer needed at ``now_ms``; return how many files went."""
