"""What the model modules share: the error a request fails with, cutting upstream strings to their
columns, the status of a stream, and the stream's inserts and updates by statements compiled once."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections, models

log = logging.getLogger(__name__)


# The model columns (conversation, message, usage, price): a model id, or provider/model-id.
MODEL_MAX_LENGTH = 300


class ChatError(Exception):
    """A request that cannot start; `code` goes to the client as is."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def fit(model: type[models.Model], field: str, value: str | None) -> str:
    """An upstream-derived string cut to its column (PostgreSQL refuses longer ones)."""
    limit = model._meta.get_field(field).max_length
    value = value or ""
    return value[:limit] if limit is not None else value


class Status(models.TextChoices):
    """How a stream ended (or that it still streams), on messages and usage rows alike."""

    STREAMING = "streaming"
    COMPLETE = "complete"
    STOPPED = "stopped", "stopped by the user"
    INTERRUPTED = "interrupted", "interrupted (connection ended early)"
    FAILED = "failed", "failed (upstream error)"
    # Only on usage rows: a stream refused before anything went upstream (over budget).
    REFUSED = "refused", "refused (over budget)"


# --- a stream's rows, by statements compiled once --------------------------------
#
# A stream's start inserts up to four rows and reads a few; its end updates up to three. The ORM
# builds and compiles each of those statements anew, which costs about as much as running them,
# on every stream (docs/decisions/0002-hand-written-sql.md). insert_row and update_row do what
# create() and update() do for plain values, from SQL made once per model and set of columns; no
# model signals are sent (the models written here have no receivers). rows_of reads rows by SQL of the caller's.

# (model, database alias, columns) -> SQL
_statements: dict[tuple, str] = {}
# (model, database alias) -> the converters of the columns that have any, by column index
_converters: dict[tuple, list[tuple[int, list, Any]]] = {}


_NONE = object()


@functools.cache
def _defaults_of(model: type[models.Model], using: str) -> list[tuple[models.Field, Any, Any]]:
    """(field, its default, the default as the database takes it) for insert_row()'s columns.

    Most of a new row's columns keep their default (a usage row's 28 columns have 9 values
    at its start): preparing those once, not on every insert, saves most of insert_row's work.
    A field whose value is worked out as it is saved (auto_now), or whose default is made
    anew each time (a callable), has _NONE there and is prepared every time.
    """
    meta, connection = model._meta, connections[using]
    found = []
    for field in meta.local_concrete_fields:
        if field is meta.auto_field:
            continue
        if type(field).pre_save is not models.Field.pre_save or (field.has_default() and callable(field.default)):
            found.append((field, None, _NONE))
        else:
            default = field.get_default()
            found.append((field, default, _value(field, default, connection)))
    return found


def _value(field: models.Field, value: Any, connection) -> Any:
    if hasattr(value, "prepare_database_save"):  # a model instance for a foreign key, as the ORM takes it
        value = value.prepare_database_save(field)
    return field.get_db_prep_save(value, connection=connection)


@functools.cache  # read at every stream's start and end: made once, like the statements above
def columns_of(model: type[models.Model], using: str = "default") -> str:
    """The model's columns, in the order rows_of() reads them."""
    quote = connections[using].ops.quote_name
    return ", ".join(quote(field.column) for field in model._meta.concrete_fields)


@dataclass(frozen=True)
class Read:
    """A statement and what to make of its rows, run alone (get()) or with others in one round trip (read_together)."""

    sql: str
    params: list | tuple
    make: Callable[[list[tuple]], Any] = list

    def get(self, using: str = "default") -> Any:
        return read_together([self], using)[0]


def read_together(reads: list[Read], using: str = "default") -> list:
    """What each of `reads` makes of its rows; a statement without rows (a SET, a lock) gives [] to its make.

    On PostgreSQL in one round trip (psycopg's pipeline: every statement sent, then every result
    awaited), since they do not depend on each other: a stream's start reads a few such things, and
    in a busy process each round trip is also a wait for the interpreter's lock and for a core. In an
    atomic block that has sent nothing yet, the transaction's BEGIN goes with them (_begin_sent).
    Each statement still takes its own snapshot after the one before it ends. Elsewhere one after another.
    """
    connection = connections[using]
    if connection.vendor == "postgresql" and _begin_sent(connection):
        return read_together([Read("BEGIN", [], make=lambda rows: None), *reads], using)[1:]
    if connection.vendor != "postgresql" or len(reads) == 1:
        found = []
        with connection.cursor() as cursor:
            for read in reads:
                cursor.execute(read.sql, read.params)
                found.append(cursor.fetchall() if cursor.description is not None else [])
    else:
        connection.ensure_connection()
        # Django's cursors (its error wrapping, its query log) on the pipeline: each execute is only queued, and
        # leaving the pipeline sends them all and takes every result into its cursor (a sync() first would
        # cost a round trip more: leaving always syncs).
        cursors = [connection.cursor() for _ in reads]
        try:
            with connection.wrap_database_errors:
                with connection.connection.pipeline():
                    for cursor, read in zip(cursors, reads, strict=True):
                        cursor.execute(read.sql, read.params)
                found = [cursor.fetchall() if cursor.description is not None else [] for cursor in cursors]
        finally:
            for cursor in cursors:
                cursor.close()
    return [read.make(rows) for read, rows in zip(reads, found, strict=True)]


