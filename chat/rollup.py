"""The triggers that keep the daily summaries (chat/models/rollups.py) equal to the usage rows.

Triggers rather than code at each write: usage rows are created, settled, swept by the orphan
sweep, priced later and deleted with their user from several places, and bulk_create() and
QuerySet.update() send no signals. A trigger sees every one of them, in the same transaction,
at the cost of two small upserts per row written (a stream writes its row twice: at its start
and at its end; never per token). The same statements serve SQLite and PostgreSQL; only the
calendar day of `started` is written per database.

The day is taken in TIME_ZONE as it was when the triggers were installed (the migration, or
`manage.py rollup`), and the triggers carry that zone in their text: while TIME_ZONE says
otherwise, the dashboard reads the rows (installed_zone()), until `manage.py rollup` rebuilds.
"""

from __future__ import annotations

import re
import zoneinfo

from django.conf import settings
from django.db import connection as default_connection
from django.db import transaction

USAGE = "chat_usage"
TRIGGER = "chat_usage_rollup"
ZONE_MARK = re.compile(r"TIME_ZONE=(\S+) ")
ENDINGS = ("stopped", "interrupted", "failed")


def _sums(row: str) -> dict[str, str]:
    """What one usage row (NEW or OLD; '' for the table itself) adds to either summary."""
    return {
        "requests": "1",
        "prompt_tokens": f"{row}prompt_tokens",
        "completion_tokens": f"{row}completion_tokens",
        "reasoning_tokens": f"{row}reasoning_tokens",
        "cost": f"COALESCE({row}cost, 0)",
    }


def _model_sums(row: str) -> dict[str, str]:
    return {
        **_sums(row),
        "timed": f"CASE WHEN {row}ttft_ms IS NULL THEN 0 ELSE 1 END",
        "speeds": f"CASE WHEN {row}tokens_per_second IS NULL THEN 0 ELSE 1 END",
        **{status: f"CASE WHEN {row}status = '{status}' THEN 1 ELSE 0 END" for status in ENDINGS},
    }


# Each summary: its table, its key (column: what of the row) and its sums.
SUMMARIES = [
    ("chat_usageday", lambda row: {"model": f"{row}model", "source": f"{row}source"}, _model_sums),
    ("chat_personday", lambda row: {"user_id": f"{row}user_id", "source": f"{row}source"}, _sums),
]
# An update of any other column (the error text, the upstream's ids, ...) leaves the sums alone.
WATCHED = ["started", "user_id", "model", "source", "status", "prompt_tokens", "completion_tokens"]
WATCHED += ["reasoning_tokens", "cost", "ttft_ms", "tokens_per_second"]


def zone() -> str:
    """settings.TIME_ZONE, checked to be a zone name (it is written into SQL)."""
    zoneinfo.ZoneInfo(settings.TIME_ZONE)
    if not re.fullmatch(r"[A-Za-z0-9_+\-/]+", settings.TIME_ZONE):
        raise ValueError(f"unexpected TIME_ZONE {settings.TIME_ZONE!r}")
    return settings.TIME_ZONE


def day_of(row: str, vendor: str) -> str:
    """SQL for the calendar day in TIME_ZONE of a row's `started`, as chat.dashboard.LocalDate has it."""
    if vendor == "postgresql":
        return f"({row}started AT TIME ZONE '{zone()}')::date"
    # SQLite's 'localtime' follows the TZ variable, which Django sets from TIME_ZONE (see LocalDate).
    return f"date({row}started)" if zone() == "UTC" else f"date({row}started, 'localtime')"


def add(row: str, vendor: str) -> list[str]:
    """Upserts adding a row's figures to each summary."""
    statements = []
    for table, key, sums in SUMMARIES:
        columns = {"day": day_of(row, vendor), **key(row), **sums(row)}
        updates = ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in sums(row))
        statements.append(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(columns.values())}) "
            f"ON CONFLICT (day, {', '.join(key(row))}) DO UPDATE SET {updates}"
        )
    return statements


