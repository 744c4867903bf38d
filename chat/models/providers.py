"""Providers: the OpenAI-compatible upstreams, their models, and the client and timeouts to reach them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DatabaseError, models
from django.utils import timezone
from django.utils.translation import gettext as _

from .. import db, inflight, upstream
from .access import Access
from .base import MODEL_MAX_LENGTH, ChatError, rows_of

log = logging.getLogger(__name__)
R = TypeVar("R")


DEMO_PROVIDER = "demo"
DEMO_MODEL = "i14-sugarglider-nemotron3-super-120B-v1"


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


# --- providers ----------------------------------------------------------------


@dataclass(frozen=True)
class CatalogEntry:
    provider: Provider
    model: str

    @property
    def qualified(self) -> str:
        return f"{self.provider.name}/{self.model}"


# provider pk -> (expires at, provider.updated, model ids); per process, refreshed lazily.
_model_cache: dict[int, tuple[float, object, list[str]]] = {}
# The SQL and parameters of the enabled providers' query (ProviderQuerySet.enabled_list).
_enabled_sql: tuple[str, tuple] | None = None


class ProviderQuerySet(models.QuerySet):
    def enabled(self):
        return self.filter(enabled=True)

    def enabled_list(self) -> list[Provider]:
        """The enabled providers in order, by a statement compiled once per process: on every
        stream start, compiling the ORM's query cost more than running it (8 % of a `/v1` start)."""
        global _enabled_sql
        if _enabled_sql is None:
            query = self.enabled().order_by("pk")
            _enabled_sql = query.query.get_compiler(query.db).as_sql()
        return rows_of(Provider, *_enabled_sql)

    async def acatalog(self, access: Access | None = None, *, providers: list | None = None) -> list[CatalogEntry]:
        """Every (provider, model) pair of the enabled providers, in provider order; with `access`, its own.

        `providers`: enabled_list() as the caller read it already, in a trip to a database thread of its own.
        """
        if providers is None:
            providers = await db.run(self.enabled_list)()
        lists = await asyncio.gather(*(p.amodel_ids() for p in providers))
        catalog = [CatalogEntry(p, m) for p, ids in zip(providers, lists, strict=True) for m in ids]
        if access is not None:
            catalog = [entry for entry in catalog if access.allows(entry.provider.pk, entry.model)]
        return catalog

    async def aresolve(
        self, model: str | None, access: Access | None = None, *, providers: list | None = None
    ) -> CatalogEntry:
        """The provider and model id for a requested model (plain, or `provider/model`); see resolve_in()."""
        return resolve_in(await self.acatalog(providers=providers), model, access)

    def sync_from_settings(self) -> Provider | None:
        """Create or update the provider named by UPSTREAM_* (or the demo one) at start-up."""
        if settings.UPSTREAM_BASE_URL:
            self.filter(name=DEMO_PROVIDER).update(enabled=False)
            provider, _ = self.update_or_create(
                name=settings.UPSTREAM_NAME,
                defaults={
                    "base_url": settings.UPSTREAM_BASE_URL,
                    "api_key": settings.UPSTREAM_API_KEY,
                    "default_model": settings.UPSTREAM_MODEL,
                    "enabled": True,
                },
            )
            return provider
        if settings.DEMO_UPSTREAM:
            provider, _ = self.update_or_create(
                name=DEMO_PROVIDER,
                defaults={
                    "base_url": f"http://127.0.0.1:{settings.PUBLIC_PORT}/_demo/i14/v1",
                    "api_key": demo_api_key(),
                    "default_model": DEMO_MODEL,
                    "model_list": DEMO_MODEL,
                    "enabled": True,
                },
            )
            return provider
        return None


class CatalogCold(Exception):
    """A provider's model list is not cached in this process: it must be fetched, on the event loop, first."""

    def __init__(self, providers: list[Provider]) -> None:
        super().__init__("a provider's model list is not cached")
        self.providers = providers


