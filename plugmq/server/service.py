"""The MessagingService servicer: each RPC the RocketMQ 5 clients use, over one plugmq broker.

Broker work runs on a thread pool (the store may fsync); the event loop only waits. Every
failure is answered in the response's ``status`` with a protocol code, never a bare gRPC error.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import attrs
import grpc

from plugmq.broker.ports import Serving
from plugmq.broker.routes import RoutedQueue
from plugmq.client.values import ReceivedMessage
from plugmq.core.contracts import BrokerRegistration, ClusterView, TopicPermission, TransactionDecision
from plugmq.core.errors import InvalidNameError, RateLimitedError, TopicError
from plugmq.core.logs import get_logger
from plugmq.core.message import DEFAULT_MAX_BODY_SIZE
from plugmq.core.modes import ConsumeFrom
from plugmq.core.names import DLQ_PREFIX, is_system_topic, validate_group
from plugmq.server.assignment import Assigner, access_point_address
from plugmq.server.auth import Authenticator
from plugmq.server.cluster import ClusterMember, LocalRoutes
from plugmq.server.convert import to_proto, topic_name
from plugmq.server.forward import MasterForwarder
from plugmq.server.options import Account, ServerOptions
from plugmq.server.protocol import (
    ClientType,
    Code,
    MessageType,
    Permission,
    Status,
    TransactionResolution,
    TransactionSource,
    definition_pb2,
    service_pb2,
    service_pb2_grpc,
)
from plugmq.server.receipts import ReceiptSealer
from plugmq.server.send import Sender, check_messages
from plugmq.server.sendworker import SendWorker
from plugmq.server.status import RpcFailure, failure_of, ok, overall, status_of
from plugmq.server.subscriptions import Subscriptions
from plugmq.server.telemetry import Session, Sessions
from plugmq.server.wakeup import Wakeup
from plugmq.server.worker import LoopWorker

__all__ = ["MessagingService"]

log = get_logger(__name__)

T = TypeVar("T")
_ALL_TYPES = (MessageType.NORMAL, MessageType.FIFO, MessageType.DELAY, MessageType.TRANSACTION)
CLIENT_ID_HEADER = "x-mq-client-id"
LANGUAGE_HEADER = "x-mq-language"
_POLL_MARGIN_S = 0.3  # answer this long before the call's deadline, so the answer arrives
_CONSUMER_TYPES = (ClientType.PUSH_CONSUMER, ClientType.SIMPLE_CONSUMER)
_PERMISSIONS = {TopicPermission.READ_WRITE: Permission.READ_WRITE, TopicPermission.READ: Permission.READ,
                TopicPermission.WRITE: Permission.WRITE, TopicPermission.NONE: Permission.NONE}


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {key: value for key, value in (context.invocation_metadata() or ()) if isinstance(value, str)}


_OK = ok()  # copied into each entry that refers to it: protobuf never shares a message


def _header(context: grpc.aio.ServicerContext, name: str) -> str:
    """One header's value ("" without it): a scan of the few pairs, no dict built per call."""
    for key, value in context.invocation_metadata() or ():
        if key == name and isinstance(value, str):
            return value
    return ""


def _failover_routes(context: grpc.aio.ServicerContext) -> str:
    """How routes name a failover master's peers (brokers that forward to it) for this client:
    ``list``: in the master's Endpoints (the Python client dials ``ipv4:a,b`` and keeps the first
    address that answers); ``entries``: as queue entries of their own (the Node.js client - it
    says ``HTTP`` - joins an address list without the ``ipv4:`` scheme, which grpc-js cannot
    resolve; it sets aside the endpoints a send failed on and its simple consumer reads the
    route's entries in turn); ``none`` for clients not measured with either."""
    language = _header(context, LANGUAGE_HEADER).upper()
    return {"PYTHON": "list", "HTTP": "entries"}.get(language, "none")


