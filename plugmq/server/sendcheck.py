"""SendMessage's checks: each message of a call checked before anything is stored.

Checking needs no broker: a front-end worker process checks a call (plugmq.server.frontend) and
hands it to the process that owns the store, which stores it (plugmq.server.send).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from plugmq.core.message import Message
from plugmq.core.names import is_system_topic
from plugmq.server.auth import Authenticator
from plugmq.server.convert import Outgoing, ProvenKey, is_plain, outgoing, plain_outgoing
from plugmq.server.options import Account
from plugmq.server.protocol import Code, MessageType, definition_pb2, service_pb2
from plugmq.server.status import RpcFailure, status_of

__all__ = ["ON_LOOP_KINDS", "CheckedSend", "PlainCall", "SendRequest", "check_message", "check_messages", "check_send",
           "failed_entry", "plain_call"]


@attrs.frozen
class SendRequest:
    """One SendMessage call's messages and who sent them."""

    messages: Sequence[definition_pb2.Message]
    account: Account | None
    client_id: str


@attrs.frozen
class PlainCall:
    """A call of two or more messages, all of them normal ones (neither delayed nor in a message
    group) to one topic, as the columns of a store batch."""

    topic: str
    size: int  # the bodies' bytes
    messages: list[Message]
    extras: list[Mapping[str, str]]
    message_ids: list[str]


def plain_call(items: Sequence[Outgoing | service_pb2.SendResultEntry]) -> PlainCall | None:
    """The columns of a plain call (:class:`PlainCall`); None for any other call (one message, a
    failed entry, another kind of message, another topic)."""
    if len(items) < 2 or type(items[0]) is not Outgoing:
        return None
    topic = items[0].message.topic
    messages: list[Message] = []
    extras: list[Mapping[str, str]] = []
    message_ids: list[str] = []
    size = 0
    for out in items:
        if type(out) is not Outgoing or out.kind != MessageType.NORMAL or out.message_group is not None:
            return None
        message = out.message
        if message.deliver_at_ms is not None or message.topic != topic:
            return None
        messages.append(message)
        extras.append(out.extra)
        message_ids.append(out.message_id)
        size += len(message.body)
    return PlainCall(topic, size, messages, extras, message_ids)


@attrs.frozen
class CheckedSend:
    """A SendMessage call's messages once checked: each one ready for the broker, or its failed entry.

    Checking needs no broker (a front-end worker process checks, the store's process stores)."""

    items: Sequence[Outgoing | service_pb2.SendResultEntry]
    client_id: str
    account: str | None  # the sender's access key (its rate limit), None without access control
    #: Whether every message is a normal or FIFO one (stored on the event loop when the store allows).
    on_loop: bool = attrs.field(
        default=attrs.Factory(lambda self: _on_loop(self.items), takes_self=True))
    #: Whether a message is transactional (only those need the client's id: its session).
    transactional: bool = attrs.field(
        default=attrs.Factory(lambda self: _transactional(self.items), takes_self=True))
    #: The call's columns when it is a plain one (stored as one batch in one step), else None.
    plain: PlainCall | None = attrs.field(
        default=attrs.Factory(lambda self: plain_call(self.items), takes_self=True))


ON_LOOP_KINDS = frozenset((MessageType.NORMAL, MessageType.FIFO))


def _on_loop(items: Sequence[Outgoing | service_pb2.SendResultEntry]) -> bool:
    return all(type(item) is not Outgoing or item.kind in ON_LOOP_KINDS for item in items)


def _transactional(items: Sequence[Outgoing | service_pb2.SendResultEntry]) -> bool:
    return any(type(item) is Outgoing and item.kind == MessageType.TRANSACTION for item in items)


def check_message(proto: definition_pb2.Message, account: Account | None, auth: Authenticator,
                  max_body: int) -> Outgoing:
    """One sent message checked (protocol codes as RpcFailure): fields, the account's right to
    publish to its topic, and that the topic is not one of the broker's own."""
    out = outgoing(proto, max_body)
    _check_topic(out.message.topic, account, auth)
    return out


def check_send(request: SendRequest, auth: Authenticator, max_body: int) -> CheckedSend:
    """Every message of a call checked: its Outgoing, or the entry that answers its failure."""
    return check_messages(request.messages, request.account, auth, max_body, request.client_id)


def check_messages(messages: Sequence[definition_pb2.Message], account: Account | None, auth: Authenticator,
                   max_body: int, client_id: str = "") -> CheckedSend:
    """:func:`check_send` of a call's messages (``client_id`` matters to transactional ones only).

    What depends on the topic alone (the account's right to publish, not a system topic) is
    checked once per topic of the call, each message's own fields one by one. Once a plain
    message (:func:`plugmq.server.convert.is_plain`) of a topic and tag is checked, the call's
    next plain ones of that topic and tag are converted without the checks of the topic and the
    tag again (:func:`plugmq.server.convert.plain_outgoing`): the same Outgoing, the same
    answers."""
    items: list[Outgoing | service_pb2.SendResultEntry] = []
    topics: dict[str, RpcFailure | None] = {}  # per topic of the call: why it is refused, None: it is not
    proven: dict[ProvenKey, Message] = {}  # plain messages' (topic, tag) checked good, and allowed
    on_loop, transactional = True, False
    proving = len(messages) > 1  # a message of its own proves nothing for another
    for proto in messages:
        out = plain_outgoing(proto, proven) if proven else None
        if out is not None:
            items.append(out)  # its topic is allowed: it was proven
            continue
        try:
            out = outgoing(proto, max_body)
        except Exception as exc:  # noqa: BLE001 - answered as this entry's status
            items.append(failed_entry(proto.topic.name, proto.system_properties.message_id, exc))
            continue
        topic = out.message.topic
        if topic in topics:
            refused = topics[topic]
        else:
            refused = topics[topic] = _topic_refused(topic, account, auth)
        if refused is not None:
            items.append(failed_entry(topic, out.message_id, refused))
            continue
        items.append(out)
        if proving and is_plain(out):
            proven[(topic, out.message.tags)] = out.message
        elif out.kind not in ON_LOOP_KINDS:
            on_loop = False
            transactional = transactional or out.kind == MessageType.TRANSACTION
    return CheckedSend(items, client_id, account.access_key if account is not None else None, on_loop, transactional,
                       plain_call(items))


def _topic_refused(topic: str, account: Account | None, auth: Authenticator) -> RpcFailure | None:
    """Why no message of the call may go to ``topic`` (None: they may)."""
    try:
        _check_topic(topic, account, auth)
    except RpcFailure as exc:
        return exc
    return None


def _check_topic(topic: str, account: Account | None, auth: Authenticator) -> None:
    auth.require(account, "publish", topic)
    if is_system_topic(topic):
        raise RpcFailure(Code.ILLEGAL_TOPIC, f"topic {topic!r} is a system topic; producers may not send to it")



def failed_entry(topic: str, message_id: str, exc: BaseException) -> service_pb2.SendResultEntry:
    return service_pb2.SendResultEntry(status=status_of(exc, action=f"send to topic {topic!r}"), message_id=message_id)
