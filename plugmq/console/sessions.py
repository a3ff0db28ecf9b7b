"""Signed-in sessions: a random token in an HttpOnly, SameSite=Strict cookie, the account kept server-side.

The account's secret never leaves the console process (the cookie holds only the token). Each
session has its own CSRF token, which every form carries and every POST must return; the login
form, before any session exists, uses a double-submit token (a cookie and a form field that must
match). Sessions end at sign-out or after ``ttl_s`` on the console's clock.
"""

from __future__ import annotations

import hmac
import secrets
import threading

import attrs

from plugmq.console.brokers import Credentials
from plugmq.core.clock import Clock

__all__ = ["SESSION_COOKIE", "Session", "Sessions", "tokens_match"]

SESSION_COOKIE = "plugmq_console"


def tokens_match(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; an absent token never matches."""
    return bool(given) and bool(expected) and hmac.compare_digest(str(given), str(expected))


@attrs.define
class Session:
    token: str
    credentials: Credentials | None
    csrf: str
    expires_at: float
    last_seen: float


class Sessions:
    """Live sessions by token (in memory: a restarted console asks everyone to sign in again)."""

    def __init__(self, clock: Clock, ttl_s: float = 8 * 3600) -> None:
        self._clock = clock
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._by_token: dict[str, Session] = {}

    def create(self, credentials: Credentials | None) -> Session:
        now = self._clock.now()
        session = Session(secrets.token_urlsafe(32), credentials, secrets.token_urlsafe(32), now + self._ttl, now)
        with self._lock:
            self._by_token[session.token] = session
        return session

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        now = self._clock.now()
        with self._lock:
            session = self._by_token.get(token)
            if session is None:
                return None
            if session.expires_at <= now:
                del self._by_token[token]
                return None
            session.last_seen = now
            return session

    def end(self, token: str | None) -> Session | None:
        with self._lock:
            return self._by_token.pop(token, None) if token else None

    def latest(self) -> Session | None:
        """The live session seen last (the lag sampler signs with its account)."""
        now = self._clock.now()
        with self._lock:
            live = [s for s in self._by_token.values() if s.expires_at > now]
        return max(live, key=lambda s: s.last_seen, default=None)
