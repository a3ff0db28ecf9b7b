"""A front-end worker process of ``plugmq serve`` (``[server] workers = N``).

It listens on the server's port beside the other front-ends (gRPC sets SO_REUSEPORT, so the
kernel spreads the clients' connections over them) and never opens the broker:

* SendMessage calls are decoded and checked here (fields, signature, the right to publish) and
  handed to the process that owns the store over the hand-off socket (plugmq.server.handoff);
  the owner stores them through the same Sender as its own calls (rate limits, dedup windows,
  RecentSends, fencing, the wait for a slave) and its serialized answer goes back as it is;
* every other call (routes, receives, acks, telemetry streams, admin verbs) is relayed, as
  bytes and with its metadata, to the owner's gRPC server on a Unix socket. So are sends when
  the broker has ``failover = true`` (``RELAY_SENDS`` 1): a failover slave, or a master not sure
  it still leads, forwards them to the master of its name (plugmq.server.forward), which only
  the owner's gRPC service knows how to do.

Run by the owner as ``main([CONFIG, LISTEN, SOCKET_DIR, MAX_BODY, RELAY_SENDS])`` in a new interpreter; it
prints one line ``plugmq serve worker: listening on HOST:PORT`` once it serves, and exits on
SIGTERM (after its calls finish) or when the owner's hand-off socket closes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import grpc

from plugmq.core.clock import SystemClock
from plugmq.server.auth import Authenticator
from plugmq.server.handoff import HandoffClient
from plugmq.server.options import ServerOptions, load_serve_config
from plugmq.server.protocol import Code, service_pb2
from plugmq.server.send import check_messages
from plugmq.server.status import status_of

__all__ = ["GRPC_SOCKET", "HANDOFF_SOCKET", "main", "serve_frontend"]

GRPC_SOCKET = "grpc.sock"
HANDOFF_SOCKET = "sends.sock"
CLIENT_ID_HEADER = "x-mq-client-id"
_SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
_SEND = f"/{_SERVICE.full_name}/SendMessage"
_STREAMING = {f"/{_SERVICE.full_name}/{m.name}": (m.client_streaming, m.server_streaming) for m in _SERVICE.methods}


def _same(raw: bytes) -> bytes:
    return raw


def _header(metadata: Any, name: str) -> str:
    for key, value in metadata or ():
        if key == name and isinstance(value, str):
            return value
    return ""


def grpc_limits(max_body: int) -> list[tuple[str, int]]:
    """The options every gRPC server and relay channel of ``plugmq serve`` shares."""
    return [("grpc.max_receive_message_length", max_body + (1 << 20)), ("grpc.max_send_message_length", -1)]


class _Relay(grpc.GenericRpcHandler):
    """SendMessage checked here and handed over; every other method relayed to the owner."""

    def __init__(self, owner: grpc.aio.Channel, handoff: HandoffClient, auth: Authenticator, max_body: int, *,
                 relay_sends: bool) -> None:
        self._owner = owner
        self._relay_sends = relay_sends
        self._handoff = handoff
        self._auth = auth
        self._max_body = max_body
        self._send = grpc.unary_unary_rpc_method_handler(self._send_message,
                                                         request_deserializer=service_pb2.SendMessageRequest.FromString,
                                                         response_serializer=_same)
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method == _SEND and not self._relay_sends:
            return self._send
        handler = self._handlers.get(method)
        if handler is None:
            handler = self._handlers[method] = self._relay(method)
        return handler

    def _relay(self, method: str) -> grpc.RpcMethodHandler:
        client_streaming, server_streaming = _STREAMING.get(method, (False, False))  # admin verbs are unary
        options = {"request_deserializer": _same, "response_serializer": _same}
        if client_streaming and server_streaming:
            call = self._owner.stream_stream(method, request_serializer=_same, response_deserializer=_same)
            return grpc.stream_stream_rpc_method_handler(_streams(call), **options)
        if server_streaming:
            stream = self._owner.unary_stream(method, request_serializer=_same, response_deserializer=_same)
            return grpc.unary_stream_rpc_method_handler(_streams(stream), **options)
        unary = self._owner.unary_unary(method, request_serializer=_same, response_deserializer=_same)

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await unary(request, metadata=context.invocation_metadata(), timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
                raise  # abort raises; this satisfies the type checker

        return grpc.unary_unary_rpc_method_handler(relay, **options)

    async def _send_message(self, request: service_pb2.SendMessageRequest, context: grpc.aio.ServicerContext) -> bytes:
        try:
            account = (self._auth.account({k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)})
                       if self._auth.enabled else None)
            if not request.messages:
                raise ValueError("SendMessageRequest holds no message")
            checked = check_messages(request.messages, account, self._auth, self._max_body)
            if checked.transactional:  # the client's session answers its transaction checks
                checked = attrs.evolve(checked, client_id=_header(context.invocation_metadata(), CLIENT_ID_HEADER))
            return await self._handoff.send(checked)
        except ValueError as exc:
            return service_pb2.SendMessageResponse(status={"code": Code.BAD_REQUEST, "message": str(exc)}) \
                .SerializeToString()
        except Exception as exc:  # noqa: BLE001 - answered as a protocol status
            return service_pb2.SendMessageResponse(status=status_of(exc, action="send")).SerializeToString()


def _streams(call: Callable[..., Any]) -> Callable[..., AsyncIterator[bytes]]:
    """A relay of a streaming method: the owner's answers passed on as they come."""
    async def relay(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        try:
            async for answer in call(request, metadata=context.invocation_metadata(), timeout=context.time_remaining()):
                yield answer
        except grpc.aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
    return relay


async def serve_frontend(options: ServerOptions, listen: str, socket_dir: str, max_body: int,
                         ready: Callable[[str], None], *, relay_sends: bool = False) -> None:
    """Serve ``listen`` until SIGTERM / SIGINT or until the owner's hand-off closes;
    ``relay_sends``: sends go to the owner's gRPC service too (a failover broker forwards them)."""
    handoff = await HandoffClient.connect(f"{socket_dir}/{HANDOFF_SOCKET}")
    owner = grpc.aio.insecure_channel(f"unix:{socket_dir}/{GRPC_SOCKET}", options=grpc_limits(max_body))
    auth = Authenticator(options.acl, SystemClock())
    server = grpc.aio.server(options=grpc_limits(max_body))
    server.add_generic_rpc_handlers((_Relay(owner, handoff, auth, max_body, relay_sends=relay_sends),))
    port = (server.add_secure_port(listen, options.tls.server_credentials()) if options.tls is not None
            else server.add_insecure_port(listen))
    if not port:
        raise SystemExit(f"plugmq serve worker: cannot listen on {listen}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, auth.reload)
    ready(f"{listen.rpartition(':')[0]}:{port}")
    stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    owner_gone: asyncio.Future[Any] = handoff.closed
    await asyncio.wait((stopping, owner_gone), return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    await server.stop(options.shutdown_grace_s)
    await handoff.close()
    await owner.close()
    auth.close()


def main(argv: list[str] | None = None) -> None:
    config, listen, socket_dir, max_body, relay_sends = (argv if argv is not None else sys.argv[1:])[:5]
    _broker, options = load_serve_config(config)

    def ready(address: str) -> None:
        print(f"plugmq serve worker: listening on {address}", flush=True)

    asyncio.run(serve_frontend(options, listen, socket_dir, int(max_body), ready, relay_sends=relay_sends == "1"))


if __name__ == "__main__":
    main()
