"""HaService: the ReplicationService of the ha plugin, a master side or a slave side by role."""

from __future__ import annotations

from pathlib import Path

from plugmq.core import (
    BrokerRole,
    ReplicableStore,
    ReplicationCapabilities,
    ReplicationContext,
    ReplicationError,
    ReplicationStatus,
    SendStatus,
)
from plugmq.plugins.ha.master import MasterSide
from plugmq.plugins.ha.options import HaOptions
from plugmq.plugins.ha.slave import SlaveSide

__all__ = ["CAPABILITIES", "HaService"]

CAPABILITIES = ReplicationCapabilities(sync_double_write=True, failover=False, replicates_state=False)


class HaService:
    """Replication over one TCP connection per slave (RocketMQ's HAService, HAConnection, HAClient)."""

    capabilities = CAPABILITIES

    def __init__(self, context: ReplicationContext, options: HaOptions, plugin_dir: Path) -> None:
        store = context.store
        if not isinstance(store, ReplicableStore):
            raise ReplicationError(f"broker {context.broker_name!r}: the store cannot ship its log (it is no "
                                   "ReplicableStore); use store_mmap, store_lmdb or store_rocks")
        self.role = context.role
        self.broker_id = context.broker_id
        self.store = store
        self._master: MasterSide | None = None
        self._slave: SlaveSide | None = None
        if context.role is BrokerRole.SLAVE:
            self._slave = SlaveSide(store, options, broker_name=context.broker_name, broker_id=context.broker_id,
                                    replicated=context.replicated)
        else:
            self._master = MasterSide(store, options, broker_name=context.broker_name, plugin_dir=plugin_dir,
                                      sync=context.role is BrokerRole.SYNC_MASTER)
        self._started = self._closed = False

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._master is not None:
            self._master.start()
        if self._slave is not None:
            self._slave.start()

    @property
    def address(self) -> str:
        """A master's bound replication address; a slave's master."""
        if self._master is not None:
            return self._master.address
        assert self._slave is not None
        return self._slave.address

    def await_replicated(self, end_offset: int) -> SendStatus:
        master = self._master
        if master is None or not master.sync:
            return SendStatus.SEND_OK
        return master.await_replicated(end_offset)

    def status(self) -> ReplicationStatus:
        end = self.store.log_end_offset()
        if self._master is not None:
            master = self._master
            return ReplicationStatus(role=self.role, broker_id=self.broker_id, address=master.address, end_offset=end,
                                     confirmed_offset=master.confirmed_offset,
                                     slaves=master.slave_statuses(master.count_records), connected=True)
        assert self._slave is not None
        slave = self._slave
        return ReplicationStatus(role=self.role, broker_id=self.broker_id, address=slave.address, end_offset=end,
                                 confirmed_offset=end, master_end_offset=slave.master_end, connected=slave.connected)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._master is not None:
            self._master.close()
        if self._slave is not None:
            self._slave.close()
