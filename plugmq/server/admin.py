"""The admin endpoint of ``plugmq serve``, and the client ``plugmq admin --server`` uses.

A second gRPC service on the server's own port, ``plugmq.admin.v1.Admin``, one unary method per
verb of :mod:`plugmq.admin` (``topic-list`` is ``/plugmq.admin.v1.Admin/TopicList``), with a
JSON object in and the verb's JSON result out through grpc's generic handlers: no .proto, no
generated code, no second listener. Why gRPC on the same port rather than HTTP: operators open
and protect one port, and the endpoint reuses the server's access control as it stands: with
``[server.acl] enabled`` a call must carry the RocketMQ 5 client signature (HMAC-SHA1 of
``x-mq-date-time`` with the account's secret) of an account with ``admin = true``.

Failures are gRPC status codes with the broker's message: INVALID_ARGUMENT (bad input),
NOT_FOUND (no such topic), UNAUTHENTICATED / PERMISSION_DENIED (access control),
RESOURCE_EXHAUSTED (disk full), FAILED_PRECONDITION (other refusals), INTERNAL (a bug: logged
with its traceback).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from hashlib import sha1
from typing import TYPE_CHECKING, Any

import grpc

from plugmq.core.errors import (
    ClientError,
    ConfigError,
    DescriptorLimitError,
    PlugmqError,
    StoreFullError,
    TopicError,
    ValidationError,
)
from plugmq.core.logs import get_logger
from plugmq.server.auth import DATE_FORMAT, DATE_HEADER, Authenticator
from plugmq.server.status import RpcFailure
from plugmq.server.tls import ClientTls

if TYPE_CHECKING:
    from plugmq.admin import BrokerAdmin
    from plugmq.admin.cluster import ClusterAdmin
    from plugmq.admin.insight import ClientDirectory
    from plugmq.broker.ports import Served

__all__ = ["SERVICE", "AdminClient", "AdminService", "method_name"]

log = get_logger(__name__)

SERVICE = "plugmq.admin.v1.Admin"
_TIMEOUT_S = 60.0


def method_name(verb: str) -> str:
    """``topic-list`` -> ``TopicList``."""
    return "".join(part.capitalize() for part in verb.split("-"))


def _verbs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The broker verbs and the cluster verbs. plugmq.admin loads here, on the first admin call:
    ``plugmq serve`` answers its clients before it has paid for the admin values and operations."""
    from plugmq.admin import VERBS
    from plugmq.admin.cluster import CLUSTER_VERBS

    return tuple(VERBS), tuple(CLUSTER_VERBS)


MAX_REQUEST_BYTES = 1 << 20
MAX_JSON_DEPTH = 32


def _depth(value: Any) -> int:
    """How deeply ``value``'s lists and objects nest (walked without recursion)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > MAX_JSON_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def _decode(data: bytes) -> Any:
    """The request's JSON; ValidationError (INVALID_ARGUMENT) when it is not JSON, too big or too deep."""
    if len(data) > MAX_REQUEST_BYTES:
        raise ValidationError(f"the admin request is {len(data):,} bytes; the limit is {MAX_REQUEST_BYTES:,}")
    try:
        value = json.loads(data) if data else {}
    except RecursionError:
        raise ValidationError(f"the admin request's JSON nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise ValidationError(f"the admin request is not JSON ({exc})") from exc
    if _depth(value) > MAX_JSON_DEPTH:
        raise ValidationError(f"the admin request's JSON nests deeper than {MAX_JSON_DEPTH} levels")
    return value


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _code_of(exc: PlugmqError) -> grpc.StatusCode:
    if isinstance(exc, ValidationError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, TopicError) and "does not exist" in str(exc):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, (StoreFullError, DescriptorLimitError)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.FAILED_PRECONDITION


class AdminService:
    """The admin verbs of one broker as a gRPC service (run on the server's thread pool)."""

    def __init__(self, broker: Served, auth: Authenticator, executor: ThreadPoolExecutor,
                 clients: ClientDirectory | None = None) -> None:
        self._broker = broker
        self._clients = clients
        self._admins: tuple[BrokerAdmin, ClusterAdmin | None] | None = None
        self._auth = auth
        self._executor = executor

    @property
    def admin(self) -> BrokerAdmin:
        return self._load()[0]

    @property
    def cluster_admin(self) -> ClusterAdmin | None:
        return self._load()[1]

    def _load(self) -> tuple[BrokerAdmin, ClusterAdmin | None]:
        if self._admins is None:  # a race builds two equal pairs; one wins, both work
            from plugmq.admin import BrokerAdmin
            from plugmq.admin.cluster import ClusterAdmin

            broker = self._broker
            cluster_name = broker.config.cluster_name
            self._admins = (BrokerAdmin(broker, self._clients),
                            ClusterAdmin(broker.cluster, cluster_name, clock=broker.clock)
                            if broker.cluster is not None and cluster_name is not None else None)
        return self._admins

    def handler(self) -> grpc.GenericRpcHandler:
        return _AdminHandler(self)

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        broker_verbs, cluster_verbs = _verbs()
        return {
            method_name(verb): grpc.unary_unary_rpc_method_handler(
                self._method(verb), request_deserializer=bytes, response_serializer=_encode)
            for verb in (*broker_verbs, *cluster_verbs)
        }

    def _check_access(self, context: grpc.aio.ServicerContext) -> None:
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        account = self._auth.account(metadata)  # RpcFailure(UNAUTHORIZED) when the signature is wrong
        if account is not None and not account.admin:
            raise PermissionError(f"access key {account.access_key!r} may not administer this broker; set "
                                  f"admin = true in [server.acl.accounts.{account.access_key}]")

    def _run(self, verb: str, args: Any) -> Any:
        from plugmq.admin import execute
        from plugmq.admin.cluster import CLUSTER_VERBS, execute_cluster

        if verb not in CLUSTER_VERBS:
            return execute(self.admin, verb, args)
        if self.cluster_admin is None:
            raise ConfigError(f"{verb}: this broker is not in a cluster (its config has no [cluster] name and "
                              "cluster plugin); ask a broker of the cluster, or use --config with its config")
        return execute_cluster(self.cluster_admin, verb, args)

    def _method(self, verb: str) -> Callable[[bytes, grpc.aio.ServicerContext], Any]:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                self._check_access(context)
                args = _decode(request)
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._executor, self._run, verb, args)
            except RpcFailure as exc:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            except PermissionError as exc:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            except PlugmqError as exc:
                await context.abort(_code_of(exc), str(exc))
            except Exception as exc:  # a bug: the caller gets one line, the log the traceback
                log.exception("admin verb failed", verb=verb)
                await context.abort(grpc.StatusCode.INTERNAL,
                                    f"{verb} failed with an internal error ({type(exc).__name__}: {exc}); "
                                    "the server log has the traceback")
        return call


