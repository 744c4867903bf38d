"""Reads sent together (chat/models/base.py's read_together): each statement's rows made as asked, and on
PostgreSQL in one round trip, which every stream start's reads (the /v1 caller, a turn's inputs, the lock) use."""

import asyncio
import tempfile

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from psycopg import pq

from chat.actions.turns import begin_turn, turn_inputs
from chat.auth.api_tokens import caller
from chat.metering import limits, metered_streams
from chat.models import ApiToken, ChatDefaults, Conversation, Message, Provider, Usage
from chat.models.base import Read, read_together
from chat.runtime import kept_reads
from chat.streaming.catalog import CatalogEntry
from chat.streaming.generation import Generation
from tests.services import check_on_postgresql


def round_trips(work) -> tuple[object, int]:
    """What `work()` returns, and how many round trips it made to PostgreSQL (libpq's trace: a Sync, or a Query,
    is where the client stops and waits for the server); on SQLite, (result, None)."""
    result, batches = sent_batches(work)
    return result, None if batches is None else len(batches)


def sent_batches(work) -> tuple[object, list[list[str]] | None]:
    """What `work()` returns, and the statements it sent to PostgreSQL, in the batches each round trip sent."""
    if connection.vendor != "postgresql":
        return work(), None
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            result = work()
        finally:
            pgconn.untrace()
        trace.seek(0)
        batches, batch = [], []
        for line in trace:
            if not line.startswith("F\t"):
                continue
            fields = line.rstrip("\n").split("\t")
            message = fields[2]
            if message in ("Parse", "Query"):
                batch.append(fields[3].strip())
            if message in ("Sync", "Query"):
                batches.append(batch)
                batch = []
    return result, batches


def check_reads() -> None:
    user = get_user_model().objects.create_user("dora")
    ChatDefaults.objects.create(user=user, model="m", system_prompt="be brief")
    Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    _, secret = ApiToken.issue(user, "tests")

    found, trips = round_trips(
        lambda: read_together(
            [
                Read("SELECT 1, %s", ["a"]),
                Read("SELECT COUNT(*) FROM auth_user WHERE username = %s", ["dora"], make=lambda rows: rows[0][0]),
                Read("SELECT 1 WHERE 1 = 0", []),  # no rows at all: its make gets []
            ]
        )
    )
    assert found == [[(1, "a")], 1, []]
    assert trips in (None, 1)

    # In a transaction, a statement without rows among them; the transaction's BEGIN goes with them.
    with transaction.atomic():
        found, batches = sent_batches(
            lambda: read_together([Read("UPDATE auth_user SET last_name = '' WHERE 1 = 0", []), Read("SELECT 2", [])])
        )
    assert found == [[], [(2,)]]
    assert batches is None or (len(batches) == 1 and batches[0][0] == '"" "BEGIN" 0'), batches

    # A /v1 start's caller: the person's access and the enabled providers (the token from the process's cache),
    # in one round trip; then kept by the process (chat/runtime/kept_reads.py): none.
    caller(secret)
    kept_reads.forget()
    (token, access, providers), trips = round_trips(lambda: caller(secret))
    assert token.user == user and not access.everything and [p.name for p in providers] == ["p"]
    assert trips in (None, 1)
    with CaptureQueriesContext(connection) as sent:
        assert caller(secret)[2] == providers
    assert len(sent) == 0, sent.captured_queries
    kept_reads.forget()

    # A new chat's inputs: the person's defaults, their access, the providers, and on PostgreSQL three new ids
    # (a block of them: chat/runtime/id_blocks.py); then all kept, and the next ids from the block: nothing sent.
    (stored, defaults, access, providers, ids), trips = round_trips(lambda: turn_inputs(user, None))
    assert stored is None and defaults.system_prompt == "be brief" and [p.name for p in providers] == ["p"]
    assert trips in (None, 1)
    assert (ids is None) == (connection.vendor != "postgresql") and (ids is None or ids[1] != ids[2]), ids
    with CaptureQueriesContext(connection) as sent:
        again = turn_inputs(user, None)
    assert again[1].system_prompt == "be brief" and len(sent) == 0, sent.captured_queries
    if ids is not None:  # new ones, each greater than the set before it
        assert all(new > old for new, old in zip(again[4], ids, strict=True)) and again[4][1] != again[4][2]
    kept_reads.forget()


