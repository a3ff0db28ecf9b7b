"""Protocol status codes: every failure a client sees is a ``Status`` with a message a person can act on."""

from __future__ import annotations

from collections.abc import Callable

from plugmq.core.errors import (
    ClientError,
    DelayError,
    DelayUnsupportedError,
    FencedError,
    FilterError,
    InvalidNameError,
    MessageTooLargeError,
    NotEnoughReplicasError,
    PlugmqError,
    RateLimitedError,
    ReadOnlyBrokerError,
    ReceiptHandleError,
    StoreError,
    StoreFullError,
    TopicError,
    TransactionError,
    ValidationError,
)
from plugmq.core.logs import get_logger
from plugmq.server.protocol import Code, Status

__all__ = ["RpcFailure", "failure_of", "ok", "overall", "status_of"]

log = get_logger(__name__)


class RpcFailure(Exception):
    """A request the server refuses: the protocol code and the text the client shows."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> Status:
        return Status(code=self.code, message=self.message)


def ok(message: str = "OK") -> Status:
    return Status(code=Code.OK, message=message)


# Errors that map to a protocol code of their own, in this order (subclasses before their bases);
# a function picks the code from the error's text where one class covers two codes.
_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int | Callable[[str], int]], ...] = (
    (ReceiptHandleError, Code.INVALID_RECEIPT_HANDLE),
    (RateLimitedError, Code.TOO_MANY_REQUESTS),  # the text ends with the retry hint ("retry in N ms")
    (ReadOnlyBrokerError, Code.FORBIDDEN),  # RocketMQ: a slave's store forbids puts
    ((FencedError, NotEnoughReplicasError), Code.HA_NOT_AVAILABLE),  # not stored / not served: the client retries
    (MessageTooLargeError, Code.MESSAGE_BODY_TOO_LARGE),
    (InvalidNameError, lambda text: Code.ILLEGAL_CONSUMER_GROUP if text.startswith("group") else Code.ILLEGAL_TOPIC),
    (ValidationError, Code.BAD_REQUEST),
    (TopicError, lambda text: Code.TOPIC_NOT_FOUND if "does not exist" in text else Code.ILLEGAL_TOPIC),
    (FilterError, Code.ILLEGAL_FILTER_EXPRESSION),
    (DelayUnsupportedError, Code.UNSUPPORTED),
    (DelayError, Code.ILLEGAL_DELIVERY_TIME),
    (TransactionError, lambda text: Code.INVALID_TRANSACTION_ID if "transaction id" in text else Code.BAD_REQUEST),
)


def failure_of(exc: BaseException, *, action: str) -> RpcFailure:
    """The protocol failure for an exception raised while doing ``action`` (e.g. "send")."""
    if isinstance(exc, RpcFailure):
        return exc
    text = str(exc)
    for kinds, code in _CODES:
        if isinstance(exc, kinds):
            return RpcFailure(code(text) if callable(code) else code, text)
    return RpcFailure(Code.INTERNAL_SERVER_ERROR, _internal_text(exc, text, action))


def _internal_text(exc: BaseException, text: str, action: str) -> str:
    """What an INTERNAL_SERVER_ERROR says: the store's or the broker's problem, or a bug (logged)."""
    if isinstance(exc, StoreFullError):
        return f"{action} refused: {text} (free disk space on the broker, then retry)"
    if isinstance(exc, StoreError):
        return f"{action} failed in the message store: {text}"
    if isinstance(exc, ClientError):
        return f"{action} failed: {text} (the server is shutting down?)"
    if isinstance(exc, PlugmqError):
        return f"{action} failed: {text}"
    log.error("unexpected error in a request", action=action, error=repr(exc), exc_info=exc)
    return f"{action} failed with an internal error ({type(exc).__name__}: {text}); the server log has the traceback"


def status_of(exc: BaseException, *, action: str) -> Status:
    return failure_of(exc, action=action).status


def overall(statuses: list[Status]) -> Status:
    """A response's status over its entries' statuses: OK, the one status, or MULTIPLE_RESULTS."""
    if all(s.code == Code.OK for s in statuses):
        return ok()
    if len(statuses) == 1:
        return statuses[0]
    return Status(code=Code.MULTIPLE_RESULTS, message="entries have different results; see each entry's status")
