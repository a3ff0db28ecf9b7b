"""Server bootstrap: the gRPC server over a broker, clean shutdown on SIGINT/SIGTERM, a thread runner."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import attrs
import grpc

from plugmq.broker.broker import Broker
from plugmq.broker.ports import Served
from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.kit.fdlimit import open_descriptors, raise_open_file_limit
from plugmq.server.admin import AdminService
from plugmq.server.assignment import Assigner, ConsumerMembers
from plugmq.server.auth import Authenticator
from plugmq.server.cluster import ClusterMember, LocalRoutes, advertised_endpoint
from plugmq.server.frontend import GRPC_SOCKET, HANDOFF_SOCKET
from plugmq.server.handoff import serve_handoff
from plugmq.server.options import ServerOptions, load_serve_config
from plugmq.server.protocol import service_pb2, service_pb2_grpc
from plugmq.server.receipts import ReceiptSealer
from plugmq.server.send import CheckedSend
from plugmq.server.service import MessagingService
from plugmq.server.status import status_of
from plugmq.server.telemetry import Sessions
from plugmq.server.tls import warn_when_exposed
from plugmq.server.wakeup import Wakeup
from plugmq.server.workers import Frontends, remove_sockets, reserve_port, socket_dir

if TYPE_CHECKING:
    from plugmq.server.metrics import MetricsEndpoint

__all__ = ["PlugmqServer", "ServerThread", "run"]

log = get_logger(__name__)

class PlugmqServer:
    """MessagingService for one broker on one address. The caller owns (and closes) the broker."""

    def __init__(self, broker: Served, options: ServerOptions | None = None, *,
                 config_path: Path | None = None) -> None:
        self.broker = broker
        self.options = options or ServerOptions()
        self.config_path = config_path  # what front-end workers read their [server] options from
        self.frontends: Frontends | None = None
        self._handoff: asyncio.AbstractServer | None = None
        self._sockets: Path | None = None
        self.address: str | None = None
        self._server: grpc.aio.Server | None = None
        self.metrics: MetricsEndpoint | None = None
        self._stopped = False
        self.cluster: ClusterMember | None = None

    async def start(self, listen: str | None = None) -> str:
        """Bind (port 0 picks a free one), start serving; returns the bound ``host:port``."""
        loop = asyncio.get_running_loop()
        options = self.options
        listen = listen or options.listen
        # Checked before anything is opened: a bad allocation strategy or parameter is a config error.
        self.assigner = Assigner(self.broker.strategies, self.broker.config.groups,
                                 ConsumerMembers(self.broker.clock, self.broker.config.heartbeat_timeout_s))
        receipts = ReceiptSealer.for_broker(self.broker.data_dir, self.broker.replication)
        self.wakeup = Wakeup(loop)
        self.pop = self.broker.pop
        # Stored messages (sends, retries, DLQ copies, delayed and committed write-backs, replicated
        # records) and invisible times running out all wake consumers, and with them long polls.
        self.broker.arrival_listeners.append(self.wakeup.notify_threadsafe)
        self.sessions = Sessions(self.broker, options)
        self.executor = ThreadPoolExecutor(options.executor_threads, thread_name_prefix="plugmq-serve")
        limit = self.broker.config.max_message_size + (1 << 20)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", -1)])
        host = listen.rpartition(":")[0]
        error: RuntimeError | None = None
        self.auth = Authenticator(options.acl, self.broker.clock)
        reserved: socket.socket | None = None
        if options.workers > 1:  # the front-ends listen on the port; this process on its sockets
            if self.config_path is None:
                self._release()
                raise ConfigError("[server] workers > 1 needs the server's config file (plugmq serve --config)")
            reserved, self.address = reserve_port(listen)
            self._sockets = socket_dir()
            port = server.add_insecure_port(f"unix:{self._sockets / GRPC_SOCKET}")
        else:
            try:
                port = (server.add_secure_port(listen, options.tls.server_credentials()) if options.tls is not None
                        else server.add_insecure_port(listen))
            except RuntimeError as exc:
                port, error = 0, exc
            self.address = f"{host}:{port}"
        if not port:
            self._release()
            raise ConfigError(f"cannot listen on {listen!r} ({error or _why_not_listening()}); "
                              "pick another --listen host:port")
        if self.broker.cluster is not None:
            try:
                endpoint = advertised_endpoint(self.address, options.advertise)
            except ConfigError:
                self._release()
                raise
            self.cluster = ClusterMember(self.broker, self.broker.cluster, endpoint)
        self.service = MessagingService(self.broker, options, self.sessions, self.wakeup, self.executor, self.address,
                                        assigner=self.assigner, cluster=self.cluster, receipts=receipts, auth=self.auth,
                                        local=LocalRoutes(self.broker, options.advertise or self.address),
                                        max_batch_bytes=self.broker.config.max_message_size)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(self.service, server)
        server.add_generic_rpc_handlers((AdminService(self.broker, self.auth, self.executor,
                                                      clients=self.assigner.members).handler(),))
        if options.metrics_listen is not None:
            from plugmq.server.metrics import MetricsEndpoint  # prometheus_client: only when asked for

            try:
                self.metrics = MetricsEndpoint(self.broker, options.metrics_listen,
                                               options.tls if options.tls is not None and options.tls.metrics else None)
            except ConfigError:
                self._release()
                raise
        await server.start()
        self._server = server
        if reserved is not None:
            try:
                await self._start_workers()
            finally:
                reserved.close()  # the front-ends hold the port now
        self.assigner.members.start_pruning()
        self._warn_when_exposed()
        if self.cluster is not None:
            await loop.run_in_executor(self.executor, self.cluster.join)
        log.info("serving", address=self.address, broker=self.broker.name, data_dir=str(self.broker.data_dir),
                 acl=options.acl.enabled, tls=options.tls is not None, in_flight=self.pop.inflight_count())
        return self.address

    async def _start_workers(self) -> None:
        """The hand-off socket, then the front-end processes ([server] workers)."""
        assert self._sockets is not None and self.config_path is not None and self.address is not None
        self._handoff = await serve_handoff(str(self._sockets / HANDOFF_SOCKET), self._store_handed)
        # A failover broker forwards sends while it is not (surely) the master: only its own gRPC
        # service does that, so its front-ends relay sends instead of handing them over.
        self.frontends = Frontends(self.options.workers, self.config_path, self.address, self._sockets,
                                   self.broker.config.max_message_size, relay_sends=self.broker.config.failover)
        await self.frontends.start()

    def _store_handed(self, calls: list[CheckedSend]) -> list[bytes] | Awaitable[list[bytes]]:
        """Store the calls of one hand-off frame: each one's serialized SendMessageResponse, at once
        when the appends do not wait, else later (the send thread's next round stores them together)."""
        service = self.service
        try:
            if service.sends.stores_on_loop(calls, self.broker.sends_wait):
                return [response.SerializeToString() for response in service.sends.sender.store(calls)]
            waiting = [service.sends.submit(call) for call in calls]
        except Exception as exc:  # noqa: BLE001 - every call of the frame is answered with it
            return _failed_calls(exc, len(calls))
        return self._store_later(waiting)

    @staticmethod
    async def _store_later(waiting: list[asyncio.Future[service_pb2.SendMessageResponse]]) -> list[bytes]:
        try:
            answers = await asyncio.gather(*waiting)
        except Exception as exc:  # noqa: BLE001 - every call of the frame is answered with it
            return _failed_calls(exc, len(waiting))
        return [response.SerializeToString() for response in answers]

    def _warn_when_exposed(self) -> None:
        options = self.options
        tls = options.tls
        assert self.address is not None
        warn_when_exposed("gRPC port (messaging and admin)", self.address, tls=tls is not None,
                          authenticated=options.acl.enabled)
        if self.metrics is not None:
            metrics_tls = tls is not None and tls.metrics
            warn_when_exposed("metrics port", self.metrics.address, tls=metrics_tls,
                              authenticated=metrics_tls and tls is not None and tls.mutual)

    def reload_accounts(self) -> bool:
        """Read the ACL accounts again (SIGHUP), here and in the front-ends that check sends; False
        when the file is invalid (the old ones stay)."""
        if self.frontends is not None:
            self.frontends.signal(signal.SIGHUP)
        return self.auth.reload()

    async def stop(self, grace: float | None = None) -> None:
        """Finish in-flight calls (up to ``grace`` seconds), then release everything but the broker."""
        if self._stopped or self._server is None:
            return
        self._stopped = True
        if self.cluster is not None:
            # Out of the routes first, so clients move to the other brokers while calls finish.
            await asyncio.get_running_loop().run_in_executor(self.executor, self.cluster.leave)
        self.service.stopping.set()
        self.wakeup.notify()  # long polls answer now instead of at their deadline
        grace_s = self.options.shutdown_grace_s if grace is None else grace
        if self.frontends is not None:
            await self.frontends.stop(grace_s)  # their calls in flight still reach this process
        if self._handoff is not None:
            self._handoff.close()
            await self._handoff.wait_closed()
        await self._server.stop(grace_s)
        if self.service.forward is not None:
            await self.service.forward.close()
        self._release()
        log.info("server stopped", address=self.address)

    def _release(self) -> None:
        self.assigner.members.stop_pruning()
        if getattr(self, "auth", None) is not None:
            self.auth.close()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        service: MessagingService | None = getattr(self, "service", None)
        if service is not None:
            service.sends.close()
            service.acks.close()
        if self.wakeup.notify_threadsafe in self.broker.arrival_listeners:
            self.broker.arrival_listeners.remove(self.wakeup.notify_threadsafe)
        self.executor.shutdown(wait=True)
        self.sessions.close_all()
        if self._sockets is not None:
            remove_sockets(self._sockets)
            self._sockets = None


def _failed_calls(exc: BaseException, count: int) -> list[bytes]:
    return [service_pb2.SendMessageResponse(status=status_of(exc, action="send")).SerializeToString()] * count


def _why_not_listening() -> str:
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    held = open_descriptors()
    if held is not None and held >= soft - 2:
        return (f"no descriptor left for the listening socket: {held} open of RLIMIT_NOFILE {soft}; raise the "
                "limit (ulimit -n, LimitNOFILE=)")
    return "address in use or not local"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None where that is not known."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")


