"""Providers, conversations, messages and the usage of every stream."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from . import upstream

log = logging.getLogger(__name__)

DEMO_PROVIDER = "demo"
DEMO_MODEL = "i14-sugarglider-nemotron3-super-120B-v1"


class ChatError(Exception):
    """A request that cannot start; `code` goes to the client as is."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


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


def fit(model: type[models.Model], field: str, value: str | None) -> str:
    """An upstream-derived string cut to its column (PostgreSQL refuses longer ones)."""
    limit = model._meta.get_field(field).max_length
    value = value or ""
    return value[:limit] if limit is not None else value


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


class ProviderQuerySet(models.QuerySet):
    def enabled(self):
        return self.filter(enabled=True)

    async def acatalog(self) -> list[CatalogEntry]:
        """Every (provider, model) pair of the enabled providers, in provider order."""
        providers = [p async for p in self.enabled().order_by("pk")]
        lists = await asyncio.gather(*(p.amodel_ids() for p in providers))
        return [CatalogEntry(p, m) for p, ids in zip(providers, lists, strict=True) for m in ids]

    async def aresolve(self, model: str | None) -> CatalogEntry:
        """The provider and model id for a requested model (plain, or `provider/model`)."""
        catalog = await self.acatalog()
        if not catalog:
            raise ChatError("no_provider", "No upstream provider is enabled.")
        if not model:
            first = catalog[0].provider
            return CatalogEntry(first, first.default_model or catalog[0].model)
        for entry in catalog:
            if entry.model == model:
                return entry
        for entry in catalog:
            if entry.qualified == model:
                return entry
        raise ChatError("unknown_model", f"Unknown model {model!r}.")

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
    max_connections = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Upstream connections this provider may hold at once, per server process, so a slow "
        "provider cannot take every connection. Empty: UPSTREAM_PROVIDER_MAX_CONNECTIONS "
        "(half of UPSTREAM_MAX_CONNECTIONS).",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

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

    async def amodel_ids(self) -> list[str]:
        """This provider's models: the configured list, else GET /models (cached a few minutes)."""
        listed = [line.strip() for line in self.model_list.splitlines() if line.strip()]
        if listed:
            return listed
        cached = _model_cache.get(self.pk)
        if cached and cached[0] > time.monotonic() and cached[1] == self.updated:
            return cached[2]
        ttl = settings.UPSTREAM_MODELS_CACHE_SECONDS
        try:
            ids = await upstream.list_models(client(), self.base_url, self.api_key, timeouts())
            # An id too long for the model columns (stored as name/id) could never be saved.
            longest = Conversation._meta.get_field("model").max_length - len(self.name) - 1
            ids = [model_id for model_id in ids if len(model_id) <= longest]
        except upstream.UpstreamError as exc:
            log.warning("provider %s: cannot list models: %s", self.name, exc)
            ids, ttl = [], 30
        if self.default_model and self.default_model not in ids:
            ids.insert(0, self.default_model)
        _model_cache[self.pk] = (time.monotonic() + ttl, self.updated, ids)
        return ids


# --- conversations and messages -----------------------------------------------


class ConversationQuerySet(models.QuerySet):
    def owned_by(self, user):
        return self.filter(owner=user)

    def search(self, query: str):
        """Conversations whose title or any message contains the query."""
        if not query:
            return self
        return self.filter(Q(title__icontains=query) | Q(messages__content__icontains=query)).distinct()


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=300, blank=True, help_text="The model of the last stream.")
    system_prompt = models.TextField(blank=True)
    params = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(default=timezone.now, db_index=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "-updated"])]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @staticmethod
    def title_for(text: str) -> str:
        line = next((line.strip() for line in text.splitlines() if line.strip()), "New chat")
        return line if len(line) <= 60 else line[:59].rstrip() + "…"

    def merge_params(self, params: dict) -> None:
        """Remember request params on the conversation; None removes a remembered one."""
        merged = {**self.params, **params}
        self.params = {name: value for name, value in merged.items() if value is not None}

    def upstream_messages(self) -> list[dict[str, str]]:
        """The history in OpenAI's shape: system prompt, then every message with text."""
        history = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for role, content in self.messages.exclude(content="").values_list("role", "content"):
            history.append({"role": role, "content": content})
        return history