@pytest.mark.django_db(transaction=True)
def test_reads_together_make_each_statements_rows():
    check_reads()


def test_on_postgresql_reads_together_are_one_round_trip():
    check_on_postgresql("chat_reads", "tests.models.test_reads", "check_reads")


def test_the_trace_counts_each_statement_alone_as_a_round_trip():
    """The counter itself: two statements run one after another are two round trips."""
    check_on_postgresql("chat_reads_apart", "tests.models.test_reads", "check_apart")


def check_turn() -> None:
    """A new chat's turn is two round trips: BEGIN with the person's lock and the start's reads, then its rows
    (their ids taken ahead, with its inputs) and its usage row with the COMMIT; its tools are read after.
    Without the ids, one insert after another, the first with the BEGIN."""
    user = get_user_model().objects.create_user("fran")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    ids = turn_inputs(user, None)[4]
    turn, batches = sent_batches(
        lambda: begin_turn(
            user, CatalogEntry(provider, "m"), {"temperature": 0.5}, content="hello", system_prompt="be brief", ids=ids
        )
    )
    assert len(batches) == 2, batches
    assert batches[0][0] == '"" "BEGIN" 0' and any("FOR NO KEY UPDATE" in text for text in batches[0]), batches
    inserted = [text.split('"')[4] for text in batches[1] if text.startswith('"" "INSERT INTO')]
    assert inserted == ["chat_conversation", "chat_message", "chat_message", "chat_usage"], batches[1]
    assert not any(text.startswith('"" "UPDATE') for text in batches[1]), batches  # the insert has it all
    assert batches[1][-1] == '"" "COMMIT" 0', batches
    assert (turn.conversation.pk, turn.user_message.pk, turn.reply.pk) == ids
    stored = Conversation.objects.get(pk=ids[0])
    assert stored.model == "p/m" and stored.system_prompt == "be brief" and stored.params == {"temperature": 0.5}
    assert stored.current_id == ids[2] and list(stored.messages.order_by("pk").values_list("pk", "parent_id")) == [
        (ids[1], None), (ids[2], ids[1])
    ]  # fmt: skip
    assert Usage.objects.get(message_id=ids[2]).status == "streaming"

    _, batches = sent_batches(lambda: begin_turn(user, CatalogEntry(provider, "m"), {}, content="again"))
    assert batches[0][0] == '"" "BEGIN" 0' and batches[0][1].startswith('"" "INSERT INTO "chat_conversation"')
    assert len(batches) == 5, batches


def test_on_postgresql_a_turn_saves_its_conversation_with_the_lock():
    check_on_postgresql("chat_reads_turn", "tests.models.test_reads", "check_turn")


def check_final_save() -> None:
    """A chat answer's final save is two round trips: the price read, then the message, the usage row and the
    conversation with the BEGIN and the COMMIT."""
    user = get_user_model().objects.create_user("hal")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    turn = begin_turn(user, CatalogEntry(provider, "m"), {}, content="hello")

    async def answered() -> tuple[Generation, dict]:
        answer = Generation(turn.job(provider, "m", turn.conversation.params))
        answer.state.content.append("Hi.")
        return answer, answer.state.metering(5, asyncio.get_running_loop().time())

    answer, usage = asyncio.run(answered())
    _, batches = sent_batches(lambda: answer._save_final("complete", "", usage))
    assert len(batches) == 2 and '"chat_price"' in batches[0][0], batches
    assert batches[1][0] == '"" "BEGIN" 0' and batches[1][-1] == '"" "COMMIT" 0', batches
    updated = [text.split('"')[4] for text in batches[1] if text.startswith('"" "UPDATE')]
    assert updated == ["chat_message", "chat_usage", "chat_conversation"], batches
    assert Message.objects.filter(pk=turn.reply.pk, status="complete", content="Hi.").exists()
    assert Usage.objects.get(pk=turn.usage.pk).status == "complete"
    assert connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE


def test_on_postgresql_a_final_save_writes_in_one_round_trip():
    check_on_postgresql("chat_reads_final", "tests.models.test_reads", "check_final_save")