def cached_catalog(providers: list[Provider]) -> list[CatalogEntry]:
    """acatalog() from the model lists this process holds, with no I/O: for a database thread's use.

    Raises CatalogCold if a list is missing or stale; the caller awaits acatalog() and tries again with it.
    """
    catalog = []
    for provider in providers:
        ids = provider.cached_model_ids()
        if ids is None:
            raise CatalogCold(providers)
        catalog.extend(CatalogEntry(provider, model) for model in ids)
    return catalog


async def with_catalog(opening: Callable[[list[CatalogEntry] | None], Awaitable[R]]) -> R:
    """`await opening(None)`, which resolves from cached_catalog(); if a list is not held, fetch it and call again."""
    try:
        return await opening(None)
    except CatalogCold as cold:  # a provider's model list, not fetched yet in this process or expired
        return await opening(await Provider.objects.acatalog(providers=cold.providers))


def resolve_in(catalog: list[CatalogEntry], model: str | None, access: Access | None = None) -> CatalogEntry:
    """The entry of `catalog` (every enabled provider's models) that a requested model names.

    With `access` (chat/models/access.py), a model that person may not use is refused
    (`model_not_allowed`), and no model means their group's default, else the site's.
    """
    if not catalog:
        raise ChatError("no_provider", _("No upstream provider is enabled."))
    if not model:
        return default_entry(catalog, access)
    entry = find(catalog, model)
    if entry is None:
        raise ChatError("unknown_model", _("Unknown model %(model)r.") % {"model": model})
    if access is not None and not access.allows(entry.provider.pk, entry.model):
        raise ChatError(
            "model_not_allowed", _("You may not use the model %(model)r; ask an administrator.") % {"model": model}
        )
    return entry


def find(catalog: list[CatalogEntry], model: str) -> CatalogEntry | None:
    """The entry a plain id (first provider listing it) or a `provider/model` id names."""
    for entry in catalog:
        if entry.model == model:
            return entry
    for entry in catalog:
        if entry.qualified == model:
            return entry
    return None


def default_entry(catalog: list[CatalogEntry], access: Access | None = None) -> CatalogEntry:
    """What a request naming no model gets: the group's default, the first provider's, or the first allowed."""
    first = catalog[0].provider
    site = CatalogEntry(first, first.default_model or catalog[0].model)
    if access is None:
        return site
    chosen = find(catalog, access.default_model) if access.default_model else None
    for entry in (chosen, site, *catalog):
        if entry is not None and access.allows(entry.provider.pk, entry.model):
            return entry
    raise ChatError("model_not_allowed", _("No model is available to you; ask an administrator."))


def demo_api_key() -> str:
    """A key for the built-in demo upstream, the same in every process of one install."""
    from django.utils.crypto import salted_hmac

    return "demo-" + salted_hmac("chat.demo-upstream", "key").hexdigest()[:32]