# --- workers: one lease per serving process ----------------------------------

INTERRUPTED_ERROR = "The server stopped while this answer was streaming."

# The id of this process's Worker row once it is registered (process.ensure_started).
_current_worker: int | None = None


class WorkerQuerySet(models.QuerySet):
    def dead(self, lease: timedelta):
        """Workers whose lease has not been renewed for `lease`: their process is gone."""
        return self.filter(heartbeat__lt=timezone.now() - lease)


class Worker(models.Model):
    """A serving process. It renews its heartbeat every few seconds; an expired one is dead.

    Streams record their worker, so any process can address the owner's control
    channel, and the sweep ends only the streams whose owner is dead.
    """

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    channel = models.CharField(max_length=255, help_text="Its control channel on the channel layer.")
    started = models.DateTimeField(default=timezone.now)
    heartbeat = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WorkerQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    @classmethod
    def register(cls, channel: str) -> Worker:
        """This process's lease row; also remembered as current_id()."""
        global _current_worker
        worker = cls.objects.create(host=socket.gethostname()[:255], pid=os.getpid(), channel=channel)
        _current_worker = worker.pk
        return worker

    @staticmethod
    def current_id() -> int | None:
        """This process's worker id (None before it is registered): stamp it on every streaming row."""
        return _current_worker

    @classmethod
    def renew(cls, pk: int, channel: str) -> bool:
        """Extend the lease; if its row has vanished, write it again (False then)."""
        if cls.objects.filter(pk=pk).update(heartbeat=timezone.now()):
            return True
        cls.objects.create(pk=pk, host=socket.gethostname()[:255], pid=os.getpid(), channel=channel)
        return False

    def is_alive(self, lease: timedelta) -> bool:
        return self.heartbeat >= timezone.now() - lease


