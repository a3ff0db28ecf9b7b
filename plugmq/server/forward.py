"""A failover broker that is not master passes its clients' requests on to the one that is.

The official clients keep a route for 30 s (the Python client refreshes it on that timer alone,
never on an error), so after a failover they keep talking to whichever broker of the name their
connection reaches. Routes list every live broker of the name in one Endpoints (the Python client
dials ``ipv4:a,b`` and gRPC keeps the first address that answers), and a broker that is not the
master forwards sends, receives and acks to the current master, as RocketMQ 5's proxy does: the
clients work again as soon as a master is elected, whichever address they reach.

A forwarded request carries ``x-plugmq-forwarded`` and is never forwarded again (two slaves with
stale views cannot bounce it). A master that does not answer is answered HA_NOT_AVAILABLE: the
client retries, and reaches the new master once the election is over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from plugmq.core.contracts import BrokerRole
from plugmq.core.logs import get_logger
from plugmq.server.protocol import Code, Status, service_pb2_grpc

if TYPE_CHECKING:
    from plugmq.server.cluster import ClusterMember

__all__ = ["FORWARDED_HEADER", "MasterForwarder"]

log = get_logger(__name__)

FORWARDED_HEADER = "x-plugmq-forwarded"
# Headers gRPC sets itself on every call: never copied onto the forwarded one.
_TRANSPORT_HEADERS = frozenset({"content-type", "user-agent", "te", "grpc-timeout", "grpc-encoding",
                                "grpc-accept-encoding", ":authority"})
_CALL_S = 10.0  # a forwarded call without a deadline of its own


class MasterForwarder:
    """Forwards to the live master of this broker's name while this broker is a failover slave."""

    def __init__(self, cluster: ClusterMember) -> None:
        self._broker = cluster.broker
        self._cluster = cluster
        self._channels: dict[str, grpc.aio.Channel] = {}

    def target(self, context: grpc.aio.ServicerContext) -> str | None:
        """The endpoint to forward this call to; None to answer it here.

        A slave forwards to the live master of its view. A master that is not sure it still leads
        (cut off ZooKeeper, or thawed after a pause: its view is stale) forwards to a failover
        peer: the one that was elected meanwhile, if any, answers; otherwise the peer refuses."""
        broker = self._broker
        if not broker.config.failover:
            return None
        if broker.role is BrokerRole.SLAVE:
            target = self._cluster.live_master()
        elif broker.commit.fenced():
            me = self._cluster.registration()
            target = next(iter(self._cluster.failover_peers(me)), None)
        else:
            return None
        if target is None or any(key == FORWARDED_HEADER for key, _ in context.invocation_metadata() or ()):
            return None
        return target.endpoint

    def _stub(self, endpoint: str) -> service_pb2_grpc.MessagingServiceStub:
        channel = self._channels.get(endpoint)
        if channel is None:
            channel = self._channels[endpoint] = grpc.aio.insecure_channel(
                endpoint, options=[("grpc.enable_retries", 0), ("grpc.max_receive_message_length", -1),
                                   ("grpc.max_send_message_length", -1)])
        return service_pb2_grpc.MessagingServiceStub(channel)

    @staticmethod
    def _call_options(context: grpc.aio.ServicerContext) -> dict[str, Any]:
        metadata = [(key, value) for key, value in context.invocation_metadata() or ()
                    if key not in _TRANSPORT_HEADERS and not key.startswith("grpc-")]
        metadata.append((FORWARDED_HEADER, "1"))
        remaining = context.time_remaining()
        return {"metadata": metadata, "timeout": remaining if remaining is not None else _CALL_S}

    async def unary(self, endpoint: str, method: str, request: Any, context: grpc.aio.ServicerContext,
                    failed: Callable[[Status], Any]) -> Any:
        """The master's answer to ``method(request)``; ``failed(status)`` when it gave none."""
        call = getattr(self._stub(endpoint), method)
        try:
            return await call(request, **self._call_options(context))
        except grpc.RpcError as exc:
            return failed(self._unanswered(endpoint, method, exc))

    async def stream(self, endpoint: str, method: str, request: Any, context: grpc.aio.ServicerContext,
                     failed: Callable[[Status], Any]) -> AsyncIterator[Any]:
        """The master's answers to a server-streaming ``method(request)``, one by one."""
        call = getattr(self._stub(endpoint), method)
        try:
            async for response in call(request, **self._call_options(context)):
                yield response
        except grpc.RpcError as exc:
            yield failed(self._unanswered(endpoint, method, exc))

    def _unanswered(self, endpoint: str, method: str, exc: grpc.RpcError) -> Status:
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        log.info("forwarding to the master failed", broker=self._broker.name, master=endpoint, method=method,
                 code=str(code))
        return Status(code=Code.HA_NOT_AVAILABLE,
                      message=f"broker {self._broker.name!r} is not the master of its name and its master at {endpoint}"
                              f" did not answer ({code}); retry: a new master is being elected")

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
