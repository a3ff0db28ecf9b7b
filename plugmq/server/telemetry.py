"""Telemetry sessions: the settings exchange, and check-back of orphaned transactions over the stream.

Each client keeps one Telemetry stream open. It sends its settings; the server answers with the
settings it must use (the group's retry policy, FIFO, long polling, body size limit). For a
producer, the session also stands in as the transaction plugin's check listener: a check-back
becomes a ``RecoverOrphanedTransactionCommand`` on the stream and is answered later by the
client's EndTransaction (source SERVER_CHECK), so the listener itself returns UNKNOWN.

RocketMQ 5 clients name no producer group; transactional halves of topic T belong to the
producer group ``txn_group(T)``, whose check listeners are the producer sessions publishing T.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.duration_pb2 import Duration

from plugmq.core.contracts import TransactionDecision
from plugmq.core.errors import InvalidNameError
from plugmq.core.logs import get_logger
from plugmq.core.message import StoredMessage
from plugmq.core.names import MAX_NAME_LENGTH, validate_group
from plugmq.server.convert import to_proto
from plugmq.server.options import ServerOptions
from plugmq.server.protocol import ClientType, Code, Settings, TelemetryCommand
from plugmq.server.status import RpcFailure, ok

if TYPE_CHECKING:
    from plugmq.broker.ports import Served

__all__ = ["Session", "Sessions", "txn_group"]

log = get_logger(__name__)

_CONSUMERS = (ClientType.PUSH_CONSUMER, ClientType.SIMPLE_CONSUMER)


def txn_group(topic: str) -> str:
    """The producer group that owns transactional messages sent to ``topic`` over gRPC."""
    name = f"grpc-txn-{topic}"
    if len(name) > MAX_NAME_LENGTH:
        name = f"grpc-txn-{hashlib.sha1(topic.encode()).hexdigest()}"
    return name


def _seconds(value: float) -> Duration:
    duration = Duration()
    duration.FromMilliseconds(round(value * 1000))
    return duration


class Session:
    """One client's Telemetry stream: its outbox and the transaction groups it answers for."""

    def __init__(self, client_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.client_id = client_id
        self.client_type: int | None = None
        self.outbox: asyncio.Queue[TelemetryCommand] = asyncio.Queue()
        self._loop = loop
        self.txn_groups: set[str] = set()
        self.checker: Callable[[StoredMessage], TransactionDecision] = self._ask_client
        self.closed = False

    def push(self, command: TelemetryCommand) -> None:
        """Queue ``command`` for the client; callable from any thread."""
        try:
            self._loop.call_soon_threadsafe(self.outbox.put_nowait, command)
        except RuntimeError:
            pass  # the loop is closed: the server is gone and the client will reconnect elsewhere

    def _ask_client(self, half: StoredMessage) -> TransactionDecision:
        if self.closed:
            return TransactionDecision.UNKNOWN
        command = TelemetryCommand()
        command.recover_orphaned_transaction_command.message.CopyFrom(to_proto(half))
        command.recover_orphaned_transaction_command.transaction_id = half.msg_id
        self.push(command)
        log.info("asked a producer about an orphaned transaction", client=self.client_id,
                 transaction_id=half.msg_id, topic=half.topic)
        return TransactionDecision.UNKNOWN  # the answer comes back as an EndTransaction call


class Sessions:
    """Live Telemetry sessions by client id. Methods touching the broker run off the event loop."""

    def __init__(self, broker: Served, options: ServerOptions) -> None:
        self._broker = broker
        self._options = options
        self._lock = threading.Lock()
        self._by_client: dict[str, Session] = {}
        self._asked: dict[str, Session] = {}  # txn group -> the session registered last (the one asked)

    def open(self, client_id: str, loop: asyncio.AbstractEventLoop) -> Session:
        session = Session(client_id, loop)
        with self._lock:
            old = self._by_client.get(client_id)
            self._by_client[client_id] = session
        if old is not None:
            self.close(old)  # the client rebuilt its stream
        return session

    def get(self, client_id: str) -> Session | None:
        with self._lock:
            return self._by_client.get(client_id)

    def close(self, session: Session) -> None:
        """Forget ``session`` and stop asking it about transactions."""
        with self._lock:
            if session.closed:
                return
            session.closed = True
            if self._by_client.get(session.client_id) is session:
                del self._by_client[session.client_id]
            groups = list(session.txn_groups)
            for group in groups:
                if self._asked.get(group) is session:
                    del self._asked[group]
        service = self._broker.transactions
        if service is not None:
            for group in groups:
                service.unregister_checker(group, session.checker)

    def close_client(self, client_id: str) -> None:
        session = self.get(client_id)
        if session is not None:
            self.close(session)

    def close_all(self) -> None:
        with self._lock:
            sessions = list(self._by_client.values())
        for session in sessions:
            self.close(session)

    def answer_transactions(self, session: Session, topic: str, *, proven: bool = False) -> None:
        """Make ``session`` a check listener for ``topic``'s transactions.

        ``proven``: the client just sent a transactional message there, so it has a checker;
        re-registering puts it last, which is the listener the transaction plugin asks.
        """
        service = self._broker.transactions
        if service is None or session.closed:
            return
        group = txn_group(topic)
        with self._lock:
            known = group in session.txn_groups
            session.txn_groups.add(group)
            if proven:
                if self._asked.get(group) is session:
                    return
                self._asked[group] = session
            elif known:
                return
            else:
                self._asked.pop(group, None)  # registered last now, so no longer the proven one
        if known:
            service.unregister_checker(group, session.checker)
        service.register_checker(group, session.checker)
        if session.closed:  # closed while registering: close() may have missed this group
            service.unregister_checker(group, session.checker)

    # ------------------------------------------------------------------------------ settings
    def settings_reply(self, session: Session, command: TelemetryCommand) -> TelemetryCommand:
        """The server's answer to a client's settings (status UNSUPPORTED for unserved client types)."""
        settings = command.settings
        reply = TelemetryCommand()
        if settings.client_type not in (ClientType.PRODUCER, *_CONSUMERS):
            name = ClientType.Name(settings.client_type) if settings.client_type in ClientType.values() else "?"
            raise RpcFailure(Code.UNSUPPORTED, f"client type {name} is not served by plugmq; use a Producer, "
                                               "PushConsumer or SimpleConsumer")
        session.client_type = settings.client_type
        answer = Settings()
        answer.client_type = settings.client_type
        answer.access_point.CopyFrom(settings.access_point)
        answer.request_timeout.CopyFrom(settings.request_timeout)
        answer.user_agent.CopyFrom(settings.user_agent)
        answer.metric.on = False
        if settings.client_type == ClientType.PRODUCER:
            answer.backoff_policy.max_attempts = 3
            answer.backoff_policy.exponential_backoff.initial.CopyFrom(_seconds(0.01))
            answer.backoff_policy.exponential_backoff.max.CopyFrom(_seconds(1.0))
            answer.backoff_policy.exponential_backoff.multiplier = 2.0
            answer.publishing.topics.extend(settings.publishing.topics)
            answer.publishing.max_body_size = self._broker.config.max_message_size
            answer.publishing.validate_message_type = True
            for topic in settings.publishing.topics:
                self.answer_transactions(session, topic.name)
        else:
            group = settings.subscription.group.name
            try:
                validate_group(group)
            except InvalidNameError as exc:
                raise RpcFailure(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from exc
            policy = self._broker.group_policy(group)
            answer.backoff_policy.max_attempts = policy.redelivery.max_attempts
            for seconds in policy.redelivery.backoff_s:
                answer.backoff_policy.customized_backoff.next.append(_seconds(seconds))
            subscription = answer.subscription
            subscription.group.CopyFrom(settings.subscription.group)
            subscription.subscriptions.extend(settings.subscription.subscriptions)
            subscription.fifo = policy.fifo
            subscription.receive_batch_size = self._options.max_batch
            subscription.long_polling_timeout.CopyFrom(_seconds(self._options.long_polling_s))
        reply.status.CopyFrom(ok())
        reply.settings.CopyFrom(answer)
        return reply

    def handle(self, session: Session, command: TelemetryCommand) -> TelemetryCommand | None:
        """The reply to one command a client sent on its stream (None: nothing to answer)."""
        which = command.WhichOneof("command")
        if which == "settings":
            try:
                return self.settings_reply(session, command)
            except RpcFailure as failure:
                reply = TelemetryCommand()
                reply.status.CopyFrom(failure.status)
                return reply
        if which in ("thread_stack_trace", "verify_message_result"):
            return None  # answers to commands this server never sends
        reply = TelemetryCommand()
        reply.status.code = Code.UNSUPPORTED
        reply.status.message = f"telemetry command {which or 'with no content'} is not supported by plugmq"
        return reply
