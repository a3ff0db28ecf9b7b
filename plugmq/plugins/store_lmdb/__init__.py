"""store_lmdb: the MessageStore contract on LMDB (py ``lmdb``).

One environment, named databases for records, consume queues, key index and queue state; every
group of concurrent appends is one write transaction. Options: :class:`LmdbOptions`.
"""

from __future__ import annotations

from plugmq.core import Family, MessageStore, PluginContext, PluginDeclaration, hookimpl
from plugmq.kit.options import options_or_default
from plugmq.plugins.store_lmdb.options import LmdbOptions
from plugmq.plugins.store_lmdb.store import CAPABILITIES, LmdbStore

__all__ = ["LmdbOptions", "LmdbStore", "plugmq_declare", "plugmq_make_store"]

NAME = "store_lmdb"


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=NAME,
        families={Family.STORAGE},
        description="message store on LMDB: one transaction per group commit, sorted-key consume queues",
        options=LmdbOptions,
        capabilities=CAPABILITIES,
    )


@hookimpl
def plugmq_make_store(context: PluginContext) -> MessageStore | None:
    return LmdbStore(context, options_or_default(context, NAME, LmdbOptions), plugin_name=NAME)
