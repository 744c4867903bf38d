"""Every metered stream starts one way (chat/metering/metered_streams.py): a chat turn, a /v1 request, a title."""

import asyncio

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from chat.actions import titles
from chat.actions.turns import begin_turn
from chat.metering import metered_streams
from chat.metering.budgets import BudgetExceeded
from chat.models import ApiToken, Budget, Provider, Usage
from chat.streaming.catalog import CatalogEntry
from chat.views.metered_api import MeteredRequest
from tests.services import check_on_postgresql

# The steps every start takes: the lock with the reads, then the budget's reservation (then the row).
STEPS = ("_admission", "_reserve")


def start_each_way() -> dict[str, dict]:
    """Start a chat turn, a /v1 request and a title for one person; for each (by usage source) the
    steps of metered_streams it took, the SQL it ran and its usage row."""
    user = get_user_model().objects.create_user("carol")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    token, _ = ApiToken.issue(user, "tests")
    entry = CatalogEntry(provider, "m")

    def api() -> None:
        async def received() -> MeteredRequest:  # made on a loop, as the view makes it
            return MeteredRequest({"model": "m", "messages": [{"role": "user", "content": "hello there"}]})

        request = asyncio.run(received())
        request.token, request.entry = token, entry
        request.begin()

    ways = {
        Usage.Source.CHAT: lambda: begin_turn(user, entry, {}, content="hello there"),
        Usage.Source.API: api,
        Usage.Source.TITLE: lambda: titles.begin(user, provider, "m", 40, None),
    }
    taken: list[tuple] = []
    originals = {name: getattr(metered_streams, name) for name in STEPS}

    def spy(name: str):
        def step(*args, **kwargs):
            limited = (kwargs["check_limits"],) if name == "_admission" else ()
            taken.append((name, kwargs["source"], *limited))
            return originals[name](*args, **kwargs)

        return step

    found = {}
    try:
        for name in STEPS:
            setattr(metered_streams, name, spy(name))
        for source, way in ways.items():
            taken.clear()
            with CaptureQueriesContext(connection) as queries:
                way()
            row = Usage.objects.filter(source=source).values("status", "prompt_tokens", "reserved_tokens").get()
            found[source] = {"steps": list(taken), "sql": [q["sql"] for q in queries.captured_queries], "row": row}
    finally:
        for name, original in originals.items():
            setattr(metered_streams, name, original)
    return found


def check_starts() -> None:
    """The three ways take the same steps; on PostgreSQL each locks the person's row FOR NO KEY UPDATE, once."""
    found = start_each_way()
    users = get_user_model()._meta.db_table
    completions = {Usage.Source.CHAT: settings.UPSTREAM_MAX_TOKENS, Usage.Source.API: settings.UPSTREAM_MAX_TOKENS,
                   Usage.Source.TITLE: titles.MAX_TOKENS}  # fmt: skip
    for source, start in found.items():
        limited = source != Usage.Source.TITLE  # a title skips the limits, and only them
        assert start["steps"] == [("_admission", source, limited), ("_reserve", source)], (source, start["steps"])
        row = start["row"]
        assert row["status"] == "streaming" and row["prompt_tokens"] > 0, (source, row)
        assert row["reserved_tokens"] == row["prompt_tokens"] + completions[source], (source, row)
        sql = start["sql"]
        counted = [i for i, statement in enumerate(sql) if "COUNT(CASE WHEN source" in statement]
        assert len(counted) == (1 if limited else 0), (source, sql)
        locks = [i for i, statement in enumerate(sql) if " FOR " in statement and "UPDATE" in statement]
        if connection.vendor != "postgresql":
            assert not locks, (source, sql)  # SQLite's IMMEDIATE transactions serialise the writers
            continue
        assert len(locks) == 1 and sql[locks[0]].endswith("FOR NO KEY UPDATE"), (source, sql)
        assert f'"{users}"' in sql[locks[0]], (source, sql)
        inserted = [i for i, statement in enumerate(sql) if statement.startswith('INSERT INTO "chat_usage"')]
        assert len(inserted) == 1 and locks[0] < inserted[0], (source, sql)
        assert all(locks[0] < i for i in counted), (source, sql)  # the limits read after the lock is had


@pytest.mark.django_db(transaction=True)
def test_a_chat_turn_an_api_request_and_a_title_start_the_same_way():
    check_starts()


def test_on_postgresql_every_start_locks_the_person_for_no_key_update():
    check_on_postgresql("chat_starts", "tests.metering.test_metered_streams", "check_starts")


def check_budgets_at_start() -> None:
    """A start reads every kind of budget with its lock: the default (no rows), a group's, the person's, a token's."""
    user = get_user_model().objects.create_user("dana")
    provider = Provider.objects.create(name="p", base_url="http://127.0.0.1:9/v1", api_key="k")
    token, _ = ApiToken.issue(user, "tests")

    def start(max_tokens: int = 400, token=None) -> Usage:
        return metered_streams.start(user, source=Usage.Source.API, provider=provider, model="m", token=token,
                                     prompt_tokens=5, max_tokens=max_tokens)  # fmt: skip

    # A start is admitted while what is spent and reserved is under the limit (the last one crosses it).
    with override_settings(BUDGET_DEFAULT_TOKENS=1000, BUDGET_DEFAULT_USD=None):
        start(), start(), start()  # 1,215 tokens reserved: no budget row, so the default applies
        with pytest.raises(BudgetExceeded, match="Your monthly budget of 1,000 tokens"):
            start()
        group = Group.objects.create(name="team")
        user.groups.add(group)
        Budget.objects.create(group=group, tokens=5000)  # a group's replaces the default
        start()
        Budget.objects.create(user=user, tokens=1500)  # the person's own replaces the group's
        with pytest.raises(BudgetExceeded, match="Your monthly budget of 1,500 tokens"):
            start()
        Budget.objects.filter(user=user).update(tokens=10_000)
        Budget.objects.create(token=token, tokens=100)  # a token's comes on top
        start(token=token)
        with pytest.raises(BudgetExceeded, match="This API token's monthly budget of 100 tokens"):
            start(token=token)
        start()
    assert Usage.objects.filter(status="streaming").count() == 6


@pytest.mark.django_db(transaction=True)
def test_a_start_reads_every_kind_of_budget():
    check_budgets_at_start()


def test_on_postgresql_a_start_reads_every_kind_of_budget():
    check_on_postgresql("chat_start_budgets", "tests.metering.test_metered_streams", "check_budgets_at_start")