def check_start() -> None:
    """A /v1 start is two round trips of five statements: BEGIN with the lock (which sets the transaction's
    settings) and one read (the limits and the months side by side, the budget rows joined), then the usage
    row with the COMMIT."""
    user = get_user_model().objects.create_user("gus")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    usage, batches = sent_batches(
        lambda: metered_streams.start(
            user, source=Usage.Source.API, provider=provider, model="m", prompt_tokens=5, max_tokens=10
        )
    )
    assert len(batches) == 2 and len(batches[0]) == 3 and batches[0][0] == '"" "BEGIN" 0', batches
    assert "set_config('synchronous_commit'" in batches[0][1] and "FOR NO KEY UPDATE" in batches[0][1], batches
    read = batches[0][2]
    assert "COUNT(CASE WHEN source" in read and "chat_personmonth" in read and "chat_budget" in read, batches
    assert "chat_tokenmonth" not in read, batches  # no token
    assert batches[1][0].startswith('"" "INSERT INTO "chat_usage"') and batches[1][-1] == '"" "COMMIT" 0', batches
    # Committed, and Django and psycopg agree that no transaction is open.
    assert connection.get_autocommit() and connection.connection.autocommit
    assert connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE
    with psycopg.connect(_conninfo()) as other:
        assert other.execute("SELECT status FROM chat_usage WHERE id = %s", [usage.pk]).fetchone() == ("streaming",)

    # A refused start rolls back what its transaction wrote, and leaves the connection as it found it.
    with override_settings(API_MAX_STREAMS=1):
        with pytest.raises(limits.LimitExceeded):
            metered_streams.start(user, source=Usage.Source.API, provider=provider, model="m",
                                  prompt_tokens=5, max_tokens=10)  # fmt: skip
    assert Usage.objects.count() == 1
    assert connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE

    # A block whose first statements were sent with its BEGIN still rolls back whole on an error.
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            read_together([Read("UPDATE auth_user SET last_name = 'x' WHERE id = %s", [user.pk]), Read("SELECT 1", [])])
            Provider.objects.create(name="q", base_url="http://127.0.0.1:9/v1", api_key="k")
            raise RuntimeError("the block fails after its writes")
    user.refresh_from_db()
    assert user.last_name == "" and not Provider.objects.filter(name="q").exists()


def _conninfo() -> str:
    return " ".join(f"{key}={value}" for key, value in connection.get_connection_params().items()
                    if key in ("host", "port", "user", "dbname"))  # fmt: skip


def test_on_postgresql_a_start_is_two_round_trips():
    check_on_postgresql("chat_reads_start", "tests.models.test_reads", "check_start")


def check_apart() -> None:
    def apart():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.execute("SELECT 2")

    assert round_trips(apart)[1] == 2


def check_prepared() -> None:
    """A statement a connection has run five times is prepared on it, its values bound apart from its text."""
    user = get_user_model().objects.create_user("erin")
    for _ in range(6):
        ChatDefaults.of(user)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any('FROM "chat_chatdefaults"' in statement and "= $1" in statement for statement in prepared), prepared


def test_on_postgresql_the_statements_of_every_start_are_prepared():
    check_on_postgresql("chat_prepared", "tests.models.test_reads", "check_prepared")


def check_planned_once() -> None:
    """A start's reads, once prepared, are planned once on their connection, not again at every start."""
    user = get_user_model().objects.create_user("fay")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    token, _ = ApiToken.issue(user, "tests")
    for _ in range(8):  # prepared from the sixth (settings.DATABASE_PREPARED)
        usage = metered_streams.start(user, source=Usage.Source.API, token=token, provider=provider, model="m",
                                      prompt_tokens=5, max_tokens=10)  # fmt: skip
        metered_streams.settle(usage.pk, {"status": "complete"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        plans = {statement: (generic, custom) for statement, generic, custom in cursor.fetchall()}
    reads = {statement: counts for statement, counts in plans.items() if "chat_budget" in statement
             or "COUNT(CASE WHEN source" in statement or "SUM(reserved_usd)" in statement}  # fmt: skip
    assert len(reads) == 1, plans  # the limits, the person's month and the token's side by side, the budgets joined
    # PostgreSQL's own choice re-planned them for the values of each start (custom plans).
    assert all(generic >= 1 and custom == 0 for generic, custom in reads.values()), reads


def test_on_postgresql_a_starts_reads_are_planned_once():
    check_on_postgresql("chat_planned", "tests.models.test_reads", "check_planned_once")
