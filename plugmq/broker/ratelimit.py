"""Rate limits enforced by the broker: token buckets on its clock (plugmq.config.limits says which).

A bucket fills at its rate up to ``burst_s`` seconds' worth and starts full. Sends take what they
store, all or nothing: a send over its topic's or account's limit is refused with the time after
which it would pass. Consumption takes up to what a request asks for, by message count before
reading (a receive or pull gets at most as many messages as there are tokens) and by bytes after
reading (a request gets as many messages as the bytes left cover at the mean size handed out so
far, and a bucket may go into debt for what they really weighed; the next request waits until the
debt is paid). Tokens a request took and did not use are given back.

Everything is off unless a limit is configured or set through admin: the send and receive paths
ask one dict each (empty when there are no limits).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence

import attrs

from plugmq.config.limits import LIMIT_KINDS, RateLimit, RateLimits, check_limit_name
from plugmq.core.clock import Clock
from plugmq.core.errors import RateLimitedError
from plugmq.core.logs import get_logger

__all__ = ["LimitView", "RateLimiter", "TokenBucket"]

log = get_logger(__name__)

_KIND_NAMES = {"groups": "group", "topics": "topic", "accounts": "account"}


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity``; not thread-safe (the limiter locks)."""

    def __init__(self, clock: Clock, rate: float, capacity: float) -> None:
        self._clock = clock
        self.rate = rate
        self.capacity = max(capacity, 1.0)
        self.tokens = self.capacity
        self._at = clock.now()

    def _refill(self) -> None:
        now = self._clock.now()
        elapsed = now - self._at
        self._at = now
        if elapsed > 0:  # a clock stepping back adds nothing (and takes nothing)
            self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)

    def available(self) -> float:
        self._refill()
        return self.tokens

    def take(self, amount: float) -> None:
        """Take ``amount`` (the bucket may go below zero: a debt later requests wait out)."""
        self._refill()
        self.tokens -= amount

    def give_back(self, amount: float) -> None:
        self.tokens = min(self.capacity, self.tokens + amount)

    def wait_s(self, amount: float = 1.0) -> float:
        """Seconds until ``amount`` tokens are there (0 when they are)."""
        missing = min(amount, self.capacity) - self.available()
        return max(0.0, missing / self.rate)


@attrs.frozen
class LimitView:
    """A limit as admin shows it: where it applies and what it allows."""

    kind: str
    name: str
    messages_per_s: float | None
    bytes_per_s: float | None
    burst_s: float


class _Limit:
    """The buckets of one configured limit (one per unit it limits)."""

    def __init__(self, clock: Clock, limit: RateLimit) -> None:
        self.limit = limit
        self.messages = (TokenBucket(clock, limit.messages_per_s, limit.messages_per_s * limit.burst_s)
                         if limit.messages_per_s is not None else None)
        self.bytes = (TokenBucket(clock, limit.bytes_per_s, limit.bytes_per_s * limit.burst_s)
                      if limit.bytes_per_s is not None else None)
        self.message_bytes: float | None = None  # a moving mean of what consumers got: bytes -> messages

    def messages_for_bytes(self) -> int:
        """How many messages the byte bucket covers now, by the mean size handed out so far (one
        while there is none): a byte limit caps how many a request gets before anything is read."""
        assert self.bytes is not None
        available = self.bytes.available()
        if available < 1:
            return 0
        return 1 if self.message_bytes is None else max(1, math.floor(available / self.message_bytes))

    def learn(self, delivered: int, body_bytes: int) -> None:
        if delivered:
            mean = body_bytes / delivered
            self.message_bytes = mean if self.message_bytes is None else 0.8 * self.message_bytes + 0.2 * mean

    def wait_s(self, messages: int, body_bytes: int) -> float:
        return max(self.messages.wait_s(messages) if self.messages is not None else 0.0,
                   self.bytes.wait_s(max(body_bytes, 1)) if self.bytes is not None else 0.0)


