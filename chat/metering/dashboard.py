"""The usage dashboard's figures: a period and filters in, aggregates out, every sum and count made by the database.

Python only ever loops over aggregated rows (a day and a model, a person, a model), never over
usage rows. The sums come from the daily summaries (chat/models/rollups.py), so a year costs a
GROUP BY over some thousands of days rather than a million rows (see bench/dashboard_bench.py);
with a person or a group chosen, from that person's or group's rows, which the (user, started)
index finds. The percentiles always come from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Count, DateField, Func, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from chat.metering import budgets as budgets_module
from chat.metering import summary_triggers
from chat.metering.percentiles import PERCENTILES, percentiles
from chat.models import Message, PersonDay, PersonMonth, Price, Usage, UsageDay

PRESETS = {
    "month": gettext_lazy("This month"),
    "last-month": gettext_lazy("Last month"),
    "7d": gettext_lazy("Last 7 days"),
    "30d": gettext_lazy("Last 30 days"),
    "year": gettext_lazy("This year"),
    "custom": gettext_lazy("Custom range"),
}
# A custom range longer than this is refused: the daily charts would have thousands of bars.
MAX_DAYS = 800
ENDINGS = (Message.Status.STOPPED, Message.Status.INTERRUPTED, Message.Status.FAILED)


class FilterError(Exception):
    """A filter the viewer may not use, or cannot be read; `status` is the HTTP status to answer."""

    def __init__(self, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


@dataclass(frozen=True)
class Filters:
    preset: str
    first: date  # the period's first local day
    last: date  # its last local day, inclusive
    user_id: int | None = None
    group_id: int | None = None
    model: str = ""
    source: str = ""

    @property
    def start(self) -> datetime:
        return timezone.make_aware(datetime.combine(self.first, time.min))

    @property
    def end(self) -> datetime:
        return timezone.make_aware(datetime.combine(self.last + timedelta(days=1), time.min))

    def days(self) -> list[date]:
        return [self.first + timedelta(days=n) for n in range((self.last - self.first).days + 1)]


def preset_range(preset: str, today: date) -> tuple[date, date]:
    """The first and last day of a preset period (the month, 7/30 days and year end today)."""
    if preset == "last-month":
        last = today.replace(day=1) - timedelta(days=1)
        return last.replace(day=1), last
    if preset == "7d":
        return today - timedelta(days=6), today
    if preset == "30d":
        return today - timedelta(days=29), today
    if preset == "year":
        return today.replace(month=1, day=1), today
    return today.replace(day=1), today


def sees_everyone(viewer) -> bool:
    """Whether `viewer` sees the whole team's figures: the permission to view usage rows (a superuser has it).

    Not is_staff alone: staff given only some of the admin (say, providers) see their own usage, as everyone does.
    """
    return viewer.has_perm("chat.view_usage")


def parse_filters(query, viewer, today: date | None = None) -> Filters:
    """Filters from a GET query; people who may not see everyone's (sees_everyone) only ever get their own rows."""
    today = today or timezone.localdate()
    preset = query.get("period") or "month"
    if preset not in PRESETS:
        raise FilterError(
            _("There is no period called %(name)s: choose one of %(choices)s.")
            % {"name": preset[:40], "choices": ", ".join(PRESETS)}
        )
    if preset == "custom":
        first, last = day_param(query, "from", _("first")), day_param(query, "to", _("last"))
        if first > last:
            raise FilterError(_("The range starts after it ends: the first day must come before the last."))
        if (last - first).days >= MAX_DAYS:
            raise FilterError(_("The range is too long: at most %(days)d days.") % {"days": MAX_DAYS})
    else:
        first, last = preset_range(preset, today)
    user_id, group_id = id_param(query, "user"), id_param(query, "group")
    if not sees_everyone(viewer):
        if (user_id is not None and user_id != viewer.pk) or group_id is not None:
            raise FilterError(_("You can only see your own usage."), status=403)
        user_id = viewer.pk
    source = query.get("source") or ""
    if source and source not in Usage.Source.values:
        raise FilterError(_("Unknown source: choose chat, api or titl (the titles models wrote)."))
    model = (query.get("model") or "")[: Usage._meta.get_field("model").max_length]
    return Filters(preset, first, last, user_id, group_id, model, source)


# The days a custom range may name: the period's end (the day after its last, at midnight in TIME_ZONE, then in
# UTC) must still be a date Python can hold; 9999-12-31 made it overflow.
FIRST_DAY, LAST_DAY = date(1900, 1, 1), date(9998, 12, 31)