class MessageQuerySet(models.QuerySet):
    def streaming(self):
        return self.filter(status=Message.Status.STREAMING)

    def recover_orphans(self, lease: timedelta | None = None, *, only: int | None = None) -> list[Message]:
        """Mark streams whose owning process is dead as interrupted, with estimated usage.

        A stream is orphaned when its worker's lease is older than `lease`; lease=None
        takes every stream not owned by this process (one process, just started), with
        or without a worker. This process's own streams are never touched: it is alive.
        API usage rows (no message) of dead workers are closed the same way.
        `only` limits the sweep to one message (attach/stop to a stream whose owner is gone).
        """
        now = timezone.now()
        mine = Worker.current_id()
        if lease is None:
            dead = ~Q(worker=mine) | Q(worker__isnull=True) if mine is not None else Q()
        else:
            # A row without a worker predates leases or comes from a process that did not
            # register: only a lone process at start-up (lease=None) may take it as dead.
            dead = Q(worker__heartbeat__lt=now - lease) & ~Q(worker=mine)
        with transaction.atomic():
            orphans = self.streaming().filter(dead)
            if only is not None:
                orphans = orphans.filter(pk=only)
            orphans = list(orphans.select_for_update(of=("self",)))
            for message in orphans:
                message.status = Message.Status.INTERRUPTED
                message.error = INTERRUPTED_ERROR
                message.updated = now
                message.save(update_fields=["status", "error", "updated"])
                completion = upstream.estimate_tokens(len(message.content) + len(message.reasoning))
                Usage.objects.filter(message=message, status=Message.Status.STREAMING).update(
                    status=Message.Status.INTERRUPTED,
                    completion_tokens=completion,
                    reasoning_tokens=upstream.estimate_tokens(len(message.reasoning)),
                    total_tokens=models.F("prompt_tokens") + completion,
                    estimated=True,
                    ended=now,
                    error=message.error,
                )
            if only is None:
                # API streams keep no text: their usage is closed with what the row has.
                Usage.objects.filter(dead, message__isnull=True, status=Message.Status.STREAMING).update(
                    status=Message.Status.INTERRUPTED, estimated=True, ended=now, error=INTERRUPTED_ERROR
                )
        # The swept rows (chat and API) get the price table's cost, like any final save.
        price_unpriced(Usage.objects.filter(status=Message.Status.INTERRUPTED, ended=now, cost__isnull=True))
        return orphans


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"

    class Status(models.TextChoices):
        STREAMING = "streaming"
        COMPLETE = "complete"
        STOPPED = "stopped", "stopped by the user"
        INTERRUPTED = "interrupted", "interrupted (connection ended early)"
        FAILED = "failed", "failed (upstream error)"
        # Only on usage rows: a stream refused before anything went upstream (over budget).
        REFUSED = "refused", "refused (over budget)"

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    reasoning = models.TextField(blank=True)
    tool_calls = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.COMPLETE, db_index=True)
    finish_reason = models.CharField(max_length=30, blank=True)
    error = models.TextField(blank=True)
    model = models.CharField(max_length=300, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(default=timezone.now, help_text="Last save of the text.")
    # No database constraint: a lease row that vanished (a flushed table, a hand cleanup) must
    # not stop a stream from being stored; such a stream simply has no live owner.
    worker = models.ForeignKey(
        Worker,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_constraint=False,
        help_text="The process streaming it.",
    )

    objects = MessageQuerySet.as_manager()

    class Meta:
        ordering = ["created", "pk"]

    def __str__(self) -> str:
        return f"{self.role} #{self.pk}"


@dataclass(frozen=True)
class Turn:
    conversation: Conversation
    user_message: Message
    reply: Message
    usage: Usage
    history: list[dict[str, str]]


def begin_turn(
    user,
    entry: CatalogEntry,
    params: dict,
    *,
    conversation_id: int | None = None,
    content: str | None = None,
    edit: int | None = None,
    system_prompt: str | None = None,
    worker_id: int | None = None,
) -> Turn:
    """Store the user's message (new, edited, or the last one again) and an empty streaming reply.

    content alone: a new message. edit=<id of the last user message> with content:
    replace its text and drop what followed. Neither: regenerate the last reply.
    Refused while a reply streams in the conversation: one stream per conversation,
    and over the user's limits (chat/limits.py) or budget (chat/budgets.py), before anything
    is stored; a refusal over budget leaves a `refused` usage row.
    worker_id: the process that will stream the reply (its lease keeps the reply alive).
    """
    from . import limits
    from .budgets import BudgetExceeded, refuse

    try:
        return _begin_turn(user, entry, params, conversation_id, content, edit, system_prompt, worker_id, limits)
    except BudgetExceeded as exc:
        refuse(user, source=Usage.Source.CHAT, provider_id=entry.provider.pk, model=entry.model,
               prompt_tokens=exc.prompt_tokens, detail=exc.detail)  # fmt: skip
        raise ChatError(exc.code, exc.detail) from None


def _begin_turn(user, entry, params, conversation_id, content, edit, system_prompt, worker_id, limits) -> Turn:
    from .budgets import BudgetExceeded, reserve

    with transaction.atomic():
        limits.enforce(user, source=Usage.Source.CHAT)
        if conversation_id is None:
            conversation = Conversation.objects.create(owner=user, title=Conversation.title_for(content or ""))
        else:
            conversation = Conversation.objects.owned_by(user).select_for_update().filter(pk=conversation_id).first()
            if conversation is None:
                raise ChatError("not_found", "No such conversation.")
            if conversation.messages.streaming().exists():
                raise ChatError("busy", "A reply is still streaming in this conversation; stop it first.")
        last_user = conversation.messages.filter(role=Message.Role.USER).last()
        if edit is not None or content is None:
            if last_user is None or (edit is not None and last_user.pk != edit):
                raise ChatError("not_last", "Only the last message of a conversation can be edited or regenerated.")
            if content is not None:
                last_user.content = content
                last_user.save(update_fields=["content"])
            conversation.messages.filter(pk__gt=last_user.pk).delete()
            user_message = last_user
        else:
            user_message = conversation.messages.create(role=Message.Role.USER, content=content)
        now = timezone.now()
        conversation.model = entry.qualified
        conversation.updated = now
        if params:
            conversation.merge_params(params)
        if system_prompt is not None:
            conversation.system_prompt = system_prompt
        conversation.save(update_fields=["model", "updated", "params", "system_prompt"])
        history = conversation.upstream_messages()
        prompt_tokens = upstream.estimate_tokens(sum(len(m["content"]) for m in history))
        try:
            reservation = reserve(
                user,
                provider_id=entry.provider.pk,
                model=entry.model,
                prompt_tokens=prompt_tokens,
                max_tokens=conversation.params.get("max_tokens") or settings.UPSTREAM_MAX_TOKENS,
            )
        except BudgetExceeded as exc:
            exc.prompt_tokens = prompt_tokens
            raise
        reply = conversation.messages.create(
            role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING,
            model=entry.model,
            updated=now,
            worker_id=worker_id,
        )
        usage = Usage.objects.create(
            user=user,
            provider=entry.provider,
            message=reply,
            model=entry.model,
            status=Message.Status.STREAMING,
            prompt_tokens=prompt_tokens,
            reserved_usd=reservation.usd,
            reserved_tokens=reservation.tokens,
            worker_id=worker_id,
        )
    return Turn(conversation, user_message, reply, usage, history)


# --- personal API tokens -----------------------------------------------------

TOKEN_PREFIX = "sk-chat-"


class ApiTokenQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked__isnull=True, user__is_active=True)

    def for_secret(self, secret: str) -> ApiToken | None:
        """The active token with this secret; only its hash is stored."""
        return self.active().select_related("user").filter(digest=ApiToken.digest_of(secret)).first()


