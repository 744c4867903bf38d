"""The process's HTTP client for upstreams, and where it may not send requests."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
import weakref
from urllib.parse import urlsplit

import aiohttp
import httpx

from chat.streaming.upstream.errors import UpstreamError

# --- the shared client --------------------------------------------------------


def make_client(
    max_connections: int = 1000, transport: str = "aiohttp", *, allow_link_local: bool = False
) -> httpx.AsyncClient:
    """A client for many concurrent long streams; `transport` is "aiohttp" or "httpx".

    Unless `allow_link_local`, it refuses to send anything to a link-local or cloud metadata address.
    """
    # Idle connections are dropped after 4 s, before the 5 s after which many servers
    # (uvicorn, Node) close them: fewer requests written to a connection closing under them.
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections // 4, keepalive_expiry=4.0
    )
    hooks = {} if allow_link_local else {"request": [DestinationGuard()]}
    if transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport, HttpxAiohttpClient

        made = AiohttpTransport(limits=limits, trust_env=False)

        def session() -> aiohttp.ClientSession:
            # httpx-aiohttp's own session, but with no cookie jar (see below).
            connector = aiohttp.TCPConnector(
                limit=max_connections, keepalive_timeout=limits.keepalive_expiry, ssl=made.ssl_context
            )
            return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

        made.client = session  # called once, in the event loop, at the first request
        client = HttpxAiohttpClient(limits=limits, trust_env=False, event_hooks=hooks, transport=made)
    else:
        client = httpx.AsyncClient(limits=limits, trust_env=False, event_hooks=hooks)
    # One client serves everyone's requests: a cookie set in answer to one person (a CDN's
    # __cf_bm, a gateway's session) must not go out with everybody's next ones. httpx would
    # keep it (and parse every answer's headers through urllib's cookie machinery to look, on
    # every stream's start), so would aiohttp's session; neither jar keeps anything now.
    client._cookies = NoCookies()  # the `cookies` setter would copy it into a plain jar
    return client


class NoCookies(httpx.Cookies):
    """A client's cookie jar that keeps none of the cookies its answers set."""

    def extract_cookies(self, response: httpx.Response) -> None:
        pass


# One client per event loop: a client's connections belong to the loop that opened them.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def shared_client(
    max_connections: int = 1000, transport: str = "aiohttp", *, allow_link_local: bool = False
) -> httpx.AsyncClient:
    """This process's client for the running event loop, created on first use."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = _clients[loop] = make_client(max_connections, transport, allow_link_local=allow_link_local)
    return client


async def close_shared_client() -> None:
    """Close the running loop's client (tests and shutdown)."""
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


# --- where requests may go ----------------------------------------------------

# Link-local networks hold the cloud metadata services (169.254.169.254; fd00:ec2::254 on
# AWS over IPv6; 100.100.100.200 on Alibaba Cloud), which hand credentials to whoever asks.
REFUSED_NETWORKS = tuple(
    ipaddress.ip_network(network)
    for network in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32")
)
DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int | str | None]:
    """(scheme, host, port) of a URL, the scheme's default port filled in: the server a key is sent to."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port: int | str | None = parts.port
    except ValueError:
        port = parts.netloc.rsplit(":", 1)[-1]  # not a valid port: compared as written
    return scheme, (parts.hostname or "").rstrip("."), port or DEFAULT_PORTS.get(scheme)


def refused_ip(address: str) -> bool:
    """Whether an IP address (IPv4, IPv6, IPv4-mapped IPv6) is link-local or a metadata service."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return any(ip in network for network in REFUSED_NETWORKS)


def _numeric_addresses(host: str) -> list[str] | None:
    """The address(es) when `host` is an IP address in any spelling the C library accepts, else None."""
    bare = host.strip("[]").split("%", 1)[0]
    try:
        # AI_NUMERICHOST: 2852039166 and 0xa9.0xfe.0xa9.0xfe are 169.254.169.254 too; DNS is never asked.
        infos = socket.getaddrinfo(bare, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    return [info[4][0] for info in infos]


def refused_literal(host: str) -> str | None:
    """The refused address when `host` is written as a link-local or metadata IP address."""
    return next((a for a in _numeric_addresses(host) or [] if refused_ip(a)), None)


class DestinationGuard:
    """An httpx request hook refusing link-local and metadata addresses, written or resolved.

    A name's addresses are looked up before the request and the verdict kept a minute;
    the connection resolves it again, so a DNS server answering differently the second
    time is not caught here (a firewall rule is the complete guard).
    """

    TTL = 60.0

    def __init__(self) -> None:
        self._verdicts: dict[str, tuple[float, str | None]] = {}

    async def __call__(self, request: httpx.Request) -> None:
        host = request.url.host
        now = time.monotonic()
        cached = self._verdicts.get(host)
        if cached and cached[0] > now:
            address = cached[1]
        else:
            addresses = _numeric_addresses(host)
            if addresses is None:
                addresses = await self._resolve(host, request.url.port or DEFAULT_PORTS.get(request.url.scheme, 443))
            address = next((a for a in addresses if refused_ip(a)), None)
            if len(self._verdicts) > 1000:
                self._verdicts.clear()
            self._verdicts[host] = (now + self.TTL, address)
        if address:
            raise UpstreamError(
                "connect", f"its address {address} is link-local or a cloud metadata service, which is refused"
            )

    @staticmethod
    async def _resolve(host: str, port: int) -> list[str]:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            return []  # the connection attempt reports it
        return [info[4][0] for info in infos]