class _AdminHandler(grpc.GenericRpcHandler):
    """Routes ``/plugmq.admin.v1.Admin/<Verb>`` calls; builds the method table on the first such call."""

    def __init__(self, service: AdminService) -> None:
        self._service = service
        self._methods: dict[str, grpc.RpcMethodHandler] | None = None

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        service, _, method = str(getattr(handler_call_details, "method", "")).lstrip("/").partition("/")
        if service != SERVICE:
            return None  # another service's call: the next handler's
        if self._methods is None:
            self._methods = self._service.method_handlers()
        return self._methods.get(method)


def signature_metadata(access_key: str, secret_key: str, date: str | None = None) -> list[tuple[str, str]]:
    """The RocketMQ 5 client's request signature, which the server's access control checks
    (signed now, or over the ``x-mq-date-time`` given)."""
    date = date if date is not None else datetime.now(UTC).strftime(DATE_FORMAT)
    signature = hmac.new(secret_key.encode(), date.encode(), sha1).hexdigest()
    return [(DATE_HEADER, date),
            ("authorization", f"MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders={DATE_HEADER}, "
                              f"Signature={signature}")]


class AdminClient:
    """Calls the admin verbs of a running ``plugmq serve`` at ``address`` (``host:port``)."""

    def __init__(self, address: str, *, access_key: str | None = None, secret_key: str | None = None,
                 timeout_s: float = _TIMEOUT_S, channel_credentials: grpc.ChannelCredentials | None = None,
                 tls: ClientTls | None = None) -> None:
        """``tls``: reach a server with ``[server.tls]`` (its CA, a client certificate for mutual TLS);
        ``channel_credentials``: the same as gRPC credentials made by the caller. Plaintext without."""
        if (access_key is None) != (secret_key is None):
            raise ValidationError("give both an access key and a secret key, or neither")
        self.address = address
        self._credentials = (access_key, secret_key) if access_key is not None and secret_key is not None else None
        self._timeout = timeout_s
        if tls is not None and channel_credentials is not None:
            raise ValidationError("give tls or channel_credentials, not both")
        self._channel = (grpc.secure_channel(address, tls.channel_credentials(), options=tls.channel_options())
                         if tls is not None else grpc.secure_channel(address, channel_credentials)
                         if channel_credentials is not None else grpc.insecure_channel(address))

    def call(self, verb: str, args: Mapping[str, Any]) -> Any:
        broker_verbs, cluster_verbs = _verbs()
        if verb not in broker_verbs and verb not in cluster_verbs:
            raise ValidationError(f"admin verb {verb!r} is unknown; known: {', '.join([*broker_verbs, *cluster_verbs])}")
        stub = self._channel.unary_unary(f"/{SERVICE}/{method_name(verb)}", request_serializer=_encode,
                                         response_deserializer=json.loads)
        metadata = signature_metadata(*self._credentials) if self._credentials else []
        try:
            return stub(dict(args), timeout=self._timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise _error_of(exc, self.address) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error_of(exc: grpc.RpcError, address: str) -> PlugmqError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ValidationError(details)
    if code is grpc.StatusCode.NOT_FOUND:
        return TopicError(details)
    if code is grpc.StatusCode.UNAVAILABLE:
        return ClientError(f"cannot reach plugmq serve at {address} ({details}); is it running, and is that its "
                           "--listen address? (a server with [server.tls] needs --tls-ca; one without, no TLS "
                           "options)")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return ClientError(f"the server at {address} has no plugmq admin endpoint (an older plugmq, or not "
                           "plugmq serve)")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return ClientError(f"plugmq serve at {address} did not answer within the timeout")
    return ClientError(details)
