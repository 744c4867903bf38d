"""Daily sums of the usage rows, for the dashboard and budgets: kept by triggers (chat/metering/summary_triggers.py).

Not one (day, person, model, source) table: on a team where everyone uses many models it would
be nearly as long as the rows. Per day, model and source for the totals, the charts and the
model table; per month, person and source for the person table, with per day, person and source
for the days of a period outside whole months (a year by day and person is still a third of the
rows of a busy team); per month and API token for the tokens' own budgets. Every insert,
update and delete of a usage row adds its figures to each (and takes its old ones off),
whatever code wrote it, so they equal a GROUP BY over the rows at every commit.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from chat.models.base import MODEL_MAX_LENGTH


class Sums(models.Model):
    """What both summaries add up per row (cost: empty costs count as 0, as the dashboard shows them)."""

    day = models.DateField()  # the row's `started` as a calendar day in TIME_ZONE
    source = models.CharField(max_length=4)
    requests = models.BigIntegerField(default=0)
    prompt_tokens = models.BigIntegerField(default=0)
    completion_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=8, default=0)

    class Meta:
        abstract = True


# UsageDay's rows per day, model and source: a usage row counts in shard `id % USAGE_DAY_SHARDS`.
USAGE_DAY_SHARDS = 16


class UsageDay(Sums):
    """One day, model and source (in shards, summed on read): its sums, rows with a TTFT and a speed, bad endings.

    Every stream's start and end of a model on a day would otherwise write the same row, so that
    starts of different people waited for each other's commits; a row's shard is its id's, so its
    start and its end write the same shard, and starts at the same moment (consecutive ids) do not.
    """

    model = models.CharField(max_length=MODEL_MAX_LENGTH)
    shard = models.SmallIntegerField(default=0)
    timed = models.BigIntegerField(default=0)  # rows with a ttft_ms (the percentiles' positions)
    speeds = models.BigIntegerField(default=0)  # rows with a tokens_per_second
    stopped = models.BigIntegerField(default=0)
    interrupted = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "model", "source", "shard"], name="usage_day_shard_key")]

    def __str__(self) -> str:
        return f"{self.model} via {self.source} on {self.day}"


class PersonDay(Sums):
    """One day, person and source: their sums."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "user", "source"], name="person_day_key")]

    def __str__(self) -> str:
        return f"user {self.user_id} via {self.source} on {self.day}"


class PersonMonth(Sums):
    """One month (`day` is its first), person and source: their sums, and what their budget counts as spent."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # The finished rows' cost and reported total tokens (chat.metering.budgets): a row still streaming
    # counts by its reservation instead, read from the row itself.
    budget_cost = models.DecimalField(max_digits=20, decimal_places=8, default=0)
    budget_tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "user", "source"], name="person_month_key")]

    def __str__(self) -> str:
        return f"user {self.user_id} via {self.source} in {self.day:%Y-%m}"


class TokenMonth(models.Model):
    """One month (`day` is its first) and API token: what the token's own budget counts as spent (metering.budgets)."""

    day = models.DateField()
    token = models.ForeignKey("chat.ApiToken", on_delete=models.CASCADE, related_name="+")
    requests = models.BigIntegerField(default=0)
    budget_cost = models.DecimalField(max_digits=20, decimal_places=8, default=0)
    budget_tokens = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "token"], name="token_month_key")]

    def __str__(self) -> str:
        return f"token {self.token_id} in {self.day:%Y-%m}"
