"""Prices per model and monthly budgets per person, group or token: the rows staff edit in the admin."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection, models
from django.db.models import Q
from django.utils import timezone

from chat.models.base import columns_of, rows_of

MILLION = Decimal(1_000_000)
CENT_FRACTIONS = Decimal("0.00000001")  # the cost column's 8 decimal places


class PriceQuerySet(models.QuerySet):
    def in_force(self, provider_id: int | None, model: str, at: datetime) -> Price | None:
        """The price of a model at a moment: the newest in force then; the provider's own before an any-provider one."""
        # Plain SQL: it runs at the end of every stream, where compiling the ORM's query cost more than running it.
        ops = connection.ops
        sql = (
            f"SELECT {columns_of(Price)} FROM {ops.quote_name(self.model._meta.db_table)} WHERE model = %s "
            "AND effective_from <= %s AND (provider_id = %s OR provider_id IS NULL) "
            "ORDER BY CASE WHEN provider_id IS NULL THEN 1 ELSE 0 END, effective_from DESC LIMIT 1"
        )
        return next(iter(rows_of(Price, sql, [model, ops.adapt_datetimefield_value(at), provider_id])), None)


class Price(models.Model):
    """A model's price in USD per million tokens, from a date on (a new row for a change keeps history right)."""

    provider = models.ForeignKey(
        "chat.Provider",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="prices",
        help_text="Empty: this model id at any provider without a price of its own.",
    )
    model = models.CharField("model id", max_length=300, help_text="As sent upstream, without the provider prefix.")
    prompt = models.DecimalField("prompt (USD / M tokens)", max_digits=12, decimal_places=6)
    completion = models.DecimalField("completion (USD / M tokens)", max_digits=12, decimal_places=6)
    reasoning = models.DecimalField(
        "reasoning (USD / M tokens)",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="Empty: the completion price.",
    )
    cached_prompt = models.DecimalField(
        "cached prompt (USD / M tokens)",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="Empty: the prompt price.",
    )
    effective_from = models.DateTimeField(default=timezone.now, help_text="Streams started from then on use it.")

    objects = PriceQuerySet.as_manager()

    class Meta:
        ordering = ["model", "-effective_from"]
        indexes = [models.Index(fields=["model", "-effective_from"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(prompt__gte=0)
                & Q(completion__gte=0)
                & (Q(reasoning__isnull=True) | Q(reasoning__gte=0))
                & (Q(cached_prompt__isnull=True) | Q(cached_prompt__gte=0)),
                name="price_not_negative",
                violation_error_message="A price cannot be negative.",
            )
        ]

    def __str__(self) -> str:
        where = self.provider.name if self.provider_id else "any provider"
        return f"{self.model} at {where} from {self.effective_from:%Y-%m-%d}"

    def cost(self, prompt: int, completion: int, reasoning: int = 0, cached: int = 0) -> Decimal:
        """USD for these counts; completion includes reasoning (OpenAI's counting), prompt includes cached."""
        reasoning = min(reasoning, completion)
        cached = min(cached, prompt)
        total = (
            (prompt - cached) * self.prompt
            + cached * (self.cached_prompt if self.cached_prompt is not None else self.prompt)
            + (completion - reasoning) * self.completion
            + reasoning * (self.reasoning if self.reasoning is not None else self.completion)
        )
        return (total / MILLION).quantize(CENT_FRACTIONS)

    def worst_case(self, prompt: int, completion: int) -> Decimal:
        """The most a request can cost: every completion token at the dearer of completion and reasoning."""
        dearest = max(self.completion, self.reasoning if self.reasoning is not None else self.completion)
        return ((prompt * self.prompt + completion * dearest) / MILLION).quantize(CENT_FRACTIONS)


class Budget(models.Model):
    """A monthly limit in USD and/or tokens for one user, one group or one API token (empty: no limit of that kind)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="budget"
    )
    group = models.OneToOneField(Group, on_delete=models.CASCADE, null=True, blank=True, related_name="budget")
    token = models.OneToOneField(
        "chat.ApiToken", on_delete=models.CASCADE, null=True, blank=True, related_name="budget"
    )
    usd = models.DecimalField(
        "USD a month", max_digits=12, decimal_places=2, null=True, blank=True, help_text="Empty: no USD limit."
    )
    tokens = models.PositiveBigIntegerField("tokens a month", null=True, blank=True, help_text="Empty: no token limit.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(user__isnull=False, group__isnull=True, token__isnull=True)
                    | Q(user__isnull=True, group__isnull=False, token__isnull=True)
                    | Q(user__isnull=True, group__isnull=True, token__isnull=False)
                ),
                name="budget_for_one_user_group_or_token",
                violation_error_message="A budget is for exactly one of: a user, a group, an API token.",
            ),
            models.CheckConstraint(
                condition=Q(usd__isnull=True) | Q(usd__gte=0),
                name="budget_usd_not_negative",
                violation_error_message="A budget cannot be negative.",
            ),
        ]

    def __str__(self) -> str:
        return f"budget of {self.user or self.group or self.token}"
