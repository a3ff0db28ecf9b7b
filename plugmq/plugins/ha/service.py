"""HaService: the ReplicationService of the ha plugin; a master side or a slave side by role, and
the switch between them when the cluster's election moves the master (failover)."""

from __future__ import annotations

import threading
from pathlib import Path

from plugmq.core import (
    BrokerRole,
    ReplicableStore,
    ReplicationCapabilities,
    ReplicationContext,
    ReplicationStatus,
    SendStatus,
)
from plugmq.core.contracts.leadership import Leadership
from plugmq.core.errors import ReadOnlyBrokerError, ReplicationError
from plugmq.core.logs import get_logger
from plugmq.plugins.ha.auth import Authenticator, derive_key, read_secret
from plugmq.plugins.ha.epochs import EpochFile
from plugmq.plugins.ha.master import MasterSide
from plugmq.plugins.ha.options import HaOptions
from plugmq.plugins.ha.slave import SlaveSide
from plugmq.plugins.ha.tls import TlsSettings

__all__ = ["CAPABILITIES", "HaService"]

log = get_logger(__name__)

CAPABILITIES = ReplicationCapabilities(sync_double_write=True, failover=True, replicates_state=True)


class HaService:
    """Replication over one TCP connection per slave (RocketMQ's HAService, HAConnection, HAClient),
    with epochs (RocketMQ 5's AutoSwitchHAService): ``promote`` and ``follow`` switch the role."""

    capabilities = CAPABILITIES

    def __init__(self, context: ReplicationContext, options: HaOptions, plugin_dir: Path) -> None:
        store = context.store
        if not isinstance(store, ReplicableStore):
            raise ReplicationError(f"broker {context.broker_name!r}: the store cannot ship its log (it is no "
                                   "ReplicableStore); use store_mmap, store_lmdb or store_rocks")
        self.role = context.role
        self.broker_id = context.broker_id
        self.store = store
        self._context = context
        self._options = options
        self._plugin_dir = plugin_dir
        self._epochs = EpochFile(plugin_dir / "epochs")
        self._secret = read_secret(options.secret_file) if options.secret_file else None
        self._auth = Authenticator(self._secret, context.broker_name) if self._secret is not None else None
        self._tls = (TlsSettings(options.tls_cert, options.tls_key, options.tls_ca, options.tls_server_name)
                     if options.tls else None)
        self._lock = threading.Lock()
        self._master: MasterSide | None = None
        self._slave: SlaveSide | None = None
        if context.role is BrokerRole.SLAVE:
            if options.master or not context.failover:
                self._slave = self._slave_of(options.master)  # without failover, a slave needs its master
        else:
            self._master = self._master_side(context.role)
        self._started = self._closed = False

    def _master_side(self, role: BrokerRole, leadership: Leadership | None = None) -> MasterSide:
        return MasterSide(self.store, self._options, broker_name=self._context.broker_name,
                          broker_id=self.broker_id, plugin_dir=self._plugin_dir, sync=role is BrokerRole.SYNC_MASTER,
                          epochs=self._epochs, adopt=self._context.adopt,
                          leadership=leadership, authenticator=self._auth, tls=self._tls)

    def _slave_of(self, master: str) -> SlaveSide:
        return SlaveSide(self.store, self._options, broker_name=self._context.broker_name,
                         broker_id=self._context.broker_id, replicated=self._context.replicated,
                         epochs=self._epochs, master=master, truncated=self._context.truncated,
                         handover=self._context.handover, handed_over=self._context.handed_over,
                         authenticator=self._auth, tls=self._tls)

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            master, slave = self._master, self._slave
        if master is not None:
            master.start()
        if slave is not None:
            slave.start()

    # ------------------------------------------------------------------------------ failover
    @property
    def led_epoch(self) -> int:
        return self._epochs.led_epoch

    @property
    def epoch(self) -> int:
        return self._epochs.last_epoch

    def promote(self, epoch: int, role: BrokerRole, leadership: Leadership | None = None) -> None:
        if not role.is_master:
            raise ReplicationError(f"promote needs a master role (async_master or sync_master), got {role.value!r}")
        with self._lock:
            if self._closed:
                raise ReplicationError("the replication service is closed")
            slave, self._slave = self._slave, None
        if slave is not None:
            slave.close()  # nothing more arrives from the old master: the log end is final now
        end = self.store.log_end_offset()
        if epoch > self._epochs.last_epoch:
            self._epochs.cut(end)
            self._epochs.begin(epoch, end)
        elif epoch < self._epochs.last_epoch:
            raise ReplicationError(f"cannot become master for epoch {epoch}: this log already knows epoch "
                                   f"{self._epochs.last_epoch} (a newer master was elected)")
        with self._lock:
            master = self._master
            fresh = master is None
            if master is None:
                master = self._master = self._master_side(role, leadership)
            elif leadership is not None:
                master.lead(leadership)
            master.sync = role is BrokerRole.SYNC_MASTER
            self.role = role
            started = self._started
        if fresh and started:
            master.start()
        log.info("replication: this broker is master", broker=self._context.broker_name, epoch=epoch,
                 mode=role.value, log_end=end, address=master.address)

    def follow(self, master: str) -> None:
        with self._lock:
            if self._closed:
                raise ReplicationError("the replication service is closed")
            current = self._slave
            if current is not None and current.address == master and self._master is None:
                return
            old_master, self._master = self._master, None
            old_slave, self._slave = self._slave, None
            self.role = BrokerRole.SLAVE
        if old_master is not None:
            old_master.close()  # sends waiting for a slave are answered now
        if old_slave is not None:
            old_slave.close()
        slave = self._slave_of(master)
        with self._lock:
            if self._closed or self._slave is not None:
                return
            self._slave = slave
            started = self._started
        if started:
            slave.start()
        log.info("replication: following a master", broker=self._context.broker_name, master=master,
                 epoch=self._epochs.last_epoch, log_end=self.store.log_end_offset())

    @property
    def caught_up(self) -> bool:
        with self._lock:
            master, slave = self._master, self._slave
        if master is not None:
            return True
        return slave is not None and slave.in_sync

    @property
    def in_sync_members(self) -> frozenset[int]:
        """The broker ids of this master's in-sync set (itself included); empty on a slave."""
        master = self._master
        return master.in_sync.members if master is not None else frozenset()

    @property
    def master_address(self) -> str:
        master = self._master
        return master.address if master is not None else ""

    def cluster_key(self, purpose: str) -> bytes | None:
        """A key for ``purpose`` derived from the cluster secret, the same on every broker of this
        broker name (so a promoted slave opens what its master sealed); None without a secret."""
        if self._secret is None:
            return None
        return derive_key(self._secret, purpose, self._context.broker_name)

    # ------------------------------------------------------------------------------ contract
    @property
    def address(self) -> str:
        """A master's bound replication address; a slave's master ("" before it follows one)."""
        master, slave = self._master, self._slave
        if master is not None:
            return master.address
        return slave.address if slave is not None else ""

    def await_replicated(self, end_offset: int) -> SendStatus:
        master = self._master
        if master is None:
            return SendStatus.SEND_OK  # demoted meanwhile: the broker answers the send
        return master.await_replicated(end_offset)

    # ------------------------------------------------------------------------------ commit point
    def committed_offset(self) -> int | None:
        master, slave = self._master, self._slave
        if master is not None:
            return master.committed_offset()
        end = self.store.log_end_offset()
        if not self._context.failover:
            return end  # no election ever cuts a slave's log: all of it stays
        return min(end, slave.master_commit) if slave is not None else None

    def admit_write(self) -> SendStatus:
        master = self._master
        if master is None:
            raise ReadOnlyBrokerError(f"broker {self._context.broker_name!r} (id {self.broker_id}) is a slave now: "
                                      "it takes no writes; send to its master")
        return master.admit_write()

    def await_committed(self, end_offset: int) -> bool:
        master = self._master
        return master.await_committed(end_offset) if master is not None else False

    def status(self) -> ReplicationStatus:
        end = self.store.log_end_offset()
        epoch = self._epochs.last_epoch
        master, slave = self._master, self._slave
        if master is not None:
            return ReplicationStatus(role=self.role, broker_id=self.broker_id, address=master.address, end_offset=end,
                                     confirmed_offset=master.confirmed_offset,
                                     slaves=master.slave_statuses(master.count_records), connected=True, epoch=epoch)
        if slave is None:
            return ReplicationStatus(role=BrokerRole.SLAVE, broker_id=self.broker_id, address="", end_offset=end,
                                     confirmed_offset=end, connected=False, epoch=epoch)
        return ReplicationStatus(role=BrokerRole.SLAVE, broker_id=self.broker_id, address=slave.address,
                                 end_offset=end, confirmed_offset=end, master_end_offset=slave.master_end,
                                 connected=slave.connected, epoch=epoch)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            master, slave = self._master, self._slave
        if master is not None:
            master.close()
        if slave is not None:
            slave.close()
