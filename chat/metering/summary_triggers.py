"""The triggers that keep the daily summaries (chat/models/rollups.py) equal to the usage rows.

Triggers rather than code at each write: usage rows are created, settled, swept by the orphan
sweep, priced later and deleted with their user from several places, and bulk_create() and
QuerySet.update() send no signals. A trigger sees every one of them, in the same transaction,
at the cost of four small upserts for a new row, four updates for a changed one whose day and
keys stay (a stream's end), and four updates and four upserts for one that moves (a stream
writes its row twice: at its start and at its end; never per token). The same statements
serve SQLite and PostgreSQL; only the calendar day of `started` is written per database.

The day is taken in TIME_ZONE as it was when the triggers were installed (the migration, or
`manage.py rollup`), and the triggers carry that zone in their text: while TIME_ZONE says
otherwise, the dashboard reads the rows (installed_zone()), until `manage.py rollup` rebuilds.
"""

from __future__ import annotations

import re
import zoneinfo
from decimal import Decimal

from django.conf import settings
from django.db import connection as default_connection
from django.db import connections, transaction

from chat.models.rollups import USAGE_DAY_SHARDS

USAGE = "chat_usage"
TRIGGER = "chat_usage_rollup"
# The rows whose id is a multiple of these are the samples of the dashboard's percentiles over
# big periods (chat.metering.percentiles), each held by a partial index. Made here with the
# triggers: Django's Index(condition=...) cannot say "id % 4 = 0" in a way SQLite indexes.
SAMPLE_RATES = (16, 4)
SAMPLE_INDEXES = {
    f"usage_sample_{rate}": f"CREATE INDEX IF NOT EXISTS usage_sample_{rate} ON {USAGE} "
    f"(started, model, ttft_ms, tokens_per_second) WHERE id % {rate} = 0"
    for rate in SAMPLE_RATES
}
ZONE_MARK = re.compile(r"TIME_ZONE=(\S+) ")
ENDINGS = ("stopped", "interrupted", "failed")
CENT_FRACTIONS = Decimal("0.00000001")  # the cost columns' 8 places


def _sums(row: str) -> dict[str, str]:
    """What one usage row (NEW or OLD; '' for the table itself) adds to every summary."""
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


def _budget_sums(row: str) -> dict[str, str]:
    # What a monthly budget counts (chat.metering.budgets.spent): the finished rows' cost and total tokens.
    finished = f"{row}status <> 'streaming'"
    return {
        "budget_cost": f"CASE WHEN {finished} THEN COALESCE({row}cost, 0) ELSE 0 END",
        "budget_tokens": f"CASE WHEN {finished} THEN COALESCE({row}total_tokens, 0) ELSE 0 END",
    }


def _person_month_sums(row: str) -> dict[str, str]:
    return {**_sums(row), **_budget_sums(row)}


def _token_month_sums(row: str) -> dict[str, str]:
    return {"requests": "1", **_budget_sums(row)}


def _by_model(row: str) -> dict[str, str]:
    # The shard: the row's start and end write the same one, starts at the same moment (consecutive ids) others.
    return {"model": f"{row}model", "source": f"{row}source", "shard": f"{row}id % {USAGE_DAY_SHARDS}"}


def _by_person(row: str) -> dict[str, str]:
    return {"user_id": f"{row}user_id", "source": f"{row}source"}


def _by_token(row: str) -> dict[str, str]:
    return {"token_id": f"{row}token_id"}


# Each summary: its table, whether its `day` is the first of a month, its key besides the day, its sums.
# A row with an empty key (no API token) is in no summary of that key.
SUMMARIES = [
    ("chat_usageday", False, _by_model, _model_sums),
    ("chat_personday", False, _by_person, _sums),
    ("chat_personmonth", True, _by_person, _person_month_sums),
    ("chat_tokenmonth", True, _by_token, _token_month_sums),
]
# An update of any other column (the error text, the upstream's ids, ...) leaves the sums alone.
WATCHED = ["started", "user_id", "token_id", "model", "source", "status", "prompt_tokens", "completion_tokens"]
WATCHED += ["reasoning_tokens", "total_tokens", "cost", "ttft_ms", "tokens_per_second"]
# While these stay, an update changes only the sums of the summary rows the row is already in.
STAYING = ["started", "user_id", "token_id", "model", "source"]