def day_param(query, name: str, which: str) -> date:
    value = query.get(name) or ""
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise FilterError(_("Give the %(which)s day of the custom range as YYYY-MM-DD.") % {"which": which}) from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise FilterError(
            _("The %(which)s day of the custom range must be between %(first)s and %(last)s.")
            % {"which": which, "first": FIRST_DAY.isoformat(), "last": LAST_DAY.isoformat()}
        )
    return day


def id_param(query, name: str) -> int | None:
    value = query.get(name) or ""
    if not value:
        return None
    # ASCII digits only: "²" is a digit to str.isdigit() but not to int(). 18 fit any id column.
    if not (value.isascii() and value.isdecimal()) or len(value) > 18:
        raise FilterError(_("The %(name)s filter must be an id number.") % {"name": name})
    return int(value)


def usage_rows(filters: Filters, *, model: bool = True):
    """The usage rows behind the filters (model=False: all models, for the model picker)."""
    rows = Usage.objects.filter(started__gte=filters.start, started__lt=filters.end)
    if filters.user_id is not None:
        rows = rows.filter(user_id=filters.user_id)
    if filters.group_id is not None:
        rows = rows.filter(user__groups=filters.group_id)
    if filters.source:
        rows = rows.filter(source=filters.source)
    if model and filters.model:
        rows = rows.filter(model=filters.model)
    return rows.order_by()  # Usage's default ordering would join the GROUP BY


# --- database functions ------------------------------------------------------------


class LocalDate(Func):
    """The calendar day of a datetime in settings.TIME_ZONE, computed by the database.

    PostgreSQL: Django's TruncDate (`AT TIME ZONE`). SQLite: TruncDate calls a Python function
    for every row, a second per million rows, so SQLite's own date() is used instead; for a zone
    other than UTC with its 'localtime' modifier, which follows the TZ variable that Django sets
    from TIME_ZONE at start-up (on Unix, the only place this server runs).
    """

    output_field = DateField()

    def as_sql(self, compiler, connection, **extra):
        truncated = TruncDate(*self.source_expressions, tzinfo=timezone.get_current_timezone())
        return compiler.compile(truncated)

    def as_sqlite(self, compiler, connection, **extra):
        sql, params = compiler.compile(self.source_expressions[0])
        modifier = "" if settings.TIME_ZONE == "UTC" else ", 'localtime'"
        return f"date({sql}{modifier})", params


# --- the figures -------------------------------------------------------------------


@dataclass
class Figures:
    filters: Filters
    totals: dict
    days: list[str]
    cost_series: dict[str, list[float]]
    token_series: dict[str, list[int]]
    people: list[dict]
    models: list[dict]

    def as_json(self) -> dict:
        """What the page's script draws, and the figures of its tables (json_script; decimals as strings)."""
        return {
            "days": self.days,
            "cost": self.cost_series,
            "tokens": self.token_series,
            "totals": self.totals,
            "people": self.people,
            "models": self.models,
        }


SUMS = {
    "prompt_tokens": Sum("prompt_tokens"),
    "completion_tokens": Sum("completion_tokens"),
    "reasoning_tokens": Sum("reasoning_tokens"),
    "cost": Sum("cost"),
}
# What the summaries add up (chat/models/rollups.py), by the names the rows' GROUP BYs give them.
SUMMED = ("requests", "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost")
MODEL_SUMMED = (*SUMMED, "timed", "speeds", *ENDINGS)


def from_summaries(filters: Filters) -> bool:
    """Whether the daily summaries can answer: no person or group chosen, and days counted in today's TIME_ZONE."""
    return (
        filters.user_id is None and filters.group_id is None and summary_triggers.installed_zone() == settings.TIME_ZONE
    )


def summary_rows(summary, filters: Filters, by: tuple[str, ...], names: tuple[str, ...], days: Q | None = None):
    """A summary's sums over the period (or these days of it), grouped by some of its key columns.

    Groups without rows (their rows deleted since) are left out.
    """
    found = summary.objects.filter(days or Q(day__gte=filters.first, day__lte=filters.last))
    if filters.source:
        found = found.filter(source=filters.source)
    if filters.model and summary is UsageDay:
        found = found.filter(model=filters.model)
    # Annotations may not take the names of the summary's columns: summed as total_<name>, renamed after.
    found = found.values(*by).annotate(**{f"total_{name}": Sum(name) for name in names}).filter(total_requests__gt=0)
    return [{**{key: row[key] for key in by}, **{name: row[f"total_{name}"] for name in names}} for row in found]


def whole_months(first: date, last: date) -> tuple[date, date] | None:
    """The first days of the first and the last calendar month wholly inside [first, last]; None if none is."""
    start = first if first.day == 1 else (first.replace(day=28) + timedelta(days=4)).replace(day=1)
    end = last.replace(day=1)
    if (last + timedelta(days=1)).day != 1:  # the last month is not whole
        end = (end - timedelta(days=1)).replace(day=1)
    return (start, end) if start <= end else None


