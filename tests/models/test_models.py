"""Model helpers: upstream-derived strings against their columns on PostgreSQL (which enforces lengths),
titles, and the stream's rows written by statements compiled once (chat/models/base.py)."""

import asyncio
import os
import subprocess
import sys
from decimal import Decimal

import httpx
import psycopg
import pytest

from chat.models import Conversation
from tests.cluster.test_scaleout import sign_in
from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer, Tab
from tests.services import check_on_postgresql, postgres_database

FINISH = "stop_" + "x" * 35  # 40 characters for a 30-character column
LONG = "[[finish:" + FINISH + "]] [[longid]] hi"


@pytest.fixture(scope="module")
def pg_server(fake_server):
    """A server on a PostgreSQL database of its own, its upstream the fake infyrence; yields (server, API token)."""
    with postgres_database("chat_columns", migrated=True) as database_url:
        env = {
            "DATABASE_URL": database_url,
            "UPSTREAM_BASE_URL": fake_server.base_url("infyrence"),
            "UPSTREAM_API_KEY": FAKE_KEY,
            "UPSTREAM_NAME": "infyrence",
            "UPSTREAM_MODEL": MODELS["infyrence"],
        }
        setup = {**os.environ, **env, "DJANGO_SUPERUSER_PASSWORD": "carol-secret-pw"}
        commands = (["migrate", "--noinput"], ["createsuperuser", "--noinput", "--username", "carol", "--email", ""],
                    ["createtoken", "carol"])  # fmt: skip
        for command in commands:
            made = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=setup, check=True,
                                  capture_output=True, text=True)  # fmt: skip
        with LiveServer(env) as live:
            live.database_url = database_url
            yield live, made.stdout.strip().splitlines()[-1]


@pytest.mark.slow
async def test_long_upstream_strings_are_cut_to_their_columns_on_postgresql(pg_server):
    live, token = pg_server
    async with Tab(live, await asyncio.to_thread(sign_in, live)) as tab:
        await tab.send(type="send", conversation=None, content=LONG, model=MODELS["infyrence"])
        frames = await tab.until("done")
    assert frames[-1]["status"] == "complete"
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            live.url + "/v1/chat/completions",
            json={"model": MODELS["infyrence"], "messages": [{"role": "user", "content": LONG}], "stream": True},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    output = live.output()
    assert "Traceback" not in output and "value too long" not in output
    with psycopg.connect(live.database_url) as db:
        (finish,) = db.execute("SELECT finish_reason FROM chat_message WHERE role = 'assistant'").fetchone()
        rows = db.execute("SELECT source, status, finish_reason, upstream_id, request_id FROM chat_usage").fetchall()
    assert finish == FINISH[:30]
    assert sorted(row[0] for row in rows) == ["api", "chat"]
    for _, status, finish, upstream_id, request_id in rows:
        assert status == "complete" and finish == FINISH[:30]
        assert len(upstream_id) == len(request_id) == 200 and upstream_id.startswith("chatcmpl_")


@pytest.mark.parametrize(
    ("first_message", "title"),
    [
        ("[[chunks:3]] hello there", "hello there"),
        ("# **Bold** title with `code`", "Bold title with code"),
        ("\n\n> see [the docs](https://x.example) ![chart](c.png)", "see the docs chart"),
        ("snake_case_name and 2*3*4", "snake_case_name and 2*3*4"),
        ("[[delay:5]]\nthe second line", "the second line"),
        ("x" * 80, "x" * 59 + "…"),
        ("See [Python](https://en.wikipedia.org/wiki/Python_(programming_language)) please", "See Python please"),
        ("```python\nprint(1)\n```\nWhy does this print 1?", "Why does this print 1?"),  # not "python"
        ("```python\nprint(1)\n```", "print(1)"),  # only code: its first line
        ("| name | age |\n|---|:-:|\n| Ann | 3 |", "name age"),
    ],
)
def test_a_title_is_the_first_line_as_plain_text(first_message, title):
    assert Conversation.title_for(first_message) == title


