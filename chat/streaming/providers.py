"""A provider's upstream as this install's settings make it: the shared client, timeouts, a stream's state,
its health, and its model list (cached per process)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from chat.lib import single_flight
from chat.models.base import MODEL_MAX_LENGTH
from chat.models.providers import Provider
from chat.runtime import db_threads, metrics
from chat.streaming import upstream

log = logging.getLogger(__name__)

# provider pk -> (expires at, provider.updated, model ids); per process, refreshed lazily.
_model_cache: dict[int, tuple[float, object, list[str]]] = {}
# provider pk -> {model id: what the upstream's GET /models said of it}, from the last list fetched.
_model_items: dict[int, dict[str, dict[str, Any]]] = {}
# provider pk -> (its `updated` then, the ids) of the last list fetched: kept through an outage.
_last_listed: dict[int, tuple[object, list[str]]] = {}


def timeouts() -> upstream.Timeouts:
    return upstream.Timeouts(
        connect=settings.UPSTREAM_CONNECT_TIMEOUT,
        read=settings.UPSTREAM_READ_TIMEOUT,
        deadline=settings.UPSTREAM_DEADLINE,
        first_byte=settings.UPSTREAM_FIRST_BYTE_TIMEOUT,
    )


def stream_state(started_at: float, api_key: str = "") -> upstream.StreamState:
    """A stream's accumulator with this install's limits (reply size, unreadable events)."""
    return upstream.StreamState(
        started_at=started_at,
        max_reply=settings.CHAT_MAX_REPLY_BYTES,
        max_malformed=settings.UPSTREAM_MAX_MALFORMED,
        secrets=(api_key,) if api_key else (),
    )


def client():
    return upstream.shared_client(
        settings.UPSTREAM_MAX_CONNECTIONS, allow_link_local=settings.UPSTREAM_ALLOW_LINK_LOCAL
    )


async def check(provider: Provider) -> tuple[bool, str]:
    """Ask the upstream for its models now (the admin's "Test connection"); recorded as its health."""
    started = time.monotonic()
    try:
        async with upstream.make_client(2, allow_link_local=settings.UPSTREAM_ALLOW_LINK_LOCAL) as http:
            ids = await upstream.list_models(http, provider.base_url, provider.api_key, timeouts())
    except upstream.UpstreamError as exc:
        await record_health(provider, str(exc))
        # Quoted: the admin capitalises a message's first letter, which is not the provider's name ("Alt").
        return False, f"“{provider.name}” cannot list its models: {exc}"
    await record_health(provider)
    took = round((time.monotonic() - started) * 1000)
    return True, f"“{provider.name}” is reachable: {len(ids)} models listed in {took} ms."


async def record_health(provider: Provider, error: str = "") -> None:
    """Remember the last success or error; a database hiccup here must not fail a request."""
    now = timezone.now()
    fields = {"last_error": error[:1000], "last_error_at": now} if error else {"reached": now}
    try:
        # On a database thread: an async ORM call in a request holds a connection till it ends.
        await db_threads.run(Provider.objects.filter(pk=provider.pk).update)(**fields)
    except DatabaseError as exc:
        log.warning("provider %s: cannot record its health: %s", provider.name, exc)
        return
    for name, value in fields.items():
        setattr(provider, name, value)


def cached_model_ids(provider: Provider) -> list[str] | None:
    """This provider's models without I/O: the configured list, else GET /models's if cached; else None."""
    listed = [line.strip() for line in provider.model_list.splitlines() if line.strip()]
    if listed:
        return listed
    cached = _model_cache.get(provider.pk)
    if cached and cached[0] > time.monotonic() and cached[1] == provider.updated:
        return cached[2]
    return None


async def model_ids(provider: Provider) -> list[str]:
    """This provider's models: the configured list, else GET /models (cached a few minutes)."""
    ids = cached_model_ids(provider)
    if ids is not None:
        return ids
    # Requests that find the cache empty at once share one GET /models (not one each).
    return list(
        await single_flight.shared(("models", provider.pk, provider.updated), lambda: _list_model_ids(provider))
    )


def model_item(provider: Provider, model: str) -> dict[str, Any]:
    """What the upstream's GET /models said of `model` when last fetched in this process ({} if nothing)."""
    return _model_items.get(provider.pk, {}).get(model, {})


# How an upstream's model list says a model makes embeddings: a `type` (as several gateways write it) or
# an `architecture.output_modalities` naming them.
EMBEDDING_TYPES = ("embedding", "embeddings")


def makes_embeddings(provider: Provider, model: str) -> bool:
    """Whether the upstream's model list says `model` makes embeddings (not chat completions)."""
    item = model_item(provider, model)
    architecture = item.get("architecture")
    outputs = architecture.get("output_modalities") if isinstance(architecture, dict) else None
    return item.get("type") in EMBEDDING_TYPES or (isinstance(outputs, list) and "embeddings" in outputs)


async def _list_model_ids(provider: Provider) -> list[str]:
    ttl = settings.UPSTREAM_MODELS_CACHE_SECONDS
    try:
        items = await upstream.list_model_items(client(), provider.base_url, provider.api_key, timeouts())
        # An id too long for the model columns (stored as name/id) could never be saved.
        longest = MODEL_MAX_LENGTH - len(provider.name) - 1
        items = [item for item in items if len(item["id"]) <= longest]
        _model_items[provider.pk] = {item["id"]: item for item in items}
        ids = [item["id"] for item in items]
        _last_listed[provider.pk] = (provider.updated, ids)
        await record_health(provider)
    except upstream.UpstreamError as exc:
        # The last list this process had of the provider, as it was configured then, stays: a request for one
        # of its models gets the outage's own error (502) rather than "unknown model" (404), which no SDK retries.
        last = _last_listed.get(provider.pk)
        ids, ttl = (list(last[1]) if last is not None and last[0] == provider.updated else []), 30
        log.warning("provider %s: cannot list models (%s); %s", provider.name, exc,
                    f"keeping the {len(ids)} listed before" if ids else "none listed")  # fmt: skip
        await record_health(provider, str(exc))
    if provider.default_model and provider.default_model not in ids:
        ids.insert(0, provider.default_model)
    _model_cache[provider.pk] = (time.monotonic() + ttl, provider.updated, ids)
    return ids


# --- connections per provider ---------------------------------------------------------

# (loop, provider name) -> (limit, semaphore); per process, as the connection pool is.
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, tuple[int, asyncio.Semaphore]]] = (
    weakref.WeakKeyDictionary()
)


