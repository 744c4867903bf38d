"""The websocket Origin check: scheme, host and port must be this server's own, or a trusted origin."""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


def parse_origin(value: str) -> Origin | None:
    """(scheme, host, port) of an http(s) origin, or None for anything else."""
    try:
        parts = urlsplit(value.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.username is not None:
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def own_origin(scope: dict, headers: dict[bytes, bytes]) -> Origin | None:
    """The origin the browser used to reach us: the Host header (if allowed) and the scheme of the socket.

    Behind a TLS proxy (DJANGO_HTTPS=1) the proxy's X-Forwarded-Proto says https,
    as for HTTP requests (SECURE_PROXY_SSL_HEADER).
    """
    host = headers.get(b"host", b"").decode("latin-1")
    domain, port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if scope.get("scheme") == "wss" else "http"
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name = proxy_header[0].removeprefix("HTTP_").replace("_", "-").lower().encode()
        forwarded = headers.get(name, b"").decode("latin-1").split(",")[0].strip().lower()
        if forwarded == proxy_header[1]:
            scheme = "https"
    try:
        return scheme, domain.strip("[]"), int(port) if port else DEFAULT_PORTS[scheme]
    except ValueError:
        return None


def trusted(origin: Origin) -> bool:
    """Whether DJANGO_CSRF_TRUSTED_ORIGINS names this origin (`https://*.example.com` covers subdomains)."""
    scheme, host, port = origin
    for entry in settings.CSRF_TRUSTED_ORIGINS:
        wildcard = "://*." in entry
        allowed = parse_origin(entry.replace("://*.", "://", 1))
        if allowed is None or allowed[0] != scheme or allowed[2] != port:
            continue
        if host == allowed[1] or (wildcard and is_same_domain(host, "." + allowed[1])):
            return True
    return False


def origin_allowed(scope: dict) -> bool:
    """Whether a websocket handshake comes from a page of this server (or a trusted origin)."""
    headers = dict(scope.get("headers", ()))
    origin = parse_origin(headers.get(b"origin", b"").decode("latin-1"))
    if origin is None:
        return False
    return origin == own_origin(scope, headers) or trusted(origin)


class OriginValidator:
    """Refuses (403 at the handshake) a websocket whose Origin is not this server's own or a trusted one."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