def _group(resource: definition_pb2.Resource) -> str:
    try:
        return validate_group(resource.name)
    except InvalidNameError as exc:
        raise RpcFailure(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from exc


def _answering(response: type, action: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A unary handler whose every failure is answered as ``response(status=...)``."""
    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def handler(self: MessagingService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await method(self, request, context)
            except Exception as exc:  # noqa: BLE001 - every failure is answered with a protocol status
                return response(status=status_of(exc, action=action))
        return handler
    return wrap


def _forwarding(response: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A unary handler that a failover slave passes on to its master (plugmq.server.forward)."""
    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def handler(self: MessagingService, request: Any, context: grpc.aio.ServicerContext) -> Any:
            if self.forward is not None and (master := self.forward.target(context)) is not None:
                return await self.forward.unary(master, method.__name__, request, context,
                                                lambda status: response(status=status))
            return await method(self, request, context)
        return handler
    return wrap


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    """apache.rocketmq.v2.MessagingService over a plugmq broker."""

    def __init__(self, broker: Serving, options: ServerOptions, sessions: Sessions,
                 wakeup: Wakeup, executor: ThreadPoolExecutor, listen: str, *,
                 max_batch_bytes: int = DEFAULT_MAX_BODY_SIZE, assigner: Assigner, local: LocalRoutes,
                 receipts: ReceiptSealer, cluster: ClusterMember | None = None,
                 auth: Authenticator | None = None) -> None:
        self.broker = broker
        self.assigner = assigner
        self.local = local  # this broker alone (no cluster), also as a one-broker view
        self.cluster = cluster
        # A failover slave passes sends, receives and acks on to its master (plugmq.server.forward).
        self.forward = MasterForwarder(cluster) if cluster is not None else None
        self.options = options
        self.pop = broker.pop  # pop consumption is the broker's; these RPCs only translate it
        self._consume_from = (ConsumeFrom.LAST_OFFSET if options.new_group_from == "last"
                              else ConsumeFrom.FIRST_OFFSET)
        self.sessions = sessions
        self.wakeup = wakeup
        self.auth = auth if auth is not None else Authenticator(options.acl, broker.clock)
        self.receipts = receipts
        self._executor = executor
        self._listen = listen
        self.acks = LoopWorker(asyncio.get_running_loop(), "plugmq-serve-ack")
        self.sends = SendWorker(Sender(broker, sessions, self.auth, max_batch_bytes), asyncio.get_running_loop())
        self._max_body = max_batch_bytes
        self.subscriptions = Subscriptions(broker, broker.name, options.filter_cache_bytes)
        self.long_polls = 0  # receives waiting for messages now (at most options.max_long_polls)
        self.stopping = asyncio.Event()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _account(self, context: grpc.aio.ServicerContext) -> Account | None:
        return self.auth.account(_metadata(context)) if self.auth.enabled else None

    def _consumer(self, context: grpc.aio.ServicerContext, group_resource: definition_pb2.Resource,
                  topic_resource: definition_pb2.Resource) -> tuple[str, str]:
        """(group, topic) of a consumer's call, once its account may read the topic as the group."""
        account = self._account(context)
        group = _group(group_resource)
        topic = topic_name(topic_resource)
        self.auth.require(account, "subscribe", topic)
        self.auth.require_group(account, group)
        return group, topic

    # ------------------------------------------------------------------------------ routes
    def _endpoints(self, asked: definition_pb2.Endpoints) -> definition_pb2.Endpoints:
        """Where clients reach this broker: ``advertise``, else the address they used, else ``listen``."""
        if self.options.advertise is None and asked.addresses:
            return asked
        host, _, port = (self.options.advertise or self._listen).rpartition(":")
        endpoints = definition_pb2.Endpoints(scheme=definition_pb2.AddressScheme.IPv4)
        endpoints.addresses.add(host=host, port=int(port))
        return endpoints

    def _readable_queues(self, topic: str) -> list[Any]:
        if topic.startswith(DLQ_PREFIX):
            return self.broker.topic_queues(topic, create=False)
        if is_system_topic(topic):
            raise RpcFailure(Code.ILLEGAL_TOPIC, f"topic {topic!r} is one of the broker's system topics; "
                                                 "clients may use their own topics and %DLQ% topics only")
        return self.broker.topic_queues(topic, create=False)

    def _route(self, topic: str) -> list[Any]:
        if is_system_topic(topic):
            return self._readable_queues(topic)
        return self.broker.topic_queues(topic)  # auto-creates when the broker allows it

    def _routed(self, topic: str) -> list[RoutedQueue]:
        """The topic's queues over every live broker of the cluster (this broker's alone without one)."""
        if self.cluster is None:
            permission = TopicPermission.READ if topic.startswith(DLQ_PREFIX) else TopicPermission.READ_WRITE
            return self.local.routed(self._route(topic), permission)
        if is_system_topic(topic) and not topic.startswith(DLQ_PREFIX):
            self._readable_queues(topic)  # refuses with the reason
        if not is_system_topic(topic) and self.cluster.auto_creates_topics:
            self.broker.topic_queues(topic)  # creates and declares it for the cluster
        routed = self.cluster.route(topic)
        if not routed:
            raise TopicError(f"topic {topic!r} does not exist on any live broker of cluster {self.cluster.cluster!r} "
                             "and this broker does not auto-create topics; create it first")
        return routed

    def _view(self) -> ClusterView:
        return self.cluster.view() if self.cluster is not None else self.local.view()

    def _broker_groups(self, queue: RoutedQueue, style: str) -> list[list[BrokerRegistration]]:
        """The endpoints each route entry of ``queue`` gets: one group per entry (see
        :func:`_failover_routes`)."""
        peers = (self.cluster.failover_peers(queue.broker) if self.cluster is not None and style != "none"
                 and queue.broker.failover and (queue.broker.is_master or queue.standing_in) else [])
        if style == "list":
            return [[queue.broker, *peers]]
        return [[queue.broker], *([peer] for peer in peers)]

    def _broker_proto(self, target: definition_pb2.Broker, queue: RoutedQueue, asked: definition_pb2.Endpoints,
                      brokers: list[BrokerRegistration] | None = None) -> None:
        target.name = queue.broker.broker_name
        if self.cluster is None:
            # Alone, the broker is the one its clients must use: id 0, the only id the official
            # producers and simple consumers accept (a slave serves its readers this way).
            target.id = 0
            target.endpoints.CopyFrom(self._endpoints(asked))  # the address the client used for this broker
            return
        # The official clients send to and read from id 0 alone: an elected master (failover) is id 0
        # whatever its configured id, and so is a slave standing in for a missing master (its queues
        # are read-only, so producers still never send there); any other slave never is.
        target.id = 0 if queue.broker.is_master or queue.standing_in else max(queue.broker.broker_id, 1)
        target.endpoints.scheme = definition_pb2.AddressScheme.IPv4
        # With failover peers, whichever of them a client reaches forwards to the master
        # (plugmq.server.forward).
        for broker in brokers or [queue.broker]:
            host, _, port = broker.endpoint.rpartition(":")
            target.endpoints.addresses.add(host=host, port=int(port))

    @_answering(service_pb2.QueryRouteResponse, "query route")
    async def QueryRoute(self, request: service_pb2.QueryRouteRequest,
                         context: grpc.aio.ServicerContext) -> service_pb2.QueryRouteResponse:
        account = self._account(context)
        topic = topic_name(request.topic)
        if account is not None and not (account.may("publish", topic) or account.may("subscribe", topic)):
            self.auth.require(account, "subscribe", topic)
        routed = await self._run(self._routed, topic)
        types = [t for t in _ALL_TYPES if (t != MessageType.DELAY or self.broker.delay is not None)
                 and (t != MessageType.TRANSACTION or self.broker.transactions is not None)]
        if self.broker.is_priority_topic(topic):
            types.append(MessageType.PRIORITY)
        response = service_pb2.QueryRouteResponse(status=ok())
        style = _failover_routes(context)
        for queue in routed:
            for brokers in self._broker_groups(queue, style):
                entry = response.message_queues.add(id=queue.queue.queue_id, permission=_PERMISSIONS[queue.permission],
                                                    accept_message_types=types)
                entry.topic.CopyFrom(request.topic)
                self._broker_proto(entry.broker, queue, request.endpoints, brokers)
        return response

    @_answering(service_pb2.HeartbeatResponse, "heartbeat")
    async def Heartbeat(self, request: service_pb2.HeartbeatRequest,
                        context: grpc.aio.ServicerContext) -> service_pb2.HeartbeatResponse:
        account = self._account(context)
        if request.HasField("group"):
            group = _group(request.group)
            if request.client_type in _CONSUMER_TYPES:
                self.auth.require_group(account, group)  # a stranger never joins (and reshapes) a group
                self.assigner.members.seen(group, _metadata(context).get(CLIENT_ID_HEADER, ""))
        return service_pb2.HeartbeatResponse(status=ok())

    @_answering(service_pb2.QueryAssignmentResponse, "query assignment")
    async def QueryAssignment(self, request: service_pb2.QueryAssignmentRequest,
                              context: grpc.aio.ServicerContext) -> service_pb2.QueryAssignmentResponse:
        group, topic = self._consumer(context, request.group, request.topic)
        if self.cluster is None:
            await self._run(self._readable_queues, topic)
        routed = await self._run(self._routed, topic)
        allocating = self.assigner.allocating(group)
        # Consumers read masters (a slave where its name has none); a broker alone serves its readers
        # whatever its role.
        routed = [r for r in routed if r.readable and (r.broker.is_master or r.standing_in or self.cluster is None)]
        if allocating:
            client_id = _metadata(context).get(CLIENT_ID_HEADER, "")
            assigned = await self._run(self.assigner.assign, group, client_id, routed, await self._run(self._view))
        else:
            # RocketMQ 5's pop assignment: one per broker (queue id -1); each receive pops from
            # every queue of the topic on that broker, so one long poll serves a consumer.
            assigned = list({r.broker.broker_name: r for r in routed}.values())
        response = service_pb2.QueryAssignmentResponse(status=ok())
        for routed_queue in assigned:
            queue = response.assignments.add().message_queue
            queue.topic.CopyFrom(request.topic)
            queue.id = routed_queue.queue.queue_id if allocating else -1
            queue.permission = _PERMISSIONS[routed_queue.permission]
            style = "list" if _failover_routes(context) == "list" else "none"  # one assignment per queue
            self._broker_proto(queue.broker, routed_queue, request.endpoints, self._broker_groups(routed_queue, style)[0])
            queue.accept_message_types.extend(_ALL_TYPES)
        return response

    # ------------------------------------------------------------------------------ send
    async def SendMessage(self, request: service_pb2.SendMessageRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.SendMessageResponse:
        # A failover slave passes the call on to its master (as _forwarding does, without its
        # wrapping coroutine on every send).
        if self.forward is not None and (master := self.forward.target(context)) is not None:
            return await self.forward.unary(master, "SendMessage", request, context,
                                            lambda status: service_pb2.SendMessageResponse(status=status))
        try:
            account = self._account(context) if self.auth.enabled else None
            messages = request.messages
            if not messages:
                raise RpcFailure(Code.BAD_REQUEST, "SendMessageRequest holds no message")
            checked = check_messages(messages, account, self.auth, self._max_body)
            if checked.transactional:  # the client's session answers its transaction checks
                checked = attrs.evolve(checked, client_id=_header(context, CLIENT_ID_HEADER))
            if self.sends.stores_on_loop((checked,), self.broker.sends_wait):
                return self.sends.sender.store((checked,))[0]
            return await self.sends.submit(checked)
        except Exception as exc:  # noqa: BLE001 - answered as a protocol status
            return service_pb2.SendMessageResponse(status=status_of(exc, action="send"))

    @_forwarding(service_pb2.RecallMessageResponse)
    @_answering(service_pb2.RecallMessageResponse, "recall")
    async def RecallMessage(self, request: service_pb2.RecallMessageRequest,
                            context: grpc.aio.ServicerContext) -> service_pb2.RecallMessageResponse:
        account = self._account(context)
        topic = topic_name(request.topic)
        self.auth.require(account, "publish", topic)
        msg_id, _, message_id = request.recall_handle.partition(":")
        if not msg_id or not message_id:
            raise RpcFailure(Code.BAD_REQUEST, f"recall handle {request.recall_handle!r} was not issued by this "
                                               "server; pass the recall_handle of a delayed message's send receipt")
        if not await self._run(self.broker.cancel_delayed, msg_id):
            raise RpcFailure(Code.NOT_FOUND, f"delayed message {message_id} cannot be recalled: it was delivered "
                                             "already, recalled before, or is unknown to this broker")
        return service_pb2.RecallMessageResponse(status=ok(), message_id=message_id)

    @_forwarding(service_pb2.EndTransactionResponse)
    @_answering(service_pb2.EndTransactionResponse, "end transaction")
    async def EndTransaction(self, request: service_pb2.EndTransactionRequest,
                             context: grpc.aio.ServicerContext) -> service_pb2.EndTransactionResponse:
        account = self._account(context)
        topic = topic_name(request.topic)
        self.auth.require(account, "publish", topic)
        service = self.broker.transactions
        if service is None:
            raise RpcFailure(Code.UNSUPPORTED, f"broker {self.broker.name!r} has no transaction plugin")
        decision = {TransactionResolution.COMMIT: TransactionDecision.COMMIT,
                    TransactionResolution.ROLLBACK: TransactionDecision.ROLLBACK}.get(request.resolution)
        if decision is None:
            raise RpcFailure(Code.BAD_REQUEST, "EndTransaction needs resolution COMMIT or ROLLBACK")
        if not request.transaction_id:
            raise RpcFailure(Code.INVALID_TRANSACTION_ID, "transaction_id is empty; pass the send receipt's one")
        from_check = request.source == TransactionSource.SOURCE_SERVER_CHECK
        applied = await self._run(lambda: service.end(request.transaction_id, decision, from_check=from_check))
        note = "OK" if applied else "the transaction was settled already; this decision changed nothing"
        return service_pb2.EndTransactionResponse(status=ok(note))

    # ------------------------------------------------------------------------------ receive
    def _invisible_ms(self, duration: Any, *, minimum: float) -> int:
        millis = duration.ToMilliseconds()
        low, high = minimum, self.options.max_invisible_s
        if not low * 1000 <= millis <= high * 1000:
            raise RpcFailure(Code.ILLEGAL_INVISIBLE_TIME,
                             f"invisible duration {millis / 1000:g} s is outside {low:g} s .. {high:g} s "
                             "(server.min_invisible_s / max_invisible_s)")
        return millis

    async def ReceiveMessage(self, request: service_pb2.ReceiveMessageRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[service_pb2.ReceiveMessageResponse]:
        if self.forward is not None and (master := self.forward.target(context)) is not None:
            async for response in self.forward.stream(master, "ReceiveMessage", request, context,
                                                      lambda status: service_pb2.ReceiveMessageResponse(status=status)):
                yield response
            return
        loop = asyncio.get_running_loop()
        waiting = False
        try:
            group, topic = self._consumer(context, request.group, request.message_queue.topic)
            if self.cluster is not None:
                self.cluster.check_consumer_reads()
            known, subscription = self.subscriptions.cached(request.filter_expression)
            if not known:
                subscription = await self._run(self.subscriptions.compile, request.filter_expression)
            invisible_ms, batch, polling = self._receive_limits(request, context)
            deadline = loop.time() + polling
            client_id = _metadata(context).get(CLIENT_ID_HEADER, "")
            only_queue = self._assigned_queue(group, client_id, request.message_queue.id)
            account = self._account(context) if self.auth.enabled else None  # its rate limit, if it has one
            account_name = account.access_key if account is not None else None
            while True:
                generation = self.wakeup.generation
                try:
                    deliveries = await self._run(functools.partial(
                        self.pop.receive, group, topic, subscription, batch, invisible_ms,
                        consume_from=self._consume_from, only_queue=only_queue, client_id=client_id,
                        account=account_name))
                except RateLimitedError as exc:  # the group's (or account's) limit: wait it out within the poll
                    if (deadline - loop.time()) * 1000 < exc.retry_after_ms or self.stopping.is_set():
                        raise  # answered TOO_MANY_REQUESTS with the retry hint
                    await asyncio.sleep(exc.retry_after_ms / 1000)
                    continue
                left = deadline - loop.time()
                if deliveries or left <= 0 or self.stopping.is_set():
                    break
                if not waiting:
                    self._begin_long_poll()
                    waiting = True
                await self.wakeup.wait(generation, left)
        except Exception as exc:  # noqa: BLE001 - answered as a protocol status
            yield service_pb2.ReceiveMessageResponse(status=status_of(exc, action="receive"))
            return
        finally:
            if waiting:
                self.long_polls -= 1
        if not deliveries:
            yield service_pb2.ReceiveMessageResponse(
                status=Status(code=Code.MESSAGE_NOT_FOUND, message="no new message within the long-polling time"))
            return
        namespace = request.group.resource_namespace
        first = service_pb2.ReceiveMessageResponse()
        first.delivery_timestamp.FromMilliseconds(self.broker.clock.now_ms())
        yield first
        for delivery in deliveries:
            response = service_pb2.ReceiveMessageResponse()
            self._delivered(delivery, namespace, group, topic, response.message)  # filled in place
            yield response
        yield service_pb2.ReceiveMessageResponse(status=_OK)

    def _receive_limits(self, request: service_pb2.ReceiveMessageRequest,
                        context: grpc.aio.ServicerContext) -> tuple[int, int, float]:
        """A receive's invisible time (ms), batch size and long-polling time (s): what it asks
        for within the server's bounds, the poll ending before the call's own deadline."""
        if request.HasField("invisible_duration"):
            invisible_ms = self._invisible_ms(request.invisible_duration, minimum=self.options.min_invisible_s)
        else:
            invisible_ms = round(self.options.default_invisible_s * 1000)
        batch = min(max(request.batch_size, 1), self.options.max_batch)
        polling = self.options.long_polling_s
        if request.HasField("long_polling_timeout"):
            polling = min(polling, request.long_polling_timeout.ToMilliseconds() / 1000)
        remaining = context.time_remaining()
        if remaining is not None:
            polling = min(polling, remaining - _POLL_MARGIN_S)
        return invisible_ms, batch, polling

    def _assigned_queue(self, group: str, client_id: str, queue_id: int) -> int | None:
        """The one queue a receive reads, or None for the whole broker (RocketMQ 5's pop).

        A push consumer of a group that allocates (``[groups.<g>] allocation``) reads only the
        queue QueryAssignment gave it. A simple consumer never asks for an assignment: it names
        each queue of the route in turn, and confining it to that queue would make each receive
        a long poll of one queue, so it pops the whole broker like any pop consumer."""
        if queue_id < 0 or not self.assigner.allocating(group):
            return None
        session = self.sessions.get(client_id)
        return queue_id if session is not None and session.client_type == ClientType.PUSH_CONSUMER else None

    def _begin_long_poll(self) -> None:
        """Count a receive that waits; past ``max_long_polls`` it is answered now, TOO_MANY_REQUESTS."""
        if self.long_polls >= self.options.max_long_polls:
            raise RpcFailure(Code.TOO_MANY_REQUESTS,
                             f"resource exhausted: {self.long_polls} receives are waiting for messages already "
                             f"(server.max_long_polls = {self.options.max_long_polls}); retry after a back-off")
        self.long_polls += 1

    def _delivered(self, received: ReceivedMessage, namespace: str, group: str, topic: str,
                   into: definition_pb2.Message) -> None:
        to_proto(received, namespace=namespace, receipt_handle=self.receipts.seal(group, topic, received.receipt_handle),
                 attempt=received.delivery_attempt, invisible_ms=received.invisible_duration_ms, into=into)

    @_forwarding(service_pb2.AckMessageResponse)
    async def AckMessage(self, request: service_pb2.AckMessageRequest,
                         context: grpc.aio.ServicerContext) -> service_pb2.AckMessageResponse:
        try:
            group, topic = self._consumer(context, request.group, request.topic)
            if not request.entries:
                raise RpcFailure(Code.BAD_REQUEST, "AckMessageRequest holds no entry")
        except Exception as exc:  # noqa: BLE001 - answered as a protocol status
            return service_pb2.AckMessageResponse(status=status_of(exc, action="ack"))
        client_id = _header(context, CLIENT_ID_HEADER)
        if self.broker.pop_waits:
            response = await self.acks.run(self._ack_all, group, topic, request.entries, client_id)
        else:  # a journal append to the page cache: cheaper here than the hop to the ack thread and back
            response = self._ack_all(group, topic, request.entries, client_id)
        if self.broker.group_policy(group).fifo:
            self.wakeup.notify()  # the acked message's queue may be free again
        return response

    def _ack_all(self, group: str, topic: str, entries: Iterable[service_pb2.AckMessageEntry],
                 client_id: str) -> service_pb2.AckMessageResponse:
        """Ack every entry; the response's entries are filled in place, its status OK unless one failed."""
        response = service_pb2.AckMessageResponse()
        add = response.entries.add
        all_ok = True
        for entry in entries:
            handle = entry.receipt_handle
            result = add(message_id=entry.message_id, receipt_handle=handle)
            try:
                self.pop.ack(group, topic, self.receipts.open(group, topic, handle), client_id=client_id)
                result.status.CopyFrom(_OK)
            except Exception as exc:  # noqa: BLE001 - answered as a protocol status
                result.status.CopyFrom(status_of(exc, action="ack"))
                all_ok = False
        response.status.CopyFrom(_OK if all_ok else overall([result.status for result in response.entries]))
        return response

    @_forwarding(service_pb2.ChangeInvisibleDurationResponse)
    @_answering(service_pb2.ChangeInvisibleDurationResponse, "change invisible duration")
    async def ChangeInvisibleDuration(self, request: service_pb2.ChangeInvisibleDurationRequest,
                                      context: grpc.aio.ServicerContext
                                      ) -> service_pb2.ChangeInvisibleDurationResponse:
        group, topic = self._consumer(context, request.group, request.topic)
        handle = self.receipts.open(group, topic, request.receipt_handle)
        invisible_ms = self._invisible_ms(request.invisible_duration, minimum=0)
        # A push consumer changes the invisible duration only to nack a message it failed on: the
        # core then keeps it away for at least the group's back-off, whatever duration was asked.
        client_id = _metadata(context).get(CLIENT_ID_HEADER, "")
        session = self.sessions.get(client_id)
        gave_up = session is not None and session.client_type == ClientType.PUSH_CONSUMER
        renewed = await self.acks.run(functools.partial(self.pop.change_invisible_duration, group, topic,
                                                        handle, invisible_ms, gave_up=gave_up, client_id=client_id))
        self.wakeup.notify()
        return service_pb2.ChangeInvisibleDurationResponse(status=ok(),
                                                           receipt_handle=self.receipts.seal(group, topic, renewed))

    @_forwarding(service_pb2.ForwardMessageToDeadLetterQueueResponse)
    @_answering(service_pb2.ForwardMessageToDeadLetterQueueResponse, "forward to dead-letter queue")
    async def ForwardMessageToDeadLetterQueue(self, request: service_pb2.ForwardMessageToDeadLetterQueueRequest,
                                              context: grpc.aio.ServicerContext
                                              ) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
        group, topic = self._consumer(context, request.group, request.topic)
        handle = self.receipts.open(group, topic, request.receipt_handle)
        await self._run(self.pop.forward_to_dead_letter_queue, group, topic, handle)
        self.wakeup.notify()
        return service_pb2.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # ------------------------------------------------------------------------------ clients
    async def Telemetry(self, request_iterator: AsyncIterator[service_pb2.TelemetryCommand],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[service_pb2.TelemetryCommand]:
        metadata = _metadata(context)
        try:
            account = self.auth.account(metadata)
            client_id = metadata.get(CLIENT_ID_HEADER, "")
            if not client_id:
                raise RpcFailure(Code.CLIENT_ID_REQUIRED, "the Telemetry stream needs the x-mq-client-id header")
        except Exception as exc:  # noqa: BLE001 - answered as a protocol status
            yield service_pb2.TelemetryCommand(status=failure_of(exc, action="telemetry").status)
            return
        session = self.sessions.open(client_id, asyncio.get_running_loop())
        reader = asyncio.ensure_future(self._read_telemetry(request_iterator, session, account))
        stopping = asyncio.ensure_future(self.stopping.wait())
        getter: asyncio.Future[service_pb2.TelemetryCommand] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(session.outbox.get())
                done, _ = await asyncio.wait({getter, reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    break
                yield getter.result()
        finally:
            for task in (getter, reader, stopping):
                if task is not None:
                    task.cancel()
            self.sessions.close(session)

    async def _read_telemetry(self, commands: AsyncIterator[service_pb2.TelemetryCommand], session: Session,
                              account: Account | None) -> None:
        try:
            async for command in commands:
                if command.WhichOneof("command") == "settings":
                    self._saw_settings(session.client_id, command.settings, account)
                reply = await self._run(self.sessions.handle, session, command)
                if reply is not None:
                    session.outbox.put_nowait(reply)
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        except Exception:
            log.exception("telemetry stream failed", client=session.client_id)

    def _saw_settings(self, client_id: str, settings: Any, account: Account | None) -> None:
        """A client's settings: where it connects, the host it runs on (its room, for room strategies)
        and its group (when its account may consume as that group: a stranger never joins a group's
        allocation)."""
        members = self.assigner.members
        members.access_point(client_id, access_point_address(settings))
        members.host(client_id, settings.user_agent.hostname)
        group = settings.subscription.group.name
        if settings.client_type in _CONSUMER_TYPES and group and (account is None or account.may_consume(group)):
            members.seen(group, client_id)

    @_answering(service_pb2.NotifyClientTerminationResponse, "notify termination")
    async def NotifyClientTermination(self, request: service_pb2.NotifyClientTerminationRequest,
                                      context: grpc.aio.ServicerContext
                                      ) -> service_pb2.NotifyClientTerminationResponse:
        metadata = _metadata(context)
        self.auth.account(metadata)
        await self._run(self.sessions.close_client, metadata.get(CLIENT_ID_HEADER, ""))
        self.assigner.members.leave(metadata.get(CLIENT_ID_HEADER, ""))
        return service_pb2.NotifyClientTerminationResponse(status=ok())

    # ------------------------------------------------------------------------------ unsupported
    @staticmethod
    def _unsupported(what: str) -> Status:
        return Status(code=Code.UNSUPPORTED, message=f"{what} is not supported by plugmq serve; consume with "
                                                     "ReceiveMessage (SimpleConsumer / PushConsumer)")

    async def PullMessage(self, request: service_pb2.PullMessageRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[service_pb2.PullMessageResponse]:
        yield service_pb2.PullMessageResponse(status=self._unsupported("PullMessage"))

    async def UpdateOffset(self, request: service_pb2.UpdateOffsetRequest,
                           context: grpc.aio.ServicerContext) -> service_pb2.UpdateOffsetResponse:
        return service_pb2.UpdateOffsetResponse(status=self._unsupported("UpdateOffset"))

    async def GetOffset(self, request: service_pb2.GetOffsetRequest,
                        context: grpc.aio.ServicerContext) -> service_pb2.GetOffsetResponse:
        return service_pb2.GetOffsetResponse(status=self._unsupported("GetOffset"))

    async def QueryOffset(self, request: service_pb2.QueryOffsetRequest,
                          context: grpc.aio.ServicerContext) -> service_pb2.QueryOffsetResponse:
        return service_pb2.QueryOffsetResponse(status=self._unsupported("QueryOffset"))

    async def SyncLiteSubscription(self, request: service_pb2.SyncLiteSubscriptionRequest,
                                   context: grpc.aio.ServicerContext) -> service_pb2.SyncLiteSubscriptionResponse:
        return service_pb2.SyncLiteSubscriptionResponse(
            status=Status(code=Code.UNSUPPORTED, message="lite topics are not supported by plugmq serve"))