def zone() -> str:
    """settings.TIME_ZONE, checked to be a zone name (it is written into SQL)."""
    zoneinfo.ZoneInfo(settings.TIME_ZONE)
    if not re.fullmatch(r"[A-Za-z0-9_+\-/]+", settings.TIME_ZONE):
        raise ValueError(f"unexpected TIME_ZONE {settings.TIME_ZONE!r}")
    return settings.TIME_ZONE


def zone_mark() -> str:
    """The comment in the triggers' text that says which TIME_ZONE their days are in."""
    return f"/* TIME_ZONE={zone()} */"


def day_of(row: str, vendor: str, monthly: bool = False) -> str:
    """SQL for the day in TIME_ZONE of a row's `started` (as dashboard.LocalDate has it), or its month's first."""
    if vendor == "postgresql":
        local = f"{row}started AT TIME ZONE '{zone()}'"
        return f"date_trunc('month', {local})::date" if monthly else f"({local})::date"
    # SQLite's 'localtime' follows the TZ variable, which Django sets from TIME_ZONE (see LocalDate).
    modifiers = ("" if zone() == "UTC" else ", 'localtime'") + (", 'start of month'" if monthly else "")
    return f"date({row}started{modifiers})"


def add(row: str, vendor: str, summaries: list[tuple]) -> list[str]:
    """Upserts adding a row's figures to each summary."""
    statements = []
    for table, monthly, key, sums in summaries:
        columns = {"day": day_of(row, vendor, monthly), **key(row), **sums(row)}
        updates = ", ".join(f"{name} = {table}.{name} + excluded.{name}" for name in sums(row))
        # INSERT ... SELECT ... WHERE: the WHERE also keeps SQLite's parser from reading ON CONFLICT as a join's ON.
        statements.append(
            f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns.values())} "
            f"WHERE {keyed(key(row))} ON CONFLICT (day, {', '.join(key(row))}) DO UPDATE SET {updates}"
        )
    return statements


def keyed(key: dict[str, str]) -> str:
    """SQL: the row has every column of a summary's key (an UPDATE's `token_id = NULL` matches nothing anyway)."""
    return " AND ".join(f"{value} IS NOT NULL" for value in key.values())


def take_off(row: str, vendor: str, summaries: list[tuple]) -> list[str]:
    """Updates taking a row's figures off each summary (an UPDATE: a summary row deleted with its user stays so)."""
    statements = []
    for table, monthly, key, sums in summaries:
        updates = ", ".join(f"{name} = {name} - ({value})" for name, value in sums(row).items())
        keys = {"day": day_of(row, vendor, monthly), **key(row)}
        where = " AND ".join(f"{name} = {value}" for name, value in keys.items())
        statements.append(f"UPDATE {table} SET {updates} WHERE {where}")
    return statements


def shift(vendor: str, summaries: list[tuple]) -> list[str]:
    """Updates adding a changed row's difference to each summary, for a row whose day and keys stay (the end
    of a stream): one update a summary instead of a take-off and an add."""
    statements = []
    for table, monthly, key, sums in summaries:
        old, new = sums("OLD."), sums("NEW.")
        updates = ", ".join(
            f"{name} = {name} + ({new[name]}) - ({old[name]})" for name in new if new[name] != old[name]
        )
        keys = {"day": day_of("NEW.", vendor, monthly), **key("NEW.")}
        where = " AND ".join(f"{name} = {value}" for name, value in keys.items())
        statements.append(f"UPDATE {table} SET {updates} WHERE {where}")
    return statements


def in_place(vendor: str) -> str:
    """SQL: an update left the row's day and every summary key as they were."""
    same = "IS NOT DISTINCT FROM" if vendor == "postgresql" else "IS"
    return " AND ".join(f"OLD.{column} {same} NEW.{column}" for column in STAYING)