class RateLimiter:
    """The broker's rate limits; thread-safe. ``send`` (topics, accounts) and ``grant`` / ``settle``
    (groups, accounts) are what the put and consume paths call."""

    def __init__(self, clock: Clock, configured: RateLimits) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # (kind, name) -> buckets; accounts have one set for sending and one for receiving
        self._send: dict[tuple[str, str], _Limit] = {}
        self._receive: dict[tuple[str, str], _Limit] = {}
        # Whether any send limit is set: the plain put's plan reads it on every send, lock-free.
        self.limits_sends = False
        for kind in LIMIT_KINDS:
            for name, limit in configured.of(kind).items():
                self._install(kind, name, limit)

    @property
    def active(self) -> bool:
        return bool(self._send or self._receive)

    def _install(self, kind: str, name: str, limit: RateLimit | None) -> None:
        key = (kind, name)
        self._send.pop(key, None)
        self._receive.pop(key, None)
        if limit is not None and kind in ("topics", "accounts"):
            self._send[key] = _Limit(self._clock, limit)
        if limit is not None and kind in ("groups", "accounts"):
            self._receive[key] = _Limit(self._clock, limit)
        self.limits_sends = bool(self._send)

    # ------------------------------------------------------------------------------ admin
    def set(self, kind: str, name: str, limit: RateLimit | None) -> None:
        """Set (or with None remove) the limit on ``name`` of ``kind`` (groups, topics, accounts)."""
        check_limit_name(kind, name)
        with self._lock:
            self._install(kind, name, limit)
        log.info("rate limit changed", kind=kind, name=name, limit=None if limit is None else attrs.asdict(limit))

    def views(self) -> list[LimitView]:
        with self._lock:
            found = {**self._receive, **self._send}
            return [LimitView(kind, name, lim.limit.messages_per_s, lim.limit.bytes_per_s, lim.limit.burst_s)
                    for (kind, name), lim in sorted(found.items())]

    # ------------------------------------------------------------------------------ sends
    def send(self, topic: str, account: str | None, messages: int, body_bytes: int) -> None:
        """Take a send of ``messages`` totalling ``body_bytes`` from its topic's and account's limits,
        or raise RateLimitedError (nothing taken) with the wait after which it would pass."""
        if not self._send:
            return
        limits = self._applicable(self._send, (("topics", topic), ("accounts", account)))
        if not limits:
            return
        with self._lock:
            waits = [(lim.wait_s(messages, body_bytes), kind, name, lim) for kind, name, lim in limits]
            slowest = max(waits, key=lambda w: w[0])
            if slowest[0] > 0:
                raise _refused("send", slowest[1], slowest[2], slowest[3].limit, slowest[0])
            for _wait, _kind, _name, lim in waits:
                if lim.messages is not None:
                    lim.messages.take(messages)
                if lim.bytes is not None:
                    lim.bytes.take(body_bytes)

    # ------------------------------------------------------------------------------ consumption
    def grant(self, group: str, account: str | None, wanted: int) -> int:
        """How many of ``wanted`` messages ``group`` (and ``account``) may receive now, taken from
        their limits; RateLimitedError when none (``settle`` afterwards with what was delivered)."""
        if not self._receive:
            return wanted
        limits = self._applicable(self._receive, (("groups", group), ("accounts", account)))
        if not limits:
            return wanted
        with self._lock:
            allowed = wanted
            for _kind, _name, lim in limits:
                if lim.bytes is not None:
                    allowed = min(allowed, lim.messages_for_bytes())
                if lim.messages is not None:
                    allowed = min(allowed, math.floor(lim.messages.available()))
            if allowed <= 0:
                kind, name, lim = max(limits, key=lambda entry: entry[2].wait_s(1, 1))
                raise _refused("receive", kind, name, lim.limit, max(lim.wait_s(1, 1), 0.001))
            for _kind, _name, lim in limits:
                if lim.messages is not None:
                    lim.messages.take(allowed)
            return allowed

    def settle(self, group: str, account: str | None, granted: int, delivered: int, body_bytes: int) -> None:
        """After a ``grant``: give back what was not delivered, charge the bytes that were."""
        if not self._receive:
            return
        limits = self._applicable(self._receive, (("groups", group), ("accounts", account)))
        with self._lock:
            for _kind, _name, lim in limits:
                if lim.messages is not None and granted > delivered:
                    lim.messages.give_back(granted - delivered)
                if lim.bytes is not None and body_bytes:
                    lim.bytes.take(body_bytes)
                    lim.learn(delivered, body_bytes)

    @staticmethod
    def _applicable(table: Mapping[tuple[str, str], _Limit], keys: Sequence[tuple[str, str | None]]
                    ) -> list[tuple[str, str, _Limit]]:
        found = []
        for kind, name in keys:
            if name is None:
                continue
            limit = table.get((kind, name))
            if limit is not None:
                found.append((kind, name, limit))
        return found


def _refused(action: str, kind: str, name: str, limit: RateLimit, wait_s: float) -> RateLimitedError:
    parts = [f"{limit.messages_per_s:g} messages/s" if limit.messages_per_s is not None else "",
             f"{limit.bytes_per_s:g} bytes/s" if limit.bytes_per_s is not None else ""]
    allowed = " and ".join(p for p in parts if p)
    retry_ms = max(1, math.ceil(wait_s * 1000))
    return RateLimitedError(f"{action} refused: {_KIND_NAMES[kind]} {name!r} is limited to {allowed}; retry in "
                            f"{retry_ms} ms", retry_after_ms=retry_ms)
