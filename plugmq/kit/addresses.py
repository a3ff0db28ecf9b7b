"""Whether an address is reachable from other machines, and the warning when a port listens there
without TLS or access control (shared by the server and the plugins)."""

from __future__ import annotations

import ipaddress

from plugmq.core.logs import get_logger

__all__ = ["beyond_loopback", "exposed_warning"]

log = get_logger(__name__)


def beyond_loopback(host: str) -> bool:
    """Whether a listening ``host`` is reachable from other machines (anything but loopback)."""
    host = host.strip("[]")
    if host in ("localhost", "ip6-localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: whatever it resolves to may be public


def exposed_warning(port: str, address: str, *, tls: bool, authenticated: bool, fix: str) -> bool:
    """Log a SECURITY warning when ``address`` listens beyond loopback without TLS or without
    access control (``fix`` says what to configure); True when it warned."""
    host = address.rpartition(":")[0]
    if not beyond_loopback(host) or (tls and authenticated):
        return False
    lacking = " and ".join(what for what, have in (("TLS", tls), ("access control", authenticated)) if not have)
    log.warning(f"SECURITY: the {port} listens on {address}, beyond loopback, without {lacking}: anyone on the "
                "network can " + ("read what it serves in clear" if not tls else "use it without credentials")
                + f"; {fix}", port=port, address=address, tls=tls, acl=authenticated)
    return True