def person_sums(filters: Filters) -> list[dict]:
    """Each person's sums over the period: whole months from PersonMonth, the days either side from PersonDay."""
    months = whole_months(filters.first, filters.last)
    if months is None:
        return summary_rows(PersonDay, filters, ("user_id",), SUMMED)
    start, end = months
    after = (end + timedelta(days=31)).replace(day=1)
    either_side = Q(day__gte=filters.first, day__lt=start) | Q(day__gte=after, day__lte=filters.last)
    people: dict[int, dict] = {}
    for row in summary_rows(PersonMonth, filters, ("user_id",), SUMMED, Q(day__gte=start, day__lte=end)) + (
        summary_rows(PersonDay, filters, ("user_id",), SUMMED, either_side)
    ):
        person = people.setdefault(row["user_id"], dict.fromkeys(SUMMED, 0) | {"user_id": row["user_id"]})
        for name in SUMMED:
            person[name] += row[name] or 0
    return list(people.values())


def daily_rows(filters: Filters, rows, summaries: bool) -> list[dict]:
    """One row per day and model with its sums, counts of timed rows and of endings."""
    if summaries:
        return summary_rows(UsageDay, filters, ("day", "model"), MODEL_SUMMED)
    return list(
        rows.annotate(day=LocalDate("started"))
        .values("day", "model")
        .annotate(
            requests=Count("pk"),
            timed=Count("ttft_ms"),
            speeds=Count("tokens_per_second"),
            **SUMS,
            **{status: Count("pk", filter=Q(status=status)) for status in ENDINGS},
        )
    )


def figures(filters: Filters) -> Figures:
    """Everything the dashboard shows for these filters."""
    rows = usage_rows(filters)
    summaries = from_summaries(filters)
    daily = daily_rows(filters, rows, summaries)
    days = [day.isoformat() for day in filters.days()]
    index = {day: n for n, day in enumerate(days)}
    per_model: dict[str, dict] = {}
    cost_series: dict[str, list[float]] = {}
    token_series: dict[str, list[int]] = {}
    counted = ("requests", "timed", "speeds", "prompt_tokens", "completion_tokens", "reasoning_tokens", *ENDINGS)
    for row in daily:  # one row per day and model: at most days x models
        model = row["model"]
        totals = per_model.setdefault(model, {"model": model, "cost": Decimal(0), **dict.fromkeys(counted, 0)})
        for name in counted:
            totals[name] += row[name] or 0
        totals["cost"] += row["cost"] or 0
        slot = index.get(row["day"].isoformat())
        if slot is not None:
            cost_series.setdefault(model, [0.0] * len(days))[slot] += float(row["cost"] or 0)
            tokens = (row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)
            token_series.setdefault(model, [0] * len(days))[slot] += tokens
    counts = {model: {"ttft_ms": t["timed"], "tokens_per_second": t["speeds"]} for model, t in per_model.items()}
    spread = percentiles(rows, counts)
    # A model with no price and no cost reported by its upstream costs 0 here; the page says so, not $0.
    with_price = set(Price.objects.filter(model__in=list(per_model)).values_list("model", flat=True).distinct())
    models = []
    for model, totals in sorted(per_model.items(), key=lambda item: (-item[1]["cost"], item[0])):
        requests = totals["requests"]
        models.append(
            {
                "model": model,
                "requests": requests,
                "tokens": totals["prompt_tokens"] + totals["completion_tokens"],
                "cost": totals["cost"],
                "priced": bool(totals["cost"]) or model in with_price,
                **spread.get(model, dict.fromkeys(PERCENTILES)),
                **{f"{status}_share": totals[status] / requests if requests else 0 for status in ENDINGS},
            }
        )
    people = people_rows(rows, filters, summaries)
    summed = ("requests", "prompt_tokens", "completion_tokens", "reasoning_tokens")
    totals = {name: sum(t[name] for t in per_model.values()) for name in summed}
    totals["cost"] = sum((t["cost"] for t in per_model.values()), Decimal(0))
    totals["people"] = len(people)
    return Figures(filters, totals, days, cost_series, token_series, people, models)


