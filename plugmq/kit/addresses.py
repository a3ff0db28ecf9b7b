"""Whether an address is reachable from other machines (shared by the server and the plugins)."""

from __future__ import annotations

import ipaddress

__all__ = ["beyond_loopback"]


def beyond_loopback(host: str) -> bool:
    """Whether a listening ``host`` is reachable from other machines (anything but loopback)."""
    host = host.strip("[]")
    if host in ("localhost", "ip6-localhost"):
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a host name: whatever it resolves to may be public