def provider_limit(provider: Provider) -> int:
    return provider.max_connections or settings.UPSTREAM_PROVIDER_MAX_CONNECTIONS


@asynccontextmanager
async def provider_slot(name: str, limit: int):
    """Hold one of a provider's connections for as long as its request lasts; wait a bounded time for one."""
    slots = _slots.setdefault(asyncio.get_running_loop(), {})
    if name not in slots or slots[name][0] != limit:
        # A changed limit takes effect for new requests; running ones release the old semaphore.
        slots[name] = (limit, asyncio.Semaphore(limit))
    semaphore = slots[name][1]
    wait = settings.UPSTREAM_PROVIDER_WAIT
    try:
        async with asyncio.timeout(wait):
            await semaphore.acquire()
    except TimeoutError:
        raise upstream.UpstreamError(
            "busy",
            f"all {limit} connections this server may open to provider {name} "
            f"were busy for {wait:g} s; try again later",
        ) from None
    try:
        yield
    finally:
        semaphore.release()


@asynccontextmanager
async def open_provider_stream(
    name: str, base_url: str, api_key: str, max_connections: int, payload: dict[str, Any], state: upstream.StreamState
) -> AsyncIterator[upstream.UpstreamStream]:
    """POST `payload` as a stream once the provider has a free connection; UpstreamError if it fails before any byte.

    `max_connections`: the provider's connections per process (provider_limit); `state` gets the request id.
    """
    try:
        async with (
            provider_slot(name, max_connections),
            upstream.open_stream(
                client(), base_url, api_key, payload, timeouts(), max_event=settings.UPSTREAM_MAX_LINE_BYTES
            ) as stream,
        ):
            state.request_id = stream.request_id or ""
            yield stream
    except upstream.UpstreamError as exc:
        metrics.upstream_failures.labels(name, exc.kind).inc()
        state.note_failure(exc)
        raise