class ApiToken(models.Model):
    """A personal bearer token for /v1/; shown once, stored as a SHA-256 hash."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to tell tokens apart.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def digest_of(secret: str) -> str:
        # The secret is 256 random bits: a fast hash is enough, unlike for passwords.
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def issue(cls, user, name: str) -> tuple[ApiToken, str]:
        """A new token and its secret, which is not kept anywhere."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=secret[:12], digest=cls.digest_of(secret))
        return token, secret

    def revoke(self) -> None:
        if self.revoked is None:
            self.revoked = timezone.now()
            self.save(update_fields=["revoked"])


# --- usage --------------------------------------------------------------------


class UsageQuerySet(models.QuerySet):
    def totals(self) -> dict:
        return self.aggregate(
            streams=Count("pk"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            reasoning_tokens=Sum("reasoning_tokens"),
            total_tokens=Sum("total_tokens"),
            cost=Sum("cost"),
        )

    def spent(self, since) -> Spent:
        """Settled cost and tokens of these rows since a moment, plus what their running streams reserve."""
        return spent(self, since)

    def month_spent(self, user) -> Spent:
        """What a user has spent (or reserved) this calendar month."""
        return self.filter(user=user).spent(month_start())


# Every column the dashboard's GROUP BYs read, in one index led by the period.
COVERING = ["started", "model", "user", "source", "status", "prompt_tokens", "completion_tokens", "reasoning_tokens"]
COVERING += ["cost", "ttft_ms", "tokens_per_second"]


class Usage(models.Model):
    """One upstream stream: who, which model, how many tokens, what it cost, how fast."""

    class Source(models.TextChoices):
        CHAT = "chat", "via chat"
        API = "api", "via API"

    class CostSource(models.TextChoices):
        REPORTED = "reported", "reported by the upstream"
        COMPUTED = "computed", "computed from the price table"
        UNKNOWN = "unknown", "unknown (no price)"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage")
    provider = models.ForeignKey(Provider, on_delete=models.SET_NULL, null=True, blank=True)
    message = models.OneToOneField(Message, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    token = models.ForeignKey(ApiToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    source = models.CharField(max_length=4, choices=Source.choices, default=Source.CHAT, db_index=True)
    model = models.CharField(max_length=300, db_index=True)
    upstream_id = models.CharField("upstream id", max_length=200, blank=True)
    request_id = models.CharField("request id", max_length=200, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    reasoning_tokens = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField("cost (USD)", max_digits=14, decimal_places=8, null=True, blank=True)
    ttft_ms = models.PositiveIntegerField("time to first token (ms)", null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    upstream_perf = models.JSONField("upstream's perf object", null=True, blank=True)
    started = models.DateTimeField(default=timezone.now, db_index=True)
    ended = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=Message.Status.choices, db_index=True)
    finish_reason = models.CharField(max_length=30, blank=True)
    error = models.TextField(blank=True)
    estimated = models.BooleanField(default=False, help_text="The upstream sent no usage; counts are estimates.")
    cost_source = models.CharField(max_length=8, choices=CostSource.choices, default=CostSource.UNKNOWN, db_index=True)
    cost_estimated = models.BooleanField(default=False, help_text="Computed from estimated token counts.")
    # A running stream's worst case, counted against the budget while status is `streaming`.
    reserved_usd = models.DecimalField("reserved (USD)", max_digits=14, decimal_places=8, null=True, blank=True)
    reserved_tokens = models.PositiveIntegerField(default=0)
    # No database constraint: a lease row that vanished (a flushed table, a hand cleanup) must
    # not stop a stream from being stored; such a stream simply has no live owner.
    worker = models.ForeignKey(
        Worker,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_constraint=False,
        help_text="The process streaming it.",
    )

    objects = UsageQuerySet.as_manager()

    class Meta:
        ordering = ["-started"]
        verbose_name_plural = "usage"
        # (user, started): a person's spend this month (budgets) and own rows on the dashboard. For the
        # usage dashboard (chat/dashboard.py) also: the SQLite percentiles of long periods, which walk
        # (model, value) in order to an OFFSET instead of sorting; and the period's GROUP BYs read from
        # one index instead of the table (a covering index).
        indexes = [
            models.Index(fields=["user", "started"]),
            models.Index(fields=["model", "ttft_ms", "started"], name="usage_model_ttft"),
            models.Index(fields=["model", "tokens_per_second", "started"], name="usage_model_speed"),
            models.Index(fields=COVERING, name="usage_dashboard_covering"),
        ]

    def __str__(self) -> str:
        return f"{self.model} for {self.user} at {self.started:%Y-%m-%d %H:%M}"

    @staticmethod
    def ending(state: upstream.StreamState, status: str, error: str, metering: dict) -> dict:
        """The fields a finished stream writes on its usage row."""
        return {
            "upstream_id": fit(Usage, "upstream_id", state.upstream_id),
            "request_id": fit(Usage, "request_id", state.request_id),
            "upstream_perf": state.perf,
            "ended": timezone.now(),
            "status": status,
            "finish_reason": fit(Usage, "finish_reason", state.finish_reason),
            "error": error,
            **metering,
        }

    @classmethod
    def settle(cls, pk: int, fields: dict) -> dict:
        """Write a finished stream's fields with its cost (reported, else priced); returns what was written.

        Moving the row off `streaming` releases its budget reservation (chat/budgets.py).
        """
        row = cls.objects.filter(pk=pk).values("provider_id", "model", "started").first()
        if row is not None:
            fields = {**fields, **priced(row["provider_id"], row["model"], row["started"], fields)}
        cls.objects.filter(pk=pk).update(**fields)
        return fields

    def as_frame(self) -> dict:
        """The `usage` object of a `done` frame."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "total_tokens": self.total_tokens,
            "cost": float(self.cost) if self.cost is not None else None,
            "ttft_ms": self.ttft_ms,
            "duration_ms": self.duration_ms,
            "tokens_per_second": self.tokens_per_second,
            "estimated": self.estimated,
        }


# The budget models refer to the ones above; re-exported for `from chat.models import ...`.
from .budgets import Budget as Budget  # noqa: E402
from .budgets import Limit as Limit  # noqa: E402
from .budgets import Price as Price  # noqa: E402
from .budgets import Spent, month_start, price_unpriced, priced, spent  # noqa: E402
from .budgets import budget_for as budget_for  # noqa: E402