def people_rows(rows, filters: Filters, summaries: bool) -> list[dict]:
    """One row per person active in the period, with their share of their monthly budget when they have one."""
    if summaries and not filters.model:  # the person summaries have no model: a chosen one needs the rows
        people = person_sums(filters)
    else:
        # Grouped by user_id alone: joining the users here would look one up for every usage row.
        people = list(rows.values("user_id").annotate(requests=Count("pk"), **SUMS))
    users = get_user_model().objects.in_bulk([p["user_id"] for p in people])
    budgets = budget_rows_by_user(list(users))
    latest = last_active(filters, list(users))
    local = timezone.get_current_timezone()
    for person in people:
        user = users[person["user_id"]]
        person["username"] = user.get_username()
        person["cost"] = person["cost"] or Decimal(0)
        for name in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
            person[name] = person[name] or 0
        person["last_active"] = latest.get(user.pk)
        # As the page shows it: in TIME_ZONE (the browser's clock may be in another).
        person["last_active_shown"] = f"{latest[user.pk].astimezone(local):%Y-%m-%d %H:%M}" if user.pk in latest else ""
        person["budget_share"] = budget_share(person, budgets_module.budget_for(user, budgets.get(user.pk, [])))
    people.sort(key=lambda p: (-p["cost"], p["username"]))
    return people


def last_active(filters: Filters, user_ids: list[int]) -> dict[int, datetime]:
    """Each person's latest row behind the filters: a walk down the (user, started) index each, no pass over all."""
    latest = usage_rows(filters).filter(user=OuterRef("pk")).order_by("-started").values("started")[:1]
    found = get_user_model().objects.filter(pk__in=user_ids).annotate(latest=Subquery(latest))
    return {pk: moment for pk, moment in found.values_list("pk", "latest") if moment is not None}


def budget_rows_by_user(user_ids: list[int]) -> dict[int, list[dict]]:
    """Every person's own and group budget rows, as budgets.budget_for() takes them: three queries, not one each."""
    fields = ("user_id", "token_id", "usd", "tokens")
    found: dict[int, list[dict]] = {}
    for row in budgets_module.Budget.objects.filter(user_id__in=user_ids).values(*fields):
        found.setdefault(row["user_id"], []).append(row)
    groups = {row.pop("group_id"): row for row in budgets_module.Budget.objects.filter(group__isnull=False).values(
        "group_id", *fields)}  # fmt: skip
    if groups:
        members = get_user_model().groups.through.objects.filter(user_id__in=user_ids, group_id__in=groups)
        for user_id, group_id in members.values_list("user_id", "group_id"):
            found.setdefault(user_id, []).append(groups[group_id])
    return found


def budget_share(person: dict, budget) -> float | None:
    """Spend over a monthly budget (budgets.Limit): in USD when it has an amount, else in tokens; None without one."""
    if budget is None:
        return None
    usd, tokens = getattr(budget, "usd", None), getattr(budget, "tokens", None)
    if usd:
        return float(person["cost"] / Decimal(usd))
    if tokens:
        return (person["prompt_tokens"] + person["completion_tokens"]) / tokens
    return None


def model_choices(filters: Filters, figures: Figures) -> list[str]:
    """The models the picker offers: those used in the period (by the viewer's rows when not staff)."""
    if not filters.model:
        return sorted(m["model"] for m in figures.models)
    if from_summaries(filters):
        days = UsageDay.objects.filter(day__gte=filters.first, day__lte=filters.last, requests__gt=0)
        if filters.source:
            days = days.filter(source=filters.source)
        return sorted(days.values_list("model", flat=True).distinct())
    return sorted(usage_rows(filters, model=False).values_list("model", flat=True).distinct())


def choices(viewer) -> dict:
    """People and groups for the filters of those who see everyone's figures."""
    if not sees_everyone(viewer):
        return {"users": [], "groups": []}
    users = get_user_model().objects.order_by("username").values_list("pk", "username")
    return {"users": list(users), "groups": list(Group.objects.order_by("name").values_list("pk", "name"))}


# --- CSV -----------------------------------------------------------------------------

CSV_COLUMNS = {
    "started": "started",
    "user__username": "user",
    "source": "source",
    "provider__name": "provider",
    "model": "model",
    "status": "status",
    "finish_reason": "finish_reason",
    "prompt_tokens": "prompt_tokens",
    "completion_tokens": "completion_tokens",
    "reasoning_tokens": "reasoning_tokens",
    "total_tokens": "total_tokens",
    "cost": "cost_usd",
    "estimated": "estimated",
    "ttft_ms": "ttft_ms",
    "tokens_per_second": "tokens_per_second",
    "duration_ms": "duration_ms",
}
# Text a spreadsheet would run as a formula (a model id or a name starting with "=" or "@").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return timezone.localtime(value).isoformat()
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, str):
        return "'" + value if value.startswith(FORMULA_START) else value
    return str(value)


def csv_rows(filters: Filters):
    """The usage rows behind the filters as CSV cells, oldest first, read from a server-side cursor."""
    return usage_rows(filters).order_by("started", "pk").values_list(*CSV_COLUMNS)