def side_by_side(statements: list[tuple[str, list, int]], beside: tuple[str, list] | None = None) -> Read:
    """Statements of one row each, with their widths, as one statement; its make gives each one's row.

    `beside`: a statement of any number of rows, joined to that row (its rows follow the others'
    in what make gives, as a list). For a stream's start on PostgreSQL, where every statement costs
    the client and the backend work of its own (parse, bind, describe, execute) beyond what it reads.
    """
    sql = "SELECT * FROM " + " CROSS JOIN ".join(f"({sql}) AS q{n}" for n, (sql, _, _) in enumerate(statements))
    params = [param for _, params, _ in statements for param in params]
    if beside is not None:
        # Each of its rows marked, so that none (the join's one row of NULLs) is told from a row of NULLs.
        sql += f" LEFT JOIN (SELECT 1 AS found, b.* FROM ({beside[0]}) AS b) AS beside ON 1 = 1"
        params += beside[1]

    def split(rows: list[tuple]) -> list:
        at, found = 0, []
        for _, _, width in statements:
            found.append(tuple(rows[0][at : at + width]))
            at += width
        if beside is not None:
            found.append([row[at + 1 :] for row in rows if row[at] is not None])
        return found

    return Read(sql, params, split)


def _begin_sent(connection) -> bool:
    """Whether this atomic block's BEGIN is to be sent by the caller, with its first statements (PostgreSQL).

    psycopg sends a transaction's BEGIN ahead of its first statement and, in a pipeline, waits for
    it: a round trip of its own, on every stream's start. Here, when Django's atomic block has sent
    nothing yet, psycopg is told to leave it (autocommit, as Django's own commit at the block's end
    will set it anyway; its commit and rollback go by the server's transaction state, not by that flag)
    and the caller sends it. Only for the plain BEGIN: an isolation level or read-only setting keeps psycopg's.
    """
    if not connection.in_atomic_block:
        return False
    connection.ensure_connection()
    raw = connection.connection
    if raw.autocommit or raw.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return False
    if raw.read_only is not None or raw.deferrable is not None or raw.isolation_level is not None:
        return False
    raw.autocommit = True
    return True


def rows_of(model: type[models.Model], sql: str, params: list | tuple, using: str = "default") -> list:
    """The model's instances from SQL selecting columns_of(model): a RawQuerySet without its work on every query."""
    return rows_read(model, sql, params, using).get(using)


def rows_read(model: type[models.Model], sql: str, params: list | tuple, using: str = "default") -> Read:
    """rows_of() as a Read, to run with others (read_together)."""
    return Read(sql, params, functools.partial(instances_of, model, using=using))


def instances_of(model: type[models.Model], rows: list[tuple], using: str = "default") -> list:
    """The model's instances from rows of columns_of(model).

    RawQuerySet works out the columns, their order and their converters on every query; these
    are kept per model, since this runs on every stream's start or end.
    """
    connection = connections[using]
    fields = model._meta.concrete_fields
    converters = _converters.get((model, using))
    if converters is None:
        converters = []
        for index, field in enumerate(fields):
            column = field.get_col(model._meta.db_table)
            found = field.get_db_converters(connection) + connection.ops.get_db_converters(column)
            if found:
                converters.append((index, found, column))
        _converters[(model, using)] = converters  # whole: another database thread may read it at once
    names = [field.attname for field in fields]
    instances = []
    for row in rows:
        if converters:
            row = list(row)
            for index, found, column in converters:
                for convert in found:
                    row[index] = convert(row[index], column, connection)
        instances.append(model.from_db(using, names, row))
    return instances


def insert_row(obj: models.Model, using: str = "default") -> models.Model:
    """Write a new row as `obj.save()` would (defaults, auto_now fields, its pk set on it), without signals."""
    connection = connections[using]
    if connection.features.can_return_columns_from_insert:
        return insert_read(obj, using).get(using)
    meta = obj._meta
    sql, values = _insert_statement(obj, using)
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        obj.pk = connection.ops.last_insert_id(cursor, meta.db_table, meta.pk.column)
    obj._state.adding, obj._state.db = False, using
    return obj


def insert_read(obj: models.Model, using: str = "default") -> Read:
    """insert_row() as a Read, to send with others (commit_with); it makes `obj`, its pk set."""

    def inserted(rows: list[tuple]) -> models.Model:
        obj.pk = rows[0][0]
        obj._state.adding, obj._state.db = False, using
        return obj

    return Read(*_insert_statement(obj, using), make=inserted)


