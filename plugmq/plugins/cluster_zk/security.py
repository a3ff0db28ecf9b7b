"""The cluster's credential on ZooKeeper: digest authentication, ACLs and signed registrations.

With ``[plugins.cluster_zk] secret_file`` (the cluster secret, the same file as ``[plugins.ha]
secret_file``) each broker's session authenticates with the digest scheme as user ``plugmq``
with a password derived from the secret and the cluster name, and every node plugmq creates
under ``<chroot>/<cluster>`` carries one ACL: that credential may do everything, nobody else
anything - not even read, so a stranger on the network cannot map the cluster's brokers either
(ZooKeeper's super user still can). The chroot node itself stays open, since several clusters
may share it.

A registration is also signed: an HMAC with another key derived from the secret over its JSON,
stored beside it. A broker routes only registrations whose signature holds, so even a
ZooKeeper left open by mistake (or whose ACLs an operator loosened) never routes a stranger.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from kazoo.security import ACL, OPEN_ACL_UNSAFE, make_digest_acl

from plugmq.core import ValidationError
from plugmq.kit.clustersecret import derive_key

__all__ = ["OPEN_ACL", "ZkSecurity", "json_object"]

OPEN_ACL: list[ACL] = list(OPEN_ACL_UNSAFE)
_USER = "plugmq"
_SIGNATURE = "signature"


def json_object(raw: bytes | None, what: str) -> dict[str, Any]:
    """The JSON object a node holds; ValidationError naming ``what`` when it holds something else."""
    try:
        body = json.loads(raw or b"")
    except ValueError as exc:
        raise ValidationError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ValidationError(f"{what} holds {type(body).__name__}, not an object")
    return body


class ZkSecurity:
    """One cluster's credential (None secret: an open cluster, nothing checked)."""

    def __init__(self, secret: bytes | None, cluster: str) -> None:
        self.enabled = secret is not None
        if secret is None:
            self._password = ""
            self._signing = b""
            return
        self._password = base64.b64encode(derive_key(secret, "zookeeper digest", cluster)).decode()
        self._signing = derive_key(secret, "zookeeper registrations", cluster)

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        return [("digest", f"{_USER}:{self._password}")] if self.enabled else []

    @property
    def acl(self) -> list[ACL]:
        """The ACL of every node plugmq creates: the cluster's credential only (open without a secret)."""
        return [make_digest_acl(_USER, self._password, all=True)] if self.enabled else OPEN_ACL

    def _mac(self, body: dict[str, Any]) -> str:
        text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self._signing, text, hashlib.sha256).hexdigest()

    def seal(self, body: dict[str, Any]) -> bytes:
        """A registration's node data: its JSON, signed when the cluster has a secret."""
        if self.enabled:
            body = {**body, _SIGNATURE: self._mac(body)}
        return json.dumps(body, sort_keys=True).encode()

    def open(self, raw: bytes | None) -> dict[str, Any]:
        """The JSON object in a registration's node; ValidationError when it is not one, or (with a
        secret) when its signature is missing or does not hold."""
        body = json_object(raw, "registration node")
        signature = body.pop(_SIGNATURE, None)
        if self.enabled and not (isinstance(signature, str)
                                 and hmac.compare_digest(signature.encode(), self._mac(body).encode())):
            raise ValidationError("not signed with the cluster secret (written by a stranger, or by a broker "
                                  "with another secret_file)")
        return body