def take_off(row: str, vendor: str) -> list[str]:
    """Updates taking a row's figures off each summary (an UPDATE: a summary row deleted with its user stays so)."""
    statements = []
    for table, key, sums in SUMMARIES:
        updates = ", ".join(f"{name} = {name} - ({value})" for name, value in sums(row).items())
        where = " AND ".join(f"{name} = {value}" for name, value in {"day": day_of(row, vendor), **key(row)}.items())
        statements.append(f"UPDATE {table} SET {updates} WHERE {where}")
    return statements


def trigger_sql(vendor: str) -> list[str]:
    """The statements that (re)create the triggers on this database."""
    mark = f"/* TIME_ZONE={zone()} */"
    watched = ", ".join(WATCHED)
    if vendor == "postgresql":
        body = "\n".join(
            [
                f"BEGIN {mark}",
                "IF TG_OP IN ('UPDATE', 'DELETE') THEN",
                *(f"  {sql};" for sql in take_off("OLD.", vendor)),
                "END IF;",
                "IF TG_OP IN ('INSERT', 'UPDATE') THEN",
                *(f"  {sql};" for sql in add("NEW.", vendor)),
                "END IF;",
                "RETURN NULL;",
                "END",
            ]
        )
        return [
            f"CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$\n{body}\n$$",
            f"DROP TRIGGER IF EXISTS {TRIGGER} ON {USAGE}",
            f"CREATE TRIGGER {TRIGGER} AFTER INSERT OR DELETE OR UPDATE OF {watched} ON {USAGE} "
            f"FOR EACH ROW EXECUTE FUNCTION {TRIGGER}()",
        ]
    events = {
        "insert": ("INSERT", add("NEW.", vendor)),
        "update": (f"UPDATE OF {watched}", take_off("OLD.", vendor) + add("NEW.", vendor)),
        "delete": ("DELETE", take_off("OLD.", vendor)),
    }
    statements = []
    for name, (event, body) in events.items():
        statements.append(f"DROP TRIGGER IF EXISTS {TRIGGER}_{name}")
        steps = "".join(f"{sql}; " for sql in body)
        statements.append(
            f"CREATE TRIGGER {TRIGGER}_{name} AFTER {event} ON {USAGE} FOR EACH ROW BEGIN {mark} {steps}END"
        )
    return statements


def drop_sql(vendor: str) -> list[str]:
    if vendor == "postgresql":
        return [f"DROP TRIGGER IF EXISTS {TRIGGER} ON {USAGE}", f"DROP FUNCTION IF EXISTS {TRIGGER}()"]
    return [f"DROP TRIGGER IF EXISTS {TRIGGER}_{name}" for name in ("insert", "update", "delete")]


def rebuild_sql(vendor: str) -> list[str]:
    """Empty the summaries and fill them again with one GROUP BY over the rows each."""
    statements = []
    for table, key, sums in SUMMARIES:
        keys = {"day": day_of("", vendor), **key("")}
        columns = {**keys, **{name: f"SUM({value})" for name, value in sums("").items()}}
        statements.append(f"DELETE FROM {table}")
        statements.append(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns.values())} FROM {USAGE} "
            f"GROUP BY {', '.join(keys.values())}"
        )
    return statements


def install(connection=default_connection) -> None:
    """(Re)create the triggers for today's TIME_ZONE and rebuild the summaries from the rows, in one transaction."""
    vendor = connection.vendor
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if vendor == "postgresql":
            # Writers wait (readers do not) so that no row is counted twice or missed meanwhile.
            cursor.execute(f"LOCK TABLE {USAGE} IN SHARE ROW EXCLUSIVE MODE")
        for sql in trigger_sql(vendor) + rebuild_sql(vendor):
            cursor.execute(sql)


def uninstall(connection=default_connection) -> None:
    with connection.cursor() as cursor:
        for sql in drop_sql(connection.vendor):
            cursor.execute(sql)


def installed_zone(connection=default_connection) -> str | None:
    """The TIME_ZONE the triggers count days in; None without triggers."""
    if connection.vendor == "postgresql":
        sql, params = "SELECT prosrc FROM pg_proc WHERE proname = %s", [TRIGGER]
    else:
        sql, params = "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = %s", [f"{TRIGGER}_insert"]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchone()
    match = ZONE_MARK.search(found[0]) if found else None
    return match.group(1) if match else None