def _insert_statement(obj: models.Model, using: str) -> tuple[str, list]:
    """insert_row()'s SQL, made once per model (returning the pk where the database can), and its parameters.

    An `obj` whose pk is set (taken ahead: ids_read) is written with it."""
    meta, connection = obj._meta, connections[using]
    given = obj.pk is not None and meta.auto_field is not None
    key = (type(obj), using, "pk" if given else None)
    sql = _statements.get(key)
    if sql is None:
        fields = [meta.auto_field] if given else []
        fields += [field for field in meta.local_concrete_fields if field is not meta.auto_field]
        quote = connection.ops.quote_name
        sql = (
            f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(field.column) for field in fields)}) "
            f"VALUES ({', '.join(['%s'] * len(fields))})"
        )
        if connection.features.can_return_columns_from_insert:
            sql += " " + connection.ops.return_insert_columns([meta.pk])[0]
        _statements[key] = sql
    values = [meta.auto_field.get_db_prep_save(obj.pk, connection)] if given else []
    for field, default, prepared in _defaults_of(type(obj), using):
        if prepared is _NONE:
            values.append(_value(field, field.pre_save(obj, True), connection))
            continue
        value = getattr(obj, field.attname)
        same = type(value) is type(default) and value == default
        values.append(prepared if same else _value(field, value, connection))
    return sql, values


def ids_read(*kinds: type[models.Model], count: int = 1, using: str = "default") -> Read | None:
    """`count` sets of new ids for rows of `kinds` (a model per row), taken ahead from their sequences, each
    set's ids greater than the set's before; None elsewhere than PostgreSQL.

    A row's insert that waits for the id of the one before (a message for its conversation's)
    can then go in the same round trip (read_together); its make gives the sets, as tuples, or none at all
    when a table has no sequence (nextval() of NULL: the rows are then inserted as any other). Django makes
    identity columns, whose sequence cannot be disowned; a table made otherwise may have none.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return None
    quote = connection.ops.quote_name
    taken = ", ".join(["nextval(pg_get_serial_sequence(%s, %s))"] * len(kinds))
    params = [value for kind in kinds for value in (quote(kind._meta.db_table), kind._meta.pk.column)]
    # Row by row, in order: generate_series's rows come in order, and nextval() is evaluated for each.
    sql = f"SELECT {taken} FROM generate_series(1, %s)"
    return Read(sql, [*params, count], make=lambda rows: [tuple(row) for row in rows if None not in row])


def commit_with(reads: list[Read], using: str = "default") -> list:
    """The transaction's last statements, sent with its COMMIT: in one round trip on PostgreSQL; what each makes.

    For the end of an outermost `transaction.atomic()` block (Django's own commit at its end then
    finds nothing to commit): a stream's start holds the person's row locked until its commit
    (chat/metering/metered_streams.py), and its usage row's insert and the commit in one round trip
    shorten that by one. A statement run after it in the block runs in a transaction of its own. In
    a nested block, or outside one, the reads run as read_together() runs them and the block commits.
    """
    connection = connections[using]
    if not (connection.in_atomic_block and len(connection.atomic_blocks) == 1 and not connection.needs_rollback):
        return read_together(reads, using)
    return read_together([*reads, Read("COMMIT", [], make=lambda rows: None)], using)[:-1]


def update_row(
    model: type[models.Model], pk: Any, values: dict[str, Any], using: str = "default", *, where: dict | None = None
) -> int:
    """`model.objects.filter(pk=pk, **where).update(**values)`; an expression goes to the ORM. Rows changed."""
    where = where or {}
    if any(hasattr(value, "resolve_expression") for value in [*values.values(), *where.values()]):
        return model._base_manager.using(using).filter(pk=pk, **where).update(**values)
    with connections[using].cursor() as cursor:
        cursor.execute(*_update_statement(model, pk, values, where, using))
        return cursor.rowcount


def update_read(model: type[models.Model], pk: Any, values: dict[str, Any], using: str = "default") -> Read:
    """update_row() of plain values as a Read, to send with others (read_together); it tells no row count."""
    return Read(*_update_statement(model, pk, values, {}, using), make=lambda rows: None)


def _update_statement(model: type[models.Model], pk: Any, values: dict[str, Any], where: dict, using: str) -> tuple:
    """update_row()'s SQL, made once per model and set of columns, and its parameters."""
    meta, connection = model._meta, connections[using]
    fields = [meta.get_field(name) for name in values]
    conditions = [meta.pk, *(meta.get_field(name) for name in where)]
    key = (model, using, tuple(values), tuple(where))
    sql = _statements.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        sql = _statements[key] = (
            f"UPDATE {quote(meta.db_table)} SET {', '.join(f'{quote(field.column)} = %s' for field in fields)} "
            f"WHERE {' AND '.join(f'{quote(field.column)} = %s' for field in conditions)}"
        )
    params = [_value(field, value, connection) for field, value in zip(fields, values.values(), strict=True)]
    matched = [pk, *where.values()]
    keys = [field.get_db_prep_value(value, connection) for field, value in zip(conditions, matched, strict=True)]
    return sql, [*params, *keys]
