"""Access control: the RocketMQ 5 client's HMAC-SHA1 request signature, its date window, and the
topic and group permissions of the signed-in account.

Clients send ``authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
Signature=<hex>`` where the signature is HMAC-SHA1(secret, value of ``x-mq-date-time``), a UTC
time ``yyyyMMddTHHmmssZ``. A signature is good only while that time is within
``clock_skew_s`` of the server's clock (RocketMQ 5.3: 15 minutes), so a captured request cannot
be replayed a day later.

The accounts can change while the server runs: :class:`Authenticator` re-reads the file holding
them when it changes (checked on the broker's clock) and on :meth:`Authenticator.reload`
(``plugmq serve`` calls it on SIGHUP). A file that does not parse keeps the accounts as they were.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from hashlib import sha1
from pathlib import Path

from plugmq.core.clock import Clock, Timer
from plugmq.core.errors import ConfigError
from plugmq.core.logs import get_logger
from plugmq.server.acl import Account, AclOptions, reload_acl
from plugmq.server.protocol import Code
from plugmq.server.status import RpcFailure

__all__ = ["DATE_FORMAT", "DATE_HEADER", "Authenticator"]

log = get_logger(__name__)

_SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"


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


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


class Authenticator:
    """Checks a call's signature (when access control is on) and an account's permissions."""

    def __init__(self, acl: AclOptions, clock: Clock | None = None) -> None:
        self._acl = acl
        self._clock = clock
        self._lock = threading.Lock()
        self._seen_mtime = _mtime(acl.source)
        self._timer: Timer | None = None
        self._closed = False
        if acl.enabled and acl.source is not None and clock is not None:
            self._timer = clock.call_later(acl.reload_check_s, self._check_file)

    @property
    def enabled(self) -> bool:
        return self._acl.enabled

    @property
    def acl(self) -> AclOptions:
        return self._acl

    # ------------------------------------------------------------------------------ reload
    def reload(self) -> bool:
        """Read the accounts again from the file holding them; False (logged) when it is invalid."""
        with self._lock:
            self._seen_mtime = _mtime(self._acl.source)
            try:
                fresh = reload_acl(self._acl)
            except ConfigError as exc:
                log.error("accounts not reloaded; the previous ones stay in force", error=str(exc))
                return False
            self._acl = fresh
        log.info("accounts reloaded", source=str(fresh.source), accounts=len(fresh.accounts))
        return True

    def _check_file(self) -> None:
        if self._closed or self._clock is None:
            return
        try:
            if _mtime(self._acl.source) != self._seen_mtime:
                self.reload()
        finally:
            if not self._closed:
                self._timer = self._clock.call_later(self._acl.reload_check_s, self._check_file)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()

    # ------------------------------------------------------------------------------ checks
    def _check_date(self, date: str) -> None:
        skew = self._acl.clock_skew_s
        try:
            signed = datetime.strptime(date, DATE_FORMAT).replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise RpcFailure(Code.UNAUTHORIZED, f"the signed {DATE_HEADER} {date!r} is not a UTC time "
                                                "yyyyMMddTHHmmssZ; use a RocketMQ 5 client") from None
        now = self._clock.now() if self._clock is not None else datetime.now(UTC).timestamp()
        off = signed - now
        if abs(off) > skew:
            raise RpcFailure(Code.UNAUTHORIZED, f"the signature's {DATE_HEADER} {date} is {abs(off):.0f} s "
                                                f"{'ahead of' if off > 0 else 'behind'} the server's clock; the "
                                                f"allowed clock skew is {skew:g} s (server.acl.clock_skew_s): a "
                                                "replayed request, or a client clock that is off (check NTP)")

    def account(self, metadata: Mapping[str, str]) -> Account | None:
        """The signed-in account, None when access control is off; UNAUTHORIZED otherwise."""
        acl = self._acl
        if not acl.enabled:
            return None
        authorization = metadata.get("authorization", "")
        if not authorization:
            raise RpcFailure(Code.UNAUTHORIZED, "access control is on and the request carries no signature; "
                                                "configure the client with Credentials(access_key, secret)")
        fields = _fields(authorization)
        access_key = fields.get("Credential", "")
        account = acl.accounts.get(access_key)
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
        self._check_date(date)
        return account

    def require(self, account: Account | None, action: str, topic: str) -> None:
        """FORBIDDEN unless ``account`` may ``action`` ("publish" / "subscribe") on ``topic``."""
        if account is None or not self._acl.enabled:
            return
        if not account.may(action, topic):
            raise RpcFailure(Code.FORBIDDEN, f"access key {account.access_key!r} may not {action} "
                                             f"{'to' if action == 'publish' else 'from'} topic {topic!r}; "
                                             f"add it to [server.acl.accounts.{account.access_key}] {action}")

    def require_group(self, account: Account | None, group: str) -> None:
        """FORBIDDEN unless ``account`` may consume as ``group`` (RocketMQ ACL 2.0's group SUB)."""
        if account is None or not self._acl.enabled:
            return
        if not account.may_consume(group):
            raise RpcFailure(Code.FORBIDDEN, f"access key {account.access_key!r} may not consume as group "
                                             f"{group!r}; add it to [server.acl.accounts.{account.access_key}] "
                                             "groups")
