"""The ha channel authenticated both ways with the cluster secret, and sealed after that.

A slave and a master that share the cluster secret (``[plugins.ha] secret_file``) prove it to
each other before anything else crosses the connection::

    slave  -> master  AUTH       nonce_s (32 random bytes)
    master -> slave   CHALLENGE  nonce_m
    slave  -> master  PROVE      epoch_s, HMAC(k, "slave"  | nonce_s | nonce_m | broker name | epoch_s)
    master -> slave   PROVE      epoch_m, HMAC(k, "master" | nonce_s | nonce_m | broker name | epoch_m)

where ``k`` is HKDF-SHA256 of the secret with the broker name, so a broker of another name (or
without the secret) fails. Fresh nonces on both sides make every proof good for one connection
only; the labels keep a slave's proof from passing for a master's. The slave proves first, so a
stranger calling the master learns nothing; a process owning the address a slave follows gets
a proof it can use nowhere. Every later frame (HELLO, WELCOME, DATA, ACK) carries a tag,
HMAC(session key, direction | sequence number | frame), so nobody in the middle can inject,
alter, replay or reorder a frame of an authenticated connection. The secret never crosses
the wire. Keys for other purposes (receipt handles) are derived from the same secret
(:func:`derive_key`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from plugmq.core.errors import ReplicationError
from plugmq.kit.clustersecret import derive_key, read_secret

__all__ = ["Authenticator", "Session", "derive_key", "parse_nonce", "read_secret"]

NONCE_BYTES = 32
TAG_BYTES = 16
_LABEL = b"plugmq-ha-v1\0"


class Session:
    """Tags the frames one side sends and checks those it receives on one authenticated connection."""

    def __init__(self, key: bytes, *, master: bool) -> None:
        self._key = key
        self._send_label, self._receive_label = (b"m", b"s") if master else (b"s", b"m")
        self._sent = 0
        self._received = 0

    def _tag(self, label: bytes, sequence: int, *parts: bytes | bytearray) -> bytes:
        mac = hmac.new(self._key, label + sequence.to_bytes(8, "big"), hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()[:TAG_BYTES]

    def seal(self, frame: bytes) -> bytes:
        """``frame`` followed by its tag (call in the order the frames are sent)."""
        tag = self._tag(self._send_label, self._sent, frame)
        self._sent += 1
        return frame + tag

    def check(self, head: bytes | bytearray, payload: bytes | bytearray, tag: bytes | bytearray, peer: str) -> None:
        """Raise ReplicationError unless ``tag`` is the peer's next tag over this frame."""
        want = self._tag(self._receive_label, self._received, head, payload)
        if not hmac.compare_digest(want, tag):
            raise ReplicationError(f"a frame from replication peer {peer} failed its authentication tag "
                                   "(altered, injected or replayed on the way); dropping the connection")
        self._received += 1


class Authenticator:
    """One broker name's side of the handshake (see the module doc)."""

    def __init__(self, secret: bytes, broker_name: str) -> None:
        self.broker_name = broker_name
        self._key = derive_key(secret, "ha channel", broker_name)

    @staticmethod
    def nonce() -> bytes:
        return secrets.token_bytes(NONCE_BYTES)

    def proof(self, role: str, slave_nonce: bytes, master_nonce: bytes, epoch: int) -> bytes:
        message = (_LABEL + role.encode() + b"\0" + slave_nonce + master_nonce + self.broker_name.encode() + b"\0"
                   + str(epoch).encode())
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def verify(self, role: str, slave_nonce: bytes, master_nonce: bytes, epoch: object, proof: object) -> bool:
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not isinstance(proof, str):
            return False
        try:
            given = bytes.fromhex(proof)
        except ValueError:
            return False
        return hmac.compare_digest(given, self.proof(role, slave_nonce, master_nonce, epoch))

    def session(self, slave_nonce: bytes, master_nonce: bytes, *, master: bool) -> Session:
        key = hmac.new(self._key, _LABEL + b"session\0" + slave_nonce + master_nonce, hashlib.sha256).digest()
        return Session(key, master=master)


def parse_nonce(value: object) -> bytes | None:
    """A hex nonce of the right length from a handshake frame, else None."""
    if not isinstance(value, str) or len(value) != 2 * NONCE_BYTES:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None
