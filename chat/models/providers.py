"""Providers: the OpenAI-compatible upstreams staff configure, and the demo one."""

from __future__ import annotations

import logging
from typing import TypeVar

from django.conf import settings
from django.db import models

from chat.models.base import Read, rows_read

log = logging.getLogger(__name__)
R = TypeVar("R")


DEMO_PROVIDER = "demo"
DEMO_MODEL = "i14-sugarglider-nemotron3-super-120B-v1"


# --- providers ----------------------------------------------------------------


# The SQL and parameters of the enabled providers' query (ProviderQuerySet.enabled_list).
_enabled_sql: tuple[str, tuple] | None = None


class ProviderQuerySet(models.QuerySet):
    def enabled(self):
        return self.filter(enabled=True)

    def enabled_list(self) -> list[Provider]:
        """The enabled providers in order."""
        return self.enabled_read().get(self.db)

    def enabled_read(self) -> Read:
        """enabled_list() as a Read, by a statement compiled once per process: on every stream start,
        compiling the ORM's query costs more than running it."""
        global _enabled_sql
        if _enabled_sql is None:
            query = self.enabled().order_by("pk")
            _enabled_sql = query.query.get_compiler(query.db).as_sql()
        return rows_read(Provider, *_enabled_sql, using=self.db)

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
    tool_models = models.TextField(
        "models that take tools",
        blank=True,
        db_default="",  # a process of the previous release still adds providers while this one migrates
        help_text="Model ids that may call the team's MCP tools, one per line; * for all of this provider's "
        "models. Others are sent no tools.",
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

    def accepts_images(self, model: str) -> bool:
        """Whether staff marked this model (or all of the provider's) as accepting images."""
        marked = {line.strip() for line in self.image_models.splitlines() if line.strip()}
        return "*" in marked or model in marked

    def takes_tools(self, model: str) -> bool:
        """Whether staff marked this model (or all of the provider's) as taking tools."""
        marked = {line.strip() for line in self.tool_models.splitlines() if line.strip()}
        return "*" in marked or model in marked