def rows_match_the_orm() -> None:
    """insert_row and update_row write what create() and update() write; run on SQLite and on PostgreSQL."""
    from django.contrib.auth import get_user_model
    from django.db.models import F
    from django.utils import timezone

    from chat.models import Message, Price, Provider, Usage, insert_row, update_row
    from chat.models.base import columns_of, rows_of

    user = get_user_model().objects.create(username="rows")
    provider = Provider.objects.create(name="rows", base_url="http://127.0.0.1:9/v1")
    conversation = insert_row(Conversation(owner=user, title="t"))
    assert conversation.pk and not conversation._state.adding and conversation._state.db == "default"
    stored = Conversation.objects.get(pk=conversation.pk)
    assert (stored.title, stored.params, stored.created) == ("t", {}, conversation.created)  # auto_now_add set
    message = insert_row(Message(conversation=conversation, role="assistant", status="streaming"))
    started = timezone.now()
    fields = {"user": user, "provider": provider, "message": message, "model": "m", "status": "streaming",
              "started": started, "prompt_tokens": 3, "reserved_usd": Decimal("0.12345678"),
              "reserved_tokens": 7}  # fmt: skip
    ours, theirs = insert_row(Usage(**fields)), Usage.objects.create(**fields)
    assert ours.pk != theirs.pk

    def columns(row) -> dict:
        row = type(row).objects.get(pk=row.pk)
        return {f.attname: getattr(row, f.attname) for f in type(row)._meta.concrete_fields if f.attname != "id"}

    assert columns(ours) == columns(theirs)
    ending = {"status": "complete", "cost": Decimal("0.00012345"), "upstream_perf": {"tps": [1, "é"]},
              "ended": timezone.now(), "error": "", "message": None, "completion_tokens": 5}  # fmt: skip
    assert update_row(Usage, ours.pk, ending) == 1
    Usage.objects.filter(pk=theirs.pk).update(**ending)
    assert columns(ours) == columns(theirs) and columns(ours)["cost"] == Decimal("0.00012345")
    assert update_row(Usage, ours.pk, {"message": message}) == 1 and columns(ours)["message_id"] == message.pk
    assert update_row(Usage, 10**9, {"error": "none such"}) == 0
    # A condition besides the key: a row that no longer matches it is left as it is.
    assert update_row(Usage, ours.pk, {"error": "late"}, where={"status": "streaming"}) == 0
    assert update_row(Usage, ours.pk, {"error": "on time"}, where={"status": "complete"}) == 1
    assert columns(ours)["error"] == "on time"
    update_row(Usage, ours.pk, {"error": ""})
    # An expression is the ORM's to write.
    update_row(Message, message.pk, {"thinking_ms": 40})
    assert update_row(Message, message.pk, {"thinking_ms": F("thinking_ms") + 2}) == 1
    assert Message.objects.get(pk=message.pk).thinking_ms == 42
    # rows_of reads what the ORM reads, each column converted as it converts it (decimals, datetimes, JSON).
    Price.objects.create(provider=provider, model="m", prompt=Decimal("1.5"), completion=Decimal("2.25"))
    for model, row in ((Price, Price.objects.get(model="m")), (Usage, ours), (Provider, provider)):
        sql = f"SELECT {columns_of(model)} FROM {model._meta.db_table} WHERE id = %s"
        [read] = rows_of(model, sql, [row.pk])
        read_columns = {f.attname: getattr(read, f.attname) for f in model._meta.concrete_fields}
        assert read_columns == columns(row) | {"id": row.pk}


@pytest.mark.django_db
def test_rows_written_by_compiled_statements_match_the_orms_on_sqlite():
    rows_match_the_orm()


@pytest.mark.slow
def test_rows_written_by_compiled_statements_match_the_orms_on_postgresql():
    check_on_postgresql("chat_rows", "tests.models.test_models", "rows_match_the_orm")


@pytest.mark.django_db
def test_a_turns_rows_are_freed_without_the_garbage_collector(alice, providers):
    """A turn's conversation and messages hold no cycle: a finished stream's rows go when it lets go of them."""
    import gc
    import weakref

    from chat.actions.turns import begin_turn
    from chat.streaming.catalog import CatalogEntry

    gc.disable()
    try:
        turn = begin_turn(alice, CatalogEntry(providers["i14"], MODELS["i14"]), {}, content="hello there")
        stored = Conversation.objects.get(pk=turn.conversation.pk)
        assert stored.current_id == turn.conversation.current_id == turn.reply.pk
        rows = [weakref.ref(row) for row in (turn.conversation, turn.user_message, turn.reply)]
        del turn
        assert [row() for row in rows] == [None, None, None]
    finally:
        gc.enable()


@pytest.mark.django_db(transaction=True)
async def test_a_start_resolves_its_model_from_the_lists_this_process_holds(providers):
    """A stream's start resolves its model on a database thread, with no I/O: a list not held yet is fetched first."""
    from chat.models import ChatError, Provider
    from chat.runtime import db_threads
    from chat.streaming.catalog import ModelListNotCached, cached_catalog, load_catalog, resolve_in

    enabled = await db_threads.run(Provider.objects.enabled_list)()
    with pytest.raises(ModelListNotCached) as cold:
        cached_catalog(enabled)  # new providers: none of their GET /models answers is held yet
    assert cold.value.providers == enabled
    fetched = await load_catalog(providers=enabled)
    assert cached_catalog(enabled) == fetched and len(fetched) >= len(enabled)
    entry = resolve_in(fetched, "infyrence/" + MODELS["infyrence"])
    assert (entry.provider.name, entry.model) == ("infyrence", MODELS["infyrence"])
    with pytest.raises(ChatError) as unknown:
        resolve_in(fetched, "no-such-model")
    assert unknown.value.code == "unknown_model"

    # A provider edited since its list was fetched is fetched again; one with a configured list never is.
    edited = providers["api14"]
    edited.model_list = "listed-by-staff"
    await edited.asave()
    enabled = await db_threads.run(Provider.objects.enabled_list)()
    assert [entry.model for entry in cached_catalog([p for p in enabled if p.pk == edited.pk])] == ["listed-by-staff"]
    providers["i14"].default_model = "another-default"
    await providers["i14"].asave()
    with pytest.raises(ModelListNotCached):
        cached_catalog(await db_threads.run(Provider.objects.enabled_list)())
