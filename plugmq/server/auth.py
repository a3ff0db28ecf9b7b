"""Access control: the RocketMQ 5 client's HMAC-SHA1 request signature and per-topic permissions.

Clients send ``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
Signature=<hex>`` where the signature is HMAC-SHA1(secret, value of ``x-mq-date-time``).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from hashlib import sha1

from plugmq.server.options import Account, AclOptions
from plugmq.server.protocol import Code
from plugmq.server.status import RpcFailure

__all__ = ["Authenticator"]

_SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"


def _fields(authorization: str) -> dict[str, str]:
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme != _SCHEME:
        raise RpcFailure(Code.UNAUTHORIZED, f"authorization scheme {scheme!r} is not {_SCHEME}; "
                                            "use a RocketMQ 5 client with credentials (access key and secret)")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, _, value = part.strip().partition("=")
        fields[key] = value
    return fields


class Authenticator:
    """Checks a call's signature (when access control is on) and an account's topic permissions."""

    def __init__(self, acl: AclOptions) -> None:
        self._acl = acl

    @property
    def enabled(self) -> bool:
        return self._acl.enabled

    def account(self, metadata: Mapping[str, str]) -> Account | None:
        """The signed-in account, None when access control is off; UNAUTHORIZED otherwise."""
        if not self._acl.enabled:
            return None
        authorization = metadata.get("authorization", "")
        if not authorization:
            raise RpcFailure(Code.UNAUTHORIZED, "access control is on and the request carries no signature; "
                                                "configure the client with Credentials(access_key, secret)")
        fields = _fields(authorization)
        access_key = fields.get("Credential", "")
        account = self._acl.accounts.get(access_key)
        if account is None:
            raise RpcFailure(Code.UNAUTHORIZED, f"access key {access_key!r} is unknown to this server; "
                                                "check the client's credentials or the server's [server.acl.accounts]")
        date = metadata.get(DATE_HEADER, "")
        if not date or fields.get("SignedHeaders", "") != DATE_HEADER:
            raise RpcFailure(Code.UNAUTHORIZED, f"the signature must cover the {DATE_HEADER} header, which is missing")
        expected = hmac.new(account.secret.encode(), date.encode(), sha1).hexdigest()
        if not hmac.compare_digest(expected, fields.get("Signature", "").lower()):
            raise RpcFailure(Code.UNAUTHORIZED, f"signature of access key {access_key!r} does not match; "
                                                "the client's secret key is wrong")
        return account

    def require(self, account: Account | None, action: str, topic: str) -> None:
        """FORBIDDEN unless ``account`` may ``action`` ("publish" / "subscribe") on ``topic``."""
        if account is None or not self._acl.enabled:
            return
        if not account.may(action, topic):
            raise RpcFailure(Code.FORBIDDEN, f"access key {account.access_key!r} may not {action} "
                                             f"{'to' if action == 'publish' else 'from'} topic {topic!r}; "
                                             f"add it to [server.acl.accounts.{account.access_key}] {action}")
