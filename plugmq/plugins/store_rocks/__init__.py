"""store_rocks: the MessageStore contract on RocksDB (``rocksdict``, raw mode).

Column families for records, consume queues, key index and queue state; every group of
concurrent appends is one atomic WriteBatch. Options: :class:`RocksOptions`.
"""

from __future__ import annotations

from plugmq.core import Family, MessageStore, PluginContext, PluginDeclaration, hookimpl
from plugmq.kit.options import options_or_default
from plugmq.plugins.store_rocks.options import RocksOptions
from plugmq.plugins.store_rocks.store import CAPABILITIES, RocksStore

__all__ = ["RocksOptions", "RocksStore", "plugmq_declare", "plugmq_make_store"]

NAME = "store_rocks"


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=NAME,
        families={Family.STORAGE},
        description="message store on RocksDB: one WriteBatch per group commit, sorted-key consume queues",
        options=RocksOptions,
        capabilities=CAPABILITIES,
    )


@hookimpl
def plugmq_make_store(context: PluginContext) -> MessageStore | None:
    return RocksStore(context, options_or_default(context, NAME, RocksOptions), plugin_name=NAME)