async def _serve(broker_config: Mapping[str, Any], options: ServerOptions,
                 ready: Callable[[str, Broker], None], config_path: Path) -> None:
    loaded_s = process_age_s()  # interpreter start and imports
    began = time.perf_counter()
    broker = await asyncio.to_thread(Broker.from_config, broker_config)  # store recovery may take a while
    opened = time.perf_counter()
    server = PlugmqServer(broker, options, config_path=config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, server.reload_accounts))
    try:
        address = await server.start()
        log.info("start-up", imports_s=None if loaded_s is None else round(loaded_s, 3),
                 broker_open_s=round(opened - began, 3), server_start_s=round(time.perf_counter() - opened, 3),
                 total_s=None if (age := process_age_s()) is None else round(age, 3))
        ready(address, broker)
        await stop.wait()
        log.info("shutting down on signal")
    finally:
        await server.stop()
        await asyncio.to_thread(broker.close)  # flushes the store


def run(config_path: str | Path, listen: str | None = None,
        ready: Callable[[str, Broker], None] = lambda _address, _broker: None) -> None:
    """``plugmq serve``: serve the broker of ``config_path`` until SIGINT or SIGTERM."""
    broker_config, options = load_serve_config(config_path)
    raise_open_file_limit()
    if listen:
        options = attrs.evolve(options, listen=listen)
    asyncio.run(_serve(broker_config, options, ready, Path(config_path)))


def _drain(loop: asyncio.AbstractEventLoop) -> None:
    """Let the tasks cancelled by the shutdown finish, then close the loop."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


class ServerThread:
    """A server on its own event loop in a background thread (tests, benchmarks, embedding)."""

    def __init__(self, broker: Served, options: ServerOptions | None = None, listen: str = "127.0.0.1:0") -> None:
        self.server = PlugmqServer(broker, options)
        self._listen = listen
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="plugmq-serve-loop", daemon=True)

    def start(self) -> str:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(self._listen), self._loop).result(timeout=30)

    def stop(self, grace: float | None = 1.0) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result(timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            _drain(self._loop)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
