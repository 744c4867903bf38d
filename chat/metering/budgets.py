"""Prices, costs and monthly budgets: what a stream costs and whether a person may start one.

A stream reserves its worst case on its own usage row (`reserved_usd`, `reserved_tokens`)
in the transaction that checks the budget and creates the row, with the user's row
locked (chat/metering/metered_streams.py: every stream's start and settle). What a person
has spent this month is the settled cost and tokens of their finished rows plus the
reservations of the rows still `streaming`; the final save of a stream (or the orphan
sweep) moves the row off `streaming`, which releases the reservation and counts the real
usage instead. Nothing else has to remember to give a reservation back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection
from django.db.models import Q, Sum
from django.utils import dateformat, timezone
from django.utils.translation import gettext as _

from chat.metering import summary_triggers
from chat.models.budgets import CENT_FRACTIONS, Budget, Price
from chat.models.rollups import PersonMonth, TokenMonth
from chat.models.usage import Usage

PRICE_PLACES = Decimal("0.000001")
CENTS = Decimal("0.01")


# --- prices -------------------------------------------------------------------


# USD a token of each (provider, model) whose upstream reports its costs, as it last reported in this process.
_reported_rates: dict[tuple[int | None, str], Decimal] = {}


def priced(provider_id: int | None, model: str, started: datetime, fields: dict[str, Any]) -> dict[str, Any]:
    """The cost fields of a finished stream: the upstream's reported cost, else the price in force, else the rate
    the upstream last reported for the model (an estimate), else none.

    An upstream that reports its costs (api14) reports none for a stream it did not finish (stopped, cut):
    without the rate such streams would cost nothing, and a USD budget could be spent by stopping every answer.
    """
    tokens = fields.get("total_tokens") or (fields.get("prompt_tokens") or 0) + (fields.get("completion_tokens") or 0)
    if fields.get("cost") is not None:
        if tokens > 0 and fields["cost"] > 0:
            _reported_rates[(provider_id, model)] = Decimal(str(fields["cost"])) / tokens
        return {"cost": fields["cost"], "cost_source": "reported", "cost_estimated": False}
    price = Price.objects.in_force(provider_id, model, started)
    if price is None:
        rate = _reported_rates.get((provider_id, model))
        if rate is not None and tokens > 0:
            return {"cost": (rate * tokens).quantize(CENT_FRACTIONS), "cost_source": "rate", "cost_estimated": True}
        return {"cost": None, "cost_source": "unknown", "cost_estimated": False}
    cost = price.cost(
        fields.get("prompt_tokens") or 0, fields.get("completion_tokens") or 0, fields.get("reasoning_tokens") or 0
    )
    return {"cost": cost, "cost_source": "computed", "cost_estimated": bool(fields.get("estimated"))}


def price_unpriced(rows) -> None:
    """Give finished rows with no cost yet (e.g. swept orphans) the cost of the price table."""
    for row in rows.filter(cost__isnull=True).exclude(status="streaming"):
        fields = priced(
            row.provider_id,
            row.model,
            row.started,
            {
                "prompt_tokens": row.prompt_tokens,
                "completion_tokens": row.completion_tokens,
                "reasoning_tokens": row.reasoning_tokens,
                "estimated": row.estimated,
            },
        )
        type(row).objects.filter(pk=row.pk).update(**fields)


# --- budgets ------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """A monthly budget: USD and tokens (None: no limit of that kind), and where it comes from."""

    usd: Decimal | None
    tokens: int | None
    source: str  # user, group, default or token

    @property
    def limited(self) -> bool:
        return self.usd is not None or self.tokens is not None


@dataclass(frozen=True)
class Spent:
    """Settled cost and tokens of finished streams plus the reservations of running ones."""

    usd: Decimal
    tokens: int


def default_limit() -> Limit:
    return Limit(settings.BUDGET_DEFAULT_USD, settings.BUDGET_DEFAULT_TOKENS, "default")


def budget_rows(user, token=None) -> list[dict[str, Any]]:
    """The budget rows that may apply to a user (their own, their groups') and to a token, in one query.

    Plain SQL, like spent_by(): it runs on every stream start.
    """
    sql, params = _budget_rows_sql(user, token)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return _budget_rows_of(cursor.fetchall())


def _budget_rows_sql(user, token=None) -> tuple[str, list]:
    quote = connection.ops.quote_name
    memberships = quote(Group.user_set.through._meta.db_table)
    sql = (
        f"SELECT b.user_id, b.token_id, b.usd, b.tokens FROM {quote(Budget._meta.db_table)} b "
        f"LEFT JOIN {memberships} m ON m.group_id = b.group_id AND m.user_id = %s "
        "WHERE b.user_id = %s OR m.user_id IS NOT NULL OR b.token_id = %s"
    )
    return sql, [user.pk, user.pk, token.pk if token is not None else None]


def _budget_rows_of(fetched: list[tuple]) -> list[dict[str, Any]]:
    return [
        {"user_id": u, "token_id": t, "usd": None if usd is None else _decimal(usd, CENTS), "tokens": tokens}
        for u, t, usd, tokens in fetched
    ]


def budget_for(user, rows: list[dict[str, Any]] | None = None) -> Limit:
    """A user's monthly budget: their own row, else the most generous of their groups', else the default."""
    if rows is None:
        rows = budget_rows(user)
    rows = [row for row in rows if row["token_id"] is None]
    own = next((row for row in rows if row["user_id"] is not None), None)
    if own is not None:
        return Limit(own["usd"], own["tokens"], "user")
    if rows:
        # No limit of a kind in one group means no limit of that kind: the most generous wins.
        usd = [row["usd"] for row in rows]
        tokens = [row["tokens"] for row in rows]
        return Limit(
            None if None in usd else max(usd),
            None if None in tokens else max(tokens),
            "group",
        )
    return default_limit()


def token_budget(token, rows: list[dict[str, Any]] | None = None) -> Limit | None:
    """An API token's own monthly limit, on top of its owner's; None when it has none."""
    if rows is None:
        rows = list(Budget.objects.filter(token=token).values("user_id", "token_id", "usd", "tokens"))
    row = next((row for row in rows if row["token_id"] == token.pk), None)
    return Limit(row["usd"], row["tokens"], "token") if row else None


def month_start(now: datetime | None = None) -> datetime:
    """The first moment of the current calendar month in TIME_ZONE."""
    local = timezone.localtime(now)
    return timezone.make_aware(datetime(local.year, local.month, 1))


def next_month_start(now: datetime | None = None) -> datetime:
    start = month_start(now)
    return timezone.make_aware(datetime(start.year + start.month // 12, start.month % 12 + 1, 1))


def alive_since(now: datetime | None = None) -> datetime:
    """Streaming rows started before this hold no reservation."""
    # A row still `streaming` after the longest possible stream was left by a dead process
    # that nothing swept: its reservation stops counting (as it stops holding a stream place).
    return (now or timezone.now()) - timedelta(seconds=settings.UPSTREAM_DEADLINE + 60)


def spent(rows, since: datetime) -> Spent:
    """What these usage rows spent since a moment: settled rows' cost and tokens plus running rows' reservations."""
    streaming = Q(status="streaming")
    alive = streaming & Q(started__gt=alive_since())
    totals = rows.filter(started__gte=since).aggregate(
        settled_usd=Sum("cost", filter=~streaming),
        settled_tokens=Sum("total_tokens", filter=~streaming),
        reserved_usd=Sum("reserved_usd", filter=alive),
        reserved_tokens=Sum("reserved_tokens", filter=alive),
    )
    return Spent(
        # Quantized: SQLite sums its decimal columns as floats (0.19999999999999 for 0.2).
        usd=_decimal(totals["settled_usd"]) + _decimal(totals["reserved_usd"]),
        tokens=(totals["settled_tokens"] or 0) + (totals["reserved_tokens"] or 0),
    )


# --- enforcement --------------------------------------------------------------


class BudgetExceeded(Exception):
    """A stream refused because a monthly budget is used up; `detail` is the sentence for the person."""

    code = "budget_exceeded"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class Reservation:
    """A stream's worst case, written on its usage row while it streams."""

    usd: Decimal | None
    tokens: int


# Price.objects.in_force() as a scalar subquery, one per price column.
PRICE_COLUMNS = ("prompt", "completion", "reasoning")
MONTH_WIDTH = 5  # _month_sql()'s columns before the price's
PRICE_SUBQUERY = (
    "(SELECT {column} FROM {table} WHERE model = %s AND effective_from <= %s "
    "AND (provider_id = %s OR provider_id IS NULL) "
    "ORDER BY CASE WHEN provider_id IS NULL THEN 1 ELSE 0 END, effective_from DESC LIMIT 1)"
)


def reserve_reads(user, *, token=None, provider_id: int | None, model: str,
                  now: datetime) -> tuple[tuple[str, list], list[tuple[str, list, int]]]:  # fmt: skip
    """What reserve() reads, as statements a start sends with its others in one round trip (metered_streams).

    The budget rows; and the person's month with the price and the token's month, one row each (with
    its width, so that a start can read them side by side in one statement): the months are read
    whether or not a budget applies, as sending them costs less than a round trip more.
    """
    since = month_start(now)
    months = [(*_month_sql("user_id", user.pk, since, now, (provider_id, model)), MONTH_WIDTH + len(PRICE_COLUMNS))]
    if token is not None:
        months.append((*_month_sql("token_id", token.pk, since, now, None, user_id=user.pk), MONTH_WIDTH))
    return _budget_rows_sql(user, token), months


def reserve(user, *, token=None, provider_id: int | None, model: str, prompt_tokens: int, max_tokens: int,
            now: datetime | None = None, read: list[list[tuple]] | None = None,
            ahead: Spent | None = None) -> Reservation:  # fmt: skip
    """Refuse a new stream over a monthly budget, else its reservation; call with the user's row locked.

    A stream may start while what is spent and reserved is under the limit: N simultaneous
    requests overspend by at most the one reservation that crossed it. `read`: the rows of
    reserve_reads()'s statements for `now`, read after the lock was had, when the start read them already.
    `ahead`: the reservations of starts of the same person and token admitted before this one in
    its transaction, not yet written.
    """
    now = now or timezone.now()
    rows = _budget_rows_of(read[0]) if read is not None else budget_rows(user, token)
    limit = budget_for(user, rows)
    own = token_budget(token, rows) if token is not None else None
    since = month_start(now)
    # The USD worst case needs the price table, and only a USD limit needs it: the price
    # comes with the first month's sum, so a stream start costs one or two round trips.
    price_of = (provider_id, model) if limit.usd is not None or (own is not None and own.usd is not None) else None
    price = None
    if limit.limited:
        found = _month_of(read[1][0]) if read is not None else None
        used, price = found or _month_and_price("user_id", user.pk, since, now, price_of)
        _check(limit, _plus(used, ahead), "Your", now)
    if own is not None and own.limited:
        found = _month_of(read[2][0]) if read is not None else None
        if found is not None:
            used, token_price = found[0], (_month_of(read[1][0]) or (None, None))[1]
        else:
            used, token_price = _month_and_price(
                "token_id", token.pk, since, now, None if limit.limited else price_of, user_id=user.pk
            )
        price = price or token_price
        _check(own, _plus(used, ahead), "This API token's", now)
    usd = price.worst_case(prompt_tokens, max_tokens) if price is not None and price_of is not None else None
    return Reservation(usd, prompt_tokens + max_tokens)


def _plus(used: Spent, ahead: Spent | None) -> Spent:
    return used if ahead is None else Spent(usd=used.usd + ahead.usd, tokens=used.tokens + ahead.tokens)


def spent_by(column: str, value: int, since: datetime, now: datetime) -> Spent:
    """spent() for one user or token, in plain SQL (see _month_and_price)."""
    return _month_and_price(column, value, since, now, None)[0]


def _month_and_price(column: str, value: int, since: datetime, now: datetime,
                     price_of: tuple[int | None, str] | None, user_id: int | None = None,
                     ) -> tuple[Spent, Price | None]:  # fmt: skip
    """What a user or token spent since a moment, and the price in force for (provider, model) if asked.

    Plain SQL: it runs on every stream start, where the ORM's compiling of four filtered
    sums costs more than the query itself. A calendar month is read from the user's or the
    token's monthly summary (kept equal to the rows by chat/metering/summary_triggers.py's triggers) and the
    user's running rows (`user_id`: a token's owner), so a start costs the same with 25,000
    rows in the month as with none; while the summaries count days in another zone, and for
    any other span, it is summed from the rows.
    """
    ops = connection.ops
    prices, price_params = _price_columns(now, price_of)
    alive, start = ops.adapt_datetimefield_value(alive_since(now)), ops.adapt_datetimefield_value(since)
    if since == month_start(now):
        sql, params = _month_sql(column, value, since, now, price_of, user_id)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            found = _month_of(cursor.fetchone())
        if found is not None:
            return found
    sql = (
        "SELECT SUM(CASE WHEN status <> %s THEN cost END), SUM(CASE WHEN status <> %s THEN total_tokens END), "
        "SUM(CASE WHEN status = %s AND started > %s THEN reserved_usd END), "
        f"SUM(CASE WHEN status = %s AND started > %s THEN reserved_tokens END){prices} "
        f"FROM {ops.quote_name(Usage._meta.db_table)} WHERE {column} = %s AND started >= %s"
    )
    params = ["streaming", "streaming", "streaming", alive, "streaming", alive, *price_params, value, start]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        settled_usd, settled_tokens, reserved_usd, reserved_tokens, *price_row = cursor.fetchone()
    return _spent(settled_usd, settled_tokens, reserved_usd, reserved_tokens), _price(price_row)


def _month_sql(column: str, value: int, since: datetime, now: datetime, price_of: tuple[int | None, str] | None,
               user_id: int | None = None) -> tuple[str, list]:  # fmt: skip
    """_month_and_price()'s statement for a calendar month (`since` its start), from the monthly summary."""
    ops = connection.ops
    prices, price_params = _price_columns(now, price_of)
    alive, start = ops.adapt_datetimefield_value(alive_since(now)), ops.adapt_datetimefield_value(since)
    current, current_params = summary_triggers.current_sql(connection.vendor)
    summary = PersonMonth if column == "user_id" else TokenMonth
    months, rows = ops.quote_name(summary._meta.db_table), ops.quote_name(Usage._meta.db_table)
    # The running rows: the user's, through the index of running rows (chat/metering/limits.py's too).
    owner = [("user_id", user_id)] if column == "token_id" and user_id is not None else []
    running = [*owner, (column, value)]
    sql = (
        f"SELECT s.cost, s.tokens, r.usd, r.tokens, {current}{prices} FROM "
        f"(SELECT SUM(budget_cost) AS cost, SUM(budget_tokens) AS tokens FROM {months} "
        f"WHERE {column} = %s AND day = %s) s CROSS JOIN "
        f"(SELECT SUM(reserved_usd) AS usd, SUM(reserved_tokens) AS tokens FROM {rows} "
        f"WHERE {' AND '.join(f'{name} = %s' for name, _ in running)} "
        # The status written in, not bound: so the planners use the index of running rows.
        "AND status = 'streaming' AND started > %s AND started >= %s) r"
    )
    month = ops.adapt_datefield_value(timezone.localdate(since))
    return sql, [*current_params, *price_params, value, month, *(v for _, v in running), alive, start]


def _month_of(row: tuple) -> tuple[Spent, Price | None] | None:
    """_month_sql()'s row as what was spent and the price; None while the summaries count days in another zone."""
    settled_usd, settled_tokens, reserved_usd, reserved_tokens, summed, *price_row = row
    if not summed:
        return None
    return _spent(settled_usd, settled_tokens, reserved_usd, reserved_tokens), _price(price_row)


def _price_columns(now: datetime, price_of: tuple[int | None, str] | None) -> tuple[str, list[Any]]:
    """The price columns to add to a SELECT (none unless asked) and their parameters."""
    if price_of is None:
        return "", []
    ops = connection.ops
    table = ops.quote_name(Price._meta.db_table)
    sql, params = "", []
    for column_name in PRICE_COLUMNS:
        sql += ", " + PRICE_SUBQUERY.format(column=column_name, table=table)
        params += [price_of[1], ops.adapt_datetimefield_value(now), price_of[0]]
    return sql, params


def _spent(settled_usd, settled_tokens, reserved_usd, reserved_tokens) -> Spent:
    return Spent(usd=_decimal(settled_usd) + _decimal(reserved_usd),
                 tokens=int(settled_tokens or 0) + int(reserved_tokens or 0))  # fmt: skip


def _price(row: list) -> Price | None:
    if not row or row[0] is None:
        return None
    prompt, completion, reasoning = (None if v is None else _decimal(v, PRICE_PLACES) for v in row)
    return Price(prompt=prompt, completion=completion, reasoning=reasoning)


def _decimal(value, places: Decimal = CENT_FRACTIONS) -> Decimal:
    # SQLite hands back decimal columns (and their sums) as floats, ints or text; PostgreSQL as Decimal.
    if value is None:
        return Decimal(0)
    return (value if isinstance(value, Decimal) else Decimal(str(value))).quantize(places)


def _check(limit: Limit, used: Spent, whose: str, now: datetime) -> None:
    # `whose` is "Your" or "This API token's": whole sentences each, so they translate.
    token = whose != "Your"
    day = format_day(next_month_start(now))
    if limit.usd is not None and used.usd >= limit.usd:
        values = {"limit": format_usd(limit.usd), "used": format_usd(used.usd), "day": day}
        if token:
            detail = _(
                "This API token's monthly budget of %(limit)s is used up "
                "(%(used)s spent or reserved this month); it resets on %(day)s."
            )
        else:
            detail = _(
                "Your monthly budget of %(limit)s is used up "
                "(%(used)s spent or reserved this month); it resets on %(day)s."
            )
        raise BudgetExceeded(detail % values)
    if limit.tokens is not None and used.tokens >= limit.tokens:
        values = {"limit": f"{limit.tokens:,}", "used": f"{used.tokens:,}", "day": day}
        if token:
            detail = _(
                "This API token's monthly budget of %(limit)s tokens is used up "
                "(%(used)s used or reserved this month); it resets on %(day)s."
            )
        else:
            detail = _(
                "Your monthly budget of %(limit)s tokens is used up "
                "(%(used)s used or reserved this month); it resets on %(day)s."
            )
        raise BudgetExceeded(detail % values)


def format_usd(amount: Decimal) -> str:
    return f"${amount.quantize(Decimal('0.01')):,}"


def format_day(moment: datetime) -> str:
    # Month names in the active language ("1 December 2026", "1 décembre 2026").
    return dateformat.format(timezone.localtime(moment), "j F Y")


def refuse(user, *, source: str, token=None, provider_id: int | None, model: str, detail: str) -> None:
    """Record a refused stream, outside the rolled-back transaction that refused it.

    Its tokens stay 0: nothing went upstream, and the dashboard's tokens are those the models were sent.
    """
    now = timezone.now()
    Usage.objects.create(
        user=user,
        token=token,
        provider_id=provider_id,
        source=source,
        model=model,
        status="refused",
        started=now,
        ended=now,
        error=detail,
        cost_source="unknown",
    )


def summary(user, now: datetime | None = None) -> dict[str, Any]:
    """A person's month so far, for the page's sidebar (read after every answer) and `manage.py budget`."""
    now = now or timezone.now()
    limit = budget_for(user)
    used = spent_by("user_id", user.pk, month_start(now), now)

    def share(used_amount, limit_amount) -> float | None:
        if limit_amount is None:
            return None
        return 1.0 if limit_amount == 0 else float(used_amount / limit_amount)

    return {
        "usd": {
            "limit": f"{limit.usd:f}" if limit.usd is not None else None,
            "spent": f"{used.usd.quantize(CENT_FRACTIONS):f}",
            "remaining": f"{max(limit.usd - used.usd, Decimal(0)).quantize(CENT_FRACTIONS):f}"
            if limit.usd is not None
            else None,
            "share": share(used.usd, limit.usd),
        },
        "tokens": {
            "limit": limit.tokens,
            "spent": used.tokens,
            "remaining": max(limit.tokens - used.tokens, 0) if limit.tokens is not None else None,
            "share": share(used.tokens, limit.tokens),
        },
        "source": limit.source,
        "since": month_start(now).isoformat(),
        "resets": next_month_start(now).isoformat(),
        "resets_on": timezone.localdate(next_month_start(now)).isoformat(),
    }


def month_spent(user) -> Spent:
    """What a user has spent (or reserved) this calendar month."""
    return spent(Usage.objects.filter(user=user), month_start())
