"""Who a request came from: the TCP peer, or behind trusted proxies the address they forwarded."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(entries: Sequence[str]) -> tuple[Network, ...]:
    """DJANGO_TRUSTED_PROXIES's entries (addresses or networks) as networks."""
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def is_trusted(address: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in trusted)


def client_address(peer: str, forwarded_for: str, trusted: Sequence[Network]) -> str:
    """The peer, or when it is a trusted proxy the right-most X-Forwarded-For entry that is not one
    (the left part is the client's to forge)."""
    if not is_trusted(peer, trusted):
        return peer
    for hop in reversed([hop.strip() for hop in forwarded_for.split(",") if hop.strip()]):
        if not is_trusted(hop, trusted):
            return hop
    return peer
