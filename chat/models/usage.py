"""Usage: one row per upstream stream (who, which model, tokens, cost, speed, how it ended)."""

from __future__ import annotations

import logging
from typing import Protocol

from django.conf import settings
from django.db import models
from django.db.models import Count, F, Sum
from django.utils import timezone
from django.utils.translation import gettext_lazy

from chat.models.base import MODEL_MAX_LENGTH, Status, fit
from chat.models.providers import Provider
from chat.models.tokens import ApiToken
from chat.models.workers import streaming_worker

log = logging.getLogger(__name__)


class StreamEnding(Protocol):
    """What a finished stream tells its usage row (the upstream client's stream state has it)."""

    upstream_id: str
    request_id: str
    perf: dict | None
    finish_reason: str | None


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

    def checkpoint(self, rows: list[tuple[int, int, int]]) -> None:
        """Write (id, completion, reasoning tokens so far) on rows still streaming: what a sweep keeps.

        Each row in a transaction of its own. A row's write locks its summary rows (chat/metering/summary_triggers.py)
        in one order: the day's shard by model, then the person's, then the token's. One transaction for many rows
        held one row's person summary while it waited for the next row's shard, which a start's insert held
        while it waited for that person summary: PostgreSQL found a deadlock and cancelled one of them.
        """
        for pk, completion, reasoning in rows:
            self.filter(pk=pk, status=Status.STREAMING).update(
                completion_tokens=completion, reasoning_tokens=reasoning, total_tokens=F("prompt_tokens") + completion
            )


# Every column the dashboard's GROUP BYs read, in one index led by the period.
COVERING = ["started", "model", "user", "source", "status", "prompt_tokens", "completion_tokens", "reasoning_tokens"]
COVERING += ["cost", "ttft_ms", "tokens_per_second"]


class Usage(models.Model):
    """One upstream stream: who, which model, how many tokens, what it cost, how fast."""

    class Source(models.TextChoices):
        CHAT = "chat", gettext_lazy("via chat")
        API = "api", gettext_lazy("via API")
        # A conversation's title written by a model (chat/actions/titles.py). Four letters: the daily
        # summaries' source columns (chat/models/rollups.py) are that wide.
        TITLE = "titl", gettext_lazy("title of a chat")

    class CostSource(models.TextChoices):
        REPORTED = "reported", "reported by the upstream"
        COMPUTED = "computed", "computed from the price table"
        RATE = "rate", "estimated at the upstream's last reported rate"
        UNKNOWN = "unknown", "unknown (no price)"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage")
    provider = models.ForeignKey(Provider, on_delete=models.SET_NULL, null=True, blank=True)
    # One row per stream: a continued answer (begin_turn, `continued`) has a row for each of its streams.
    message = models.ForeignKey("chat.Message", on_delete=models.SET_NULL, null=True, blank=True, related_name="usages")
    token = models.ForeignKey(ApiToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="usage")
    source = models.CharField(max_length=4, choices=Source.choices, default=Source.CHAT, db_index=True)
    model = models.CharField(max_length=MODEL_MAX_LENGTH, db_index=True)
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
    status = models.CharField(max_length=12, choices=Status.choices, db_index=True)
    finish_reason = models.CharField(max_length=30, blank=True)
    error = models.TextField(blank=True)
    estimated = models.BooleanField(default=False, help_text="The upstream sent no usage; counts are estimates.")
    cost_source = models.CharField(max_length=8, choices=CostSource.choices, default=CostSource.UNKNOWN, db_index=True)
    cost_estimated = models.BooleanField(default=False, help_text="Computed from estimated token counts.")
    # A running stream's worst case, counted against the budget while status is `streaming`.
    reserved_usd = models.DecimalField("reserved (USD)", max_digits=14, decimal_places=8, null=True, blank=True)
    reserved_tokens = models.PositiveIntegerField(default=0)
    worker = streaming_worker()

    objects = UsageQuerySet.as_manager()

    class Meta:
        ordering = ["-started"]
        verbose_name_plural = "usage"
        # (user, started): a person's spend this month (budgets), own rows and last activity on the
        # dashboard. For the usage dashboard (chat/metering/dashboard.py) also: a person's or group's figures
        # and the percentiles read the period's rows from one index instead of the table (a covering
        # index). Not declared here: the partial indexes `usage_sample_4` and `_16` (one row in 4, in
        # 16, for the percentiles of big periods) and the daily summaries' triggers: chat/metering/summary_triggers.py
        # makes them.
        indexes = [
            models.Index(fields=["user", "started"]),
            # A person's running streams, which every start counts (chat/metering/limits.py): only the
            # rows still `streaming`, a handful, whatever the table holds.
            models.Index(fields=["user", "started"], condition=models.Q(status="streaming"), name="usage_streaming"),
            models.Index(fields=COVERING, name="usage_dashboard_covering"),
        ]

    def __str__(self) -> str:
        return f"{self.model} for {self.user} at {self.started:%Y-%m-%d %H:%M}"

    @staticmethod
    def ending(state: StreamEnding, status: str, error: str, metering: dict) -> dict:
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

    @staticmethod
    def combined(rows: list[Usage]) -> Usage:
        """The streams of one continued answer added up, as an unsaved row (pk and status: the newest's)."""
        newest, first = max(rows, key=lambda row: row.started), min(rows, key=lambda row: row.started)
        costs = [row.cost for row in rows if row.cost is not None]
        return Usage(
            pk=newest.pk, user_id=newest.user_id, provider_id=newest.provider_id, message_id=newest.message_id,
            model=newest.model, status=newest.status, finish_reason=newest.finish_reason, error=newest.error,
            started=first.started, ended=newest.ended, ttft_ms=first.ttft_ms,
            tokens_per_second=newest.tokens_per_second, cost_source=newest.cost_source,
            prompt_tokens=sum(row.prompt_tokens for row in rows),
            completion_tokens=sum(row.completion_tokens for row in rows),
            reasoning_tokens=sum(row.reasoning_tokens for row in rows),
            total_tokens=sum(row.total_tokens for row in rows),
            cost=sum(costs) if costs else None,
            duration_ms=sum(row.duration_ms or 0 for row in rows) or None,
            estimated=any(row.estimated for row in rows),
        )  # fmt: skip

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