class Provider(models.Model):
    """An OpenAI-compatible upstream. The API key never leaves the server."""

    name = models.SlugField(max_length=50, unique=True, help_text="Also the model prefix: name/model-id.")
    base_url = models.URLField("base URL", max_length=500, help_text="Up to /v1, e.g. https://api.i14.ai/v1")
    api_key = models.CharField("API key", max_length=500, blank=True)
    default_model = models.CharField(max_length=200, blank=True)
    model_list = models.TextField(
        "models", blank=True, help_text="One model id per line. Empty: ask the upstream's GET /models."
    )
    enabled = models.BooleanField(default=True)
    image_models = models.TextField(
        "models that accept images",
        blank=True,
        help_text="Model ids that accept images (attachments, image_url parts), one per line; * for all of "
        "this provider's models. Others are refused images before anything is sent.",
    )
    max_connections = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Upstream connections this provider may hold at once, per server process, so a slow "
        "provider cannot take every connection. Empty: UPSTREAM_PROVIDER_MAX_CONNECTIONS "
        "(half of UPSTREAM_MAX_CONNECTIONS).",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    # Health, from the last time its models were listed (a few minutes apart) or it was tested in the admin.
    reached = models.DateTimeField("last reached", null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField("last error at", null=True, blank=True)

    objects = ProviderQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_demo(self) -> bool:
        return self.name == DEMO_PROVIDER and "/_demo/" in self.base_url

    # Set by whoever took the key from a person just now (the admin form), so a key typed
    # again, even the same one, counts as entered again; never stored.
    key_entered = False

    def clean(self) -> None:
        """Refuse link-local and metadata hosts, and a stored key following the base URL to another server."""
        super().clean()
        host = upstream.origin(self.base_url)[1]
        address = upstream.refused_literal(host)
        if address and not settings.UPSTREAM_ALLOW_LINK_LOCAL:
            raise ValidationError(
                {
                    "base_url": f"{address} is a link-local or cloud metadata address; such upstreams are refused "
                    "(UPSTREAM_ALLOW_LINK_LOCAL=1 allows them)."
                }
            )
        if self.pk and self.api_key and not self.key_entered:
            stored = Provider.objects.filter(pk=self.pk).values("base_url", "api_key").first()
            if (
                stored
                and stored["api_key"] == self.api_key
                and upstream.origin(stored["base_url"]) != upstream.origin(self.base_url)
            ):
                raise ValidationError(
                    {
                        "api_key": "The base URL now points at another server (its scheme, host or port changed): "
                        "enter the API key again, so the stored key is not sent there."
                    }
                )

    async def acheck(self) -> tuple[bool, str]:
        """Ask the upstream for its models now (the admin's "Test connection"); recorded as its health."""
        started = time.monotonic()
        try:
            async with upstream.make_client(2, allow_link_local=settings.UPSTREAM_ALLOW_LINK_LOCAL) as http:
                ids = await upstream.list_models(http, self.base_url, self.api_key, timeouts())
        except upstream.UpstreamError as exc:
            await self.arecord_health(str(exc))
            return False, f"{self.name}: cannot list its models: {exc}"
        await self.arecord_health()
        took = round((time.monotonic() - started) * 1000)
        return True, f"{self.name}: reachable, {len(ids)} models listed in {took} ms."

    async def arecord_health(self, error: str = "") -> None:
        """Remember the last success or error; a database hiccup here must not fail a request."""
        now = timezone.now()
        fields = {"last_error": error[:1000], "last_error_at": now} if error else {"reached": now}
        try:
            # On a database thread: an async ORM call in a request holds a connection till it ends.
            await db.run(Provider.objects.filter(pk=self.pk).update)(**fields)
        except DatabaseError as exc:
            log.warning("provider %s: cannot record its health: %s", self.name, exc)
            return
        for name, value in fields.items():
            setattr(self, name, value)

    def accepts_images(self, model: str) -> bool:
        """Whether staff marked this model (or all of the provider's) as accepting images."""
        marked = {line.strip() for line in self.image_models.splitlines() if line.strip()}
        return "*" in marked or model in marked

    def cached_model_ids(self) -> list[str] | None:
        """This provider's models without I/O: the configured list, else GET /models's if cached; else None."""
        listed = [line.strip() for line in self.model_list.splitlines() if line.strip()]
        if listed:
            return listed
        cached = _model_cache.get(self.pk)
        if cached and cached[0] > time.monotonic() and cached[1] == self.updated:
            return cached[2]
        return None

    async def amodel_ids(self) -> list[str]:
        """This provider's models: the configured list, else GET /models (cached a few minutes)."""
        ids = self.cached_model_ids()
        if ids is not None:
            return ids
        # Requests that find the cache empty at once share one GET /models (not one each).
        return list(await inflight.shared(("models", self.pk, self.updated), self._list_model_ids))

    async def _list_model_ids(self) -> list[str]:
        ttl = settings.UPSTREAM_MODELS_CACHE_SECONDS
        try:
            ids = await upstream.list_models(client(), self.base_url, self.api_key, timeouts())
            # An id too long for the model columns (stored as name/id) could never be saved.
            longest = MODEL_MAX_LENGTH - len(self.name) - 1
            ids = [model_id for model_id in ids if len(model_id) <= longest]
            await self.arecord_health()
        except upstream.UpstreamError as exc:
            log.warning("provider %s: cannot list models: %s", self.name, exc)
            ids, ttl = [], 30
            await self.arecord_health(str(exc))
        if self.default_model and self.default_model not in ids:
            ids.insert(0, self.default_model)
        _model_cache[self.pk] = (time.monotonic() + ttl, self.updated, ids)
        return ids
