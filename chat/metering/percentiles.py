"""The usage dashboard's percentiles: TTFT median and p95, tokens/s median, per model, from the usage rows.

The sums of the dashboard come from daily summaries; percentiles do not add up, so they are
taken from the rows of the period (chat.metering.dashboard.usage_rows), by the database: PostgreSQL's
percentile_cont, and the same interpolation from rows ranked by a window function on SQLite.
"""

from __future__ import annotations

import math

from django.db import connection
from django.db.models import Aggregate, BooleanField, Count, F, FloatField, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import RowNumber

from chat.metering import summary_triggers


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont: the value at a fraction of the ordered values, interpolated."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, fraction: float, **extra) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


PERCENTILES = {"ttft_p50": ("ttft_ms", 0.5), "ttft_p95": ("ttft_ms", 0.95), "tps_p50": ("tokens_per_second", 0.5)}
# Exact percentiles sort all of a model's values in the period: 80,000 a month for a busy team,
# too slow on SQLite for a page load. A model with many values has its percentiles taken from a fixed
# sample instead: the rows whose id is a multiple of 4, or of 16 (ids follow time, not speed, so
# the sample is spread evenly over the period), each held by a partial index (chat/metering/summary_triggers.py);
# the sparser one that still leaves MIN_SAMPLE values. With n >= 1,000 values, the rank of the
# value shown is within 2 sqrt(p (1 - p) / n) of the wanted one 95 % of the time: the p95 shown
# is the rows' p93.6 to p96.4 or better, the median their p46.8 to p53.2 or better.
MIN_SAMPLE = 1_000


def sample_rate(values: int) -> int:
    """1 (every row) for a model with few values; else the sparsest sample keeping MIN_SAMPLE of them."""
    return next((rate for rate in summary_triggers.SAMPLE_RATES if values // rate >= MIN_SAMPLE), 1)


def sampled(rate: int) -> RawSQL:
    """The condition of a sample, written as its partial index has it, so both databases use the index."""
    return RawSQL(f'"chat_usage"."id" %% {rate} = 0', (), output_field=BooleanField())


def percentiles(rows, counts: dict[str, dict[str, int]]) -> dict[str, dict[str, float | None]]:
    """TTFT median and p95 and tokens/s median per model; counts[model][column] = its non-null values.

    Exact (as percentile_cont) for models with few values, else over a sample (sample_rate).
    """
    by_rate: dict[int, list[str]] = {}
    for model, columns in counts.items():
        by_rate.setdefault(sample_rate(max(columns.values())), []).append(model)
    found = {}
    for rate, models in by_rate.items():
        chosen = rows.filter(model__in=models) if len(by_rate) > 1 else rows
        if rate == 1:
            found |= percentiles_of(chosen, {model: counts[model] for model in models})
            continue
        sample = chosen.filter(sampled(rate))
        sizes = sample.values("model").annotate(timed=Count("ttft_ms"), speeds=Count("tokens_per_second"))
        found |= percentiles_of(
            sample, {row["model"]: {"ttft_ms": row["timed"], "tokens_per_second": row["speeds"]} for row in sizes}
        )
    return found


def percentiles_of(rows, counts: dict[str, dict[str, int]]) -> dict[str, dict[str, float | None]]:
    """PostgreSQL: percentile_cont. SQLite has none: percentiles_by_rank."""
    if connection.vendor == "postgresql":
        found = rows.values("model").annotate(
            **{name: Percentile(column, fraction) for name, (column, fraction) in PERCENTILES.items()}
        )
        return {row.pop("model"): row for row in found}
    return percentiles_by_rank(rows, counts)


def percentiles_by_rank(rows, counts: dict[str, dict[str, int]]) -> dict[str, dict[str, float | None]]:
    """percentile_cont for databases without it (SQLite), from the rows ranked by a window function.

    One query per column numbers the period's rows per model in order (ROW_NUMBER() OVER
    (PARTITION BY model ORDER BY column)) and returns only the one or two rows either side of
    each wanted position, which are interpolated as PostgreSQL does, so both give the same
    figure. The covering index led by `started` feeds it the period's rows without the table
    (a sample's rows come from its partial index).
    """
    found: dict[str, dict[str, float | None]] = {model: dict.fromkeys(PERCENTILES) for model in counts}
    for column in ("ttft_ms", "tokens_per_second"):
        wanted: list[tuple[str, str, int, float]] = []  # model, figure, row number below, weight of the next
        for model, columns in counts.items():
            for name, (of, fraction) in PERCENTILES.items():
                if of == column and columns[column]:
                    position = fraction * (columns[column] - 1)
                    wanted.append((model, name, math.floor(position) + 1, position - math.floor(position)))
        if not wanted:
            continue
        numbers = sorted({n for *_, below, _ in wanted for n in (below, below + 1)})
        ranked = (
            rows.filter(**{f"{column}__isnull": False})
            .annotate(number=Window(RowNumber(), partition_by=[F("model")], order_by=F(column).asc()))
            .filter(number__in=numbers)
            .values_list("model", "number", column)
        )
        values = {(model, number): float(value) for model, number, value in ranked}
        for model, name, below, weight in wanted:
            low, high = values[(model, below)], values.get((model, below + 1))
            found[model][name] = low if high is None or not weight else low + (high - low) * weight
    return found
