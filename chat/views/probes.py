"""GET /healthz, /readyz and /metrics: plain ASGI, before Django (no middleware, sessions or access log).

* /healthz: the process serves (its event loop answers). Nothing else is looked at.
* /readyz: the database (`SELECT 1`), the channel layer (Redis `PING`; the in-memory one is always
  there) and the providers (at least one answers its `GET /models`), each with its latency;
  503 naming the failing part. The database is asked on a thread of its own with its own
  connection, so a busy stream pool neither delays the answer nor is delayed by it; every part
  has CHECK_TIMEOUT seconds, and callers arriving while a check runs share it. A provider's
  answer is kept PROVIDER_CHECK_SECONDS (an upstream is not asked at every probe).
* /metrics: Prometheus's text format (chat/runtime/metrics.py), only with METRICS_TOKEN set and
  sent as `Authorization: Bearer <token>`: 404 without the setting, 403 without the token.

They bypass ALLOWED_HOSTS and the https redirect on purpose: a supervisor or a load balancer
asks by address, over plain http, on the machine.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import orjson
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from chat.lib import single_flight
from chat.models import Provider, Usage
from chat.runtime import metrics
from chat.streaming import upstream
from chat.streaming.providers import client

log = logging.getLogger(__name__)

PATHS = ("/healthz", "/readyz", "/metrics")
CHECK_TIMEOUT = 1.0
PROVIDER_CHECK_SECONDS = 15.0
PROVIDER_TIMEOUT = 2.0

# Its own thread and connection: a probe never waits behind the streams' database work.
_database_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-readiness")
# provider pk -> (checked until, its result)
_provider_results: dict[int, tuple[float, dict[str, Any]]] = {}
_providers: list[dict[str, Any]] = []  # the enabled providers, as last read
_last_ready: bool | None = None


async def app(scope, receive, send) -> None:
    """The ASGI app of PATHS (chatsite/asgi.py routes them here)."""
    if scope["method"] not in ("GET", "HEAD"):
        return await _respond(send, 405, b"only GET\n", "text/plain", scope)
    path = scope["path"]
    if path == "/healthz":
        return await _respond(send, 200, b'{"status":"ok"}', "application/json", scope)
    if path == "/readyz":
        ready, report = await readiness()
        return await _respond(send, 200 if ready else 503, orjson.dumps(report), "application/json", scope)
    return await _metrics(scope, send)


async def _metrics(scope, send) -> None:
    token = settings.METRICS_TOKEN
    if not token:
        return await _respond(send, 404, b"Not Found\n", "text/plain", scope)
    offered = dict(scope["headers"]).get(b"authorization", b"")
    if not hmac.compare_digest(offered, b"Bearer " + token.encode()):
        return await _respond(send, 403, b"METRICS_TOKEN required as a Bearer token\n", "text/plain", scope)
    await readiness()  # sets chat_ready
    try:
        stuck = await _on_database_thread(_stuck_streams)
        metrics.stuck_streams.set(stuck)
    except Exception:  # reported by chat_ready{part="database"}
        pass
    body = await asyncio.get_running_loop().run_in_executor(None, metrics.exposition)
    await _respond(send, 200, body, metrics.CONTENT_TYPE, scope)


async def _respond(send, status: int, body: bytes, content_type: str, scope) -> None:
    headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


# --- readiness ---------------------------------------------------------------------------


async def readiness() -> tuple[bool, dict[str, Any]]:
    """Whether this process can serve: each part's result and latency, and which parts fail."""
    global _last_ready
    database, channel_layer = await asyncio.gather(
        _timed(lambda: _on_database_thread(_read_database)), _timed(_ping_channel_layer)
    )
    providers = await _check_providers()
    reachable = [result for result in providers.values() if result["ok"]]
    checks = {
        "database": database,
        "channel_layer": channel_layer,
        "provider": {"ok": bool(reachable), "providers": providers},
    }
    failing = [part for part, result in checks.items() if not result["ok"]]
    for part, result in checks.items():
        metrics.ready.labels(part).set(1 if result["ok"] else 0)
    ready = not failing
    if ready != _last_ready:
        if ready:
            log.info("ready: database, channel layer and a provider reachable")
        else:
            log.warning("not ready: %s", "; ".join(f"{part}: {_why(checks[part])}" for part in failing))
        _last_ready = ready
    report = {"status": "ready" if ready else "not ready", "failing": failing, "checks": checks}
    return ready, report


def _why(result: dict[str, Any]) -> str:
    if "error" in result:
        return result["error"]
    errors = [f"{name}: {r.get('error', '?')}" for name, r in result.get("providers", {}).items()]
    return ", ".join(errors) or "no enabled provider"


async def _timed(check) -> dict[str, Any]:
    started = time.monotonic()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT):
            detail = await check()
    except TimeoutError:
        return {"ok": False, "error": f"no answer within {CHECK_TIMEOUT:g} s"}
    except Exception as exc:
        return {"ok": False, "error": _describe(exc), "ms": _ms(started)}
    return {"ok": True, "ms": _ms(started), **(detail or {})}


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _on_database_thread(function):
    """`function()` on the readiness thread; callers at the same moment share one call."""
    loop = asyncio.get_running_loop()
    return await single_flight.shared(
        ("readiness", function.__name__), lambda: loop.run_in_executor(_database_thread, _closing_on_error, function)
    )


def _closing_on_error(function):
    try:
        return function()
    except Exception:
        try:
            connection.close()  # a broken connection: the next check opens a new one
        except Exception:
            pass
        raise


def _read_database() -> dict[str, Any]:
    global _providers
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    # The same trip reads the providers to check (kept for when the database is down).
    _providers = list(Provider.objects.filter(enabled=True).order_by("pk").values("pk", "name", "base_url", "api_key"))
    return {"engine": connection.vendor}


def _stuck_streams() -> int:
    from django.utils import timezone

    older = timezone.now() - timedelta(seconds=settings.UPSTREAM_DEADLINE + 60)
    return Usage.objects.filter(status="streaming", started__lt=older).count()


async def _ping_channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()
    ping = getattr(layer, "ping", None)
    if ping is None:
        return {"backend": "in-memory"}
    await ping()
    return {"backend": "redis"}


async def _check_providers() -> dict[str, dict[str, Any]]:
    now = time.monotonic()
    due = [p for p in _providers if _provider_results.get(p["pk"], (0.0, None))[0] <= now]
    if due:
        await asyncio.gather(*(single_flight.shared(("readiness", p["pk"]), lambda p=p: _check(p)) for p in due))
    return {p["name"]: _provider_results[p["pk"]][1] for p in _providers if p["pk"] in _provider_results}


async def _check(provider: dict[str, Any]) -> None:
    started = time.monotonic()
    timeouts = upstream.Timeouts(connect=PROVIDER_TIMEOUT / 2, read=PROVIDER_TIMEOUT, deadline=PROVIDER_TIMEOUT)
    try:
        async with asyncio.timeout(PROVIDER_TIMEOUT):
            await upstream.list_models(client(), provider["base_url"], provider["api_key"], timeouts)
        result = {"ok": True, "ms": _ms(started)}
    except upstream.UpstreamError as exc:
        # An HTTP answer is a reachable upstream; a server error or no answer is not.
        reachable = exc.kind == "http" and exc.status is not None and exc.status < 500
        result = {"ok": reachable, "ms": _ms(started), "error": str(exc)[:200]}
    except TimeoutError:
        result = {"ok": False, "error": f"no answer within {PROVIDER_TIMEOUT:g} s"}
    _provider_results[provider["pk"]] = (time.monotonic() + PROVIDER_CHECK_SECONDS, result)
