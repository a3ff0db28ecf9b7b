"""Protocol status codes: every failure a client sees is a ``Status`` with a message a person can act on."""

from __future__ import annotations

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


def failure_of(exc: BaseException, *, action: str) -> RpcFailure:
    """The protocol failure for an exception raised while doing ``action`` (e.g. "send")."""
    if isinstance(exc, RpcFailure):
        return exc
    text = str(exc)
    if isinstance(exc, ReceiptHandleError):
        return RpcFailure(Code.INVALID_RECEIPT_HANDLE, text)
    if isinstance(exc, RateLimitedError):  # the text ends with the retry hint ("retry in N ms")
        return RpcFailure(Code.TOO_MANY_REQUESTS, text)
    if isinstance(exc, ReadOnlyBrokerError):  # RocketMQ: a slave's store forbids puts
        return RpcFailure(Code.FORBIDDEN, text)
    if isinstance(exc, (FencedError, NotEnoughReplicasError)):  # not stored / not served: the client retries
        return RpcFailure(Code.HA_NOT_AVAILABLE, text)
    if isinstance(exc, MessageTooLargeError):
        return RpcFailure(Code.MESSAGE_BODY_TOO_LARGE, text)
    if isinstance(exc, InvalidNameError):
        code = Code.ILLEGAL_CONSUMER_GROUP if text.startswith("group") else Code.ILLEGAL_TOPIC
        return RpcFailure(code, text)
    if isinstance(exc, ValidationError):
        return RpcFailure(Code.BAD_REQUEST, text)
    if isinstance(exc, TopicError):
        code = Code.TOPIC_NOT_FOUND if "does not exist" in text else Code.ILLEGAL_TOPIC
        return RpcFailure(code, text)
    if isinstance(exc, FilterError):
        return RpcFailure(Code.ILLEGAL_FILTER_EXPRESSION, text)
    if isinstance(exc, DelayUnsupportedError):
        return RpcFailure(Code.UNSUPPORTED, text)
    if isinstance(exc, DelayError):
        return RpcFailure(Code.ILLEGAL_DELIVERY_TIME, text)
    if isinstance(exc, TransactionError):
        code = Code.INVALID_TRANSACTION_ID if "transaction id" in text else Code.BAD_REQUEST
        return RpcFailure(code, text)
    if isinstance(exc, StoreFullError):
        return RpcFailure(Code.INTERNAL_SERVER_ERROR,
                          f"{action} refused: {text} (free disk space on the broker, then retry)")
    if isinstance(exc, StoreError):
        return RpcFailure(Code.INTERNAL_SERVER_ERROR, f"{action} failed in the message store: {text}")
    if isinstance(exc, ClientError):
        return RpcFailure(Code.INTERNAL_SERVER_ERROR, f"{action} failed: {text} (the server is shutting down?)")
    if isinstance(exc, PlugmqError):
        return RpcFailure(Code.INTERNAL_SERVER_ERROR, f"{action} failed: {text}")
    log.error("unexpected error in a request", action=action, error=repr(exc), exc_info=exc)
    return RpcFailure(Code.INTERNAL_SERVER_ERROR,
                      f"{action} failed with an internal error ({type(exc).__name__}: {text}); "
                      "the server log has the traceback")


def status_of(exc: BaseException, *, action: str) -> Status:
    return failure_of(exc, action=action).status


def overall(statuses: list[Status]) -> Status:
    """A response's status over its entries' statuses: OK, the one status, or MULTIPLE_RESULTS."""
    if all(s.code == Code.OK for s in statuses):
        return ok()
    if len(statuses) == 1:
        return statuses[0]
    return Status(code=Code.MULTIPLE_RESULTS, message="entries have different results; see each entry's status")
