"""store_mmap: the default message store - RocketMQ's commit log, consume queues and index files
on mmap'ed segment files. See ``store.py`` for the layout and ``record.py`` for the record format."""

from __future__ import annotations

from collections.abc import Mapping

from plugmq.core import Family, MessageStore, PluginContext, PluginDeclaration, hookimpl
from plugmq.plugins.store_mmap.options import MmapStoreOptions
from plugmq.plugins.store_mmap.store import CAPABILITIES, MmapMessageStore

__all__ = ["MmapMessageStore", "MmapStoreOptions", "plugmq_declare", "plugmq_make_store"]

NAME = "store_mmap"


@hookimpl
def plugmq_declare() -> PluginDeclaration:
    return PluginDeclaration(
        name=NAME,
        families={Family.STORAGE},
        description="commit log + consume queues + index files on mmap'ed segments (RocketMQ's design)",
        options=MmapStoreOptions,
        capabilities=CAPABILITIES,
    )


@hookimpl
def plugmq_make_store(context: PluginContext) -> MessageStore | None:
    options = context.options_for(NAME)
    if options is None:
        options = MmapStoreOptions()
    elif isinstance(options, Mapping):  # a raw config table, if the core passes one through
        options = MmapStoreOptions(**options)
    return MmapMessageStore(
        context.plugin_dir(NAME),
        options,
        clock=context.clock,
        store_host=context.store_host,
        max_message_size=context.store_body_limit,
        retention=context.retention,
    )