def trigger_sql(vendor: str, summaries: list[tuple]) -> list[str]:
    """The statements that (re)create the triggers on this database, for these summaries (see existing())."""
    mark = zone_mark()
    watched = ", ".join(WATCHED)
    if vendor == "postgresql":
        body = "\n".join(
            [
                f"BEGIN {mark}",
                f"IF TG_OP = 'UPDATE' AND {in_place(vendor)} THEN",
                *(f"  {sql};" for sql in shift(vendor, summaries)),
                "  RETURN NULL;",
                "END IF;",
                "IF TG_OP IN ('UPDATE', 'DELETE') THEN",
                *(f"  {sql};" for sql in take_off("OLD.", vendor, summaries)),
                "END IF;",
                "IF TG_OP IN ('INSERT', 'UPDATE') THEN",
                *(f"  {sql};" for sql in add("NEW.", vendor, summaries)),
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
    update = f"UPDATE OF {watched}"
    events = {
        "insert": ("INSERT", "", add("NEW.", vendor, summaries)),
        "update_in_place": (update, f"WHEN {in_place(vendor)} ", shift(vendor, summaries)),
        "update": (
            update,
            f"WHEN NOT ({in_place(vendor)}) ",
            take_off("OLD.", vendor, summaries) + add("NEW.", vendor, summaries),
        ),
        "delete": ("DELETE", "", take_off("OLD.", vendor, summaries)),
    }
    statements = []
    for name, (event, when, body) in events.items():
        statements.append(f"DROP TRIGGER IF EXISTS {TRIGGER}_{name}")
        steps = "".join(f"{sql}; " for sql in body)
        statements.append(
            f"CREATE TRIGGER {TRIGGER}_{name} AFTER {event} ON {USAGE} FOR EACH ROW {when}BEGIN {mark} {steps}END"
        )
    return statements


def drop_sql(vendor: str) -> list[str]:
    if vendor == "postgresql":
        return [f"DROP TRIGGER IF EXISTS {TRIGGER} ON {USAGE}", f"DROP FUNCTION IF EXISTS {TRIGGER}()"]
    return [f"DROP TRIGGER IF EXISTS {TRIGGER}_{name}" for name in ("insert", "update_in_place", "update", "delete")]


def grouped_sql(vendor: str, monthly: bool, key, sums) -> tuple[list[str], str]:
    """A summary's columns, and the SELECT computing them from the rows with a GROUP BY."""
    keys = {"day": day_of("", vendor, monthly), **key("")}
    columns = {**keys, **{name: f"SUM({value})" for name, value in sums("").items()}}
    select = (
        f"SELECT {', '.join(columns.values())} FROM {USAGE} WHERE {keyed(key(''))} GROUP BY {', '.join(keys.values())}"
    )
    return list(columns), select


def rebuild_sql(vendor: str, summaries: list[tuple]) -> list[str]:
    """Empty the summaries and fill them again with one GROUP BY over the rows each."""
    statements = []
    for table, monthly, key, sums in summaries:
        columns, select = grouped_sql(vendor, monthly, key, sums)
        statements += [f"DELETE FROM {table}", f"INSERT INTO {table} ({', '.join(columns)}) {select}"]
    return statements


def install(connection=default_connection) -> None:
    """(Re)make the triggers for today's TIME_ZONE, refill the summaries from the rows, make the samples' indexes."""
    vendor = connection.vendor
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if vendor == "postgresql":
            # Writers wait (readers do not) so that no row is counted twice or missed meanwhile.
            cursor.execute(f"LOCK TABLE {USAGE} IN SHARE ROW EXCLUSIVE MODE")
        summaries = existing(connection, cursor)
        for sql in [*trigger_sql(vendor, summaries), *rebuild_sql(vendor, summaries), *SAMPLE_INDEXES.values()]:
            cursor.execute(sql)


def existing(connection, cursor) -> list[tuple]:
    """SUMMARIES with only the columns their tables have: a migration older than a column installs without it."""
    found = []
    tables = connection.introspection.table_names(cursor)
    for table, monthly, key, sums in SUMMARIES:
        if table not in tables:
            continue
        columns = {column.name for column in connection.introspection.get_table_description(cursor, table)}

        def present(row: str, sums=sums, columns=columns) -> dict[str, str]:
            return {name: value for name, value in sums(row).items() if name in columns}

        def present_key(row: str, key=key, columns=columns) -> dict[str, str]:
            return {name: value for name, value in key(row).items() if name in columns}

        found.append((table, monthly, present_key, present))
    return found


def uninstall(connection=default_connection) -> None:
    with connection.cursor() as cursor:
        for sql in [*drop_sql(connection.vendor), *(f"DROP INDEX IF EXISTS {name}" for name in SAMPLE_INDEXES)]:
            cursor.execute(sql)


def install_if_missing(sender, using: str, **kwargs) -> None:
    """After `migrate` (post_migrate): make the triggers again if a migration dropped them with the table.

    SQLite alters a table by copying it to a new one, which leaves its triggers and the samples'
    indexes behind; until they are back the dashboard reads the rows.
    """
    connection = connections[using]
    tables = connection.introspection.table_names()
    if USAGE in tables and "chat_usageday" in tables and installed_zone(connection) is None:
        install(connection)


def _trigger_text(vendor: str) -> tuple[str, str, str, str]:
    """Where the database keeps our (first) trigger's text: the table, the text's column, the key and its value."""
    if vendor == "postgresql":
        return "pg_proc", "prosrc", "proname", TRIGGER
    return "sqlite_master", "sql", "type = 'trigger' AND name", f"{TRIGGER}_insert"


def installed_zone(connection=default_connection) -> str | None:
    """The TIME_ZONE the triggers count days in; None without triggers."""
    table, text, key, name = _trigger_text(connection.vendor)
    sql, params = f"SELECT {text} FROM {table} WHERE {key} = %s", [name]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchone()
    match = ZONE_MARK.search(found[0]) if found else None
    return match.group(1) if match else None


def current_sql(vendor: str) -> tuple[str, list[str]]:
    """A scalar subquery, 1 while the summaries count days in today's TIME_ZONE (else NULL), and its parameters.

    For readers of the summaries on the hot path (chat.metering.budgets): read in the same statement as
    the sums, it costs no round trip of its own.
    """
    table, text, key, name = _trigger_text(vendor)
    find = "strpos" if vendor == "postgresql" else "instr"
    return f"(SELECT 1 FROM {table} WHERE {key} = %s AND {find}({text}, %s) > 0 LIMIT 1)", [name, zone_mark()]


def mismatches(connection=default_connection) -> list[str]:
    """Where the summaries differ from a GROUP BY over the rows (`manage.py rollup --check`, the tests)."""

    def by_key(rows, width: int) -> dict[tuple, tuple]:
        # SQLite gives days as text and decimal sums as floats: both compared as text.
        def number(value) -> str:
            return f"{Decimal(str(value)).quantize(CENT_FRACTIONS).normalize():f}"

        return {(str(row[0]), *row[1:width]): tuple(number(v) for v in row[width:]) for row in rows}

    found = []
    with connection.cursor() as cursor:
        for table, monthly, key, sums in SUMMARIES:
            columns, select = grouped_sql(connection.vendor, monthly, key, sums)
            width = 1 + len(key(""))
            cursor.execute(select)
            expected = by_key(cursor.fetchall(), width)
            # A summary row whose rows were all deleted stays behind, all zero.
            nonzero = " OR ".join(f"{name} <> 0" for name in columns[width:])
            cursor.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE {nonzero}")
            actual = by_key(cursor.fetchall(), width)
            for where in sorted(expected.keys() | actual.keys()):
                if expected.get(where) != actual.get(where):
                    found.append(
                        f"{table} {where}: the rows say {expected.get(where)}, the summary {actual.get(where)}"
                    )
    return found
