"""Prices, costs and monthly budgets (chat/metering/budgets.py): against the running server where a person sees them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from decimal import Decimal

import aiohttp
import httpx
import openai
import orjson
import psycopg
import pytest
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat.actions.orphans import recover_orphans
from chat.actions.turns import begin_turn
from chat.metering import budgets, summary_triggers
from chat.metering.budgets import Budget, BudgetExceeded, Price, budget_for, month_start, next_month_start
from chat.models import ApiToken, Message, PersonMonth, Usage
from chat.streaming import upstream
from chat.streaming.catalog import CatalogEntry
from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer, Tab, database_url, wait_until
from tests.services import postgres_database

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
API14 = MODELS["api14"]
ENDLESS = "[[delay:500]] [[chunks:100000]]"  # streams until stopped
MAX_TOKENS = 100


def reservation_tokens(content: str, max_tokens: int = MAX_TOKENS) -> int:
    """What a request with this one message reserves in tokens: its prompt estimate plus max_tokens."""
    return upstream.estimate_tokens(len(content)) + max_tokens


def body(content: str, model: str = I14, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS, **extra}


@pytest.fixture
def price(providers):
    """i14's model at $2 / $8 per million tokens (reasoning at $10), since yesterday."""
    return Price.objects.create(
        provider=providers["i14"],
        model=I14,
        prompt=Decimal("2"),
        completion=Decimal("8"),
        reasoning=Decimal("10"),
        effective_from=timezone.now() - timedelta(days=1),
    )


# --- prices and cost -------------------------------------------------------------------------


def test_the_price_in_force_is_the_newest_before_the_stream_and_the_providers_own(providers):
    now = timezone.now()
    old = Price.objects.create(model="m", prompt=1, completion=2, effective_from=now - timedelta(days=30))
    new = Price.objects.create(model="m", prompt=3, completion=4, effective_from=now - timedelta(days=1))
    Price.objects.create(model="m", prompt=5, completion=6, effective_from=now + timedelta(days=1))
    i14 = providers["i14"].pk
    assert Price.objects.in_force(i14, "m", now) == new
    assert Price.objects.in_force(i14, "m", now - timedelta(days=10)) == old
    assert Price.objects.in_force(i14, "m", now - timedelta(days=31)) is None
    own = Price.objects.create(provider=providers["i14"], model="m", prompt=7, completion=8, effective_from=now)
    assert Price.objects.in_force(i14, "m", now) == own
    assert Price.objects.in_force(providers["api14"].pk, "m", now) == new
    assert Price.objects.in_force(i14, "other", now) is None


def test_price_arithmetic_is_decimal_with_reasoning_and_cached_prices():
    price = Price(prompt=Decimal("3"), completion=Decimal("15"), reasoning=Decimal("20"), cached_prompt=Decimal("0.3"))
    # 1,000 prompt (400 cached), 500 completion of which 200 reasoning.
    cost = price.cost(1000, 500, reasoning=200, cached=400)
    assert isinstance(cost, Decimal)
    assert cost == (600 * Decimal(3) + 400 * Decimal("0.3") + 300 * Decimal(15) + 200 * Decimal(20)) / 1_000_000
    assert Price(prompt=1, completion=2).cost(10, 10, reasoning=5) == Decimal("0.00003")
    assert price.worst_case(1000, 100) == Decimal("0.005")  # every completion token at the dearer reasoning price


async def test_chat_cost_is_computed_from_the_price_table_at_the_time_of_the_stream(connect, alice, providers, price):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[reasoning:30]] [[chunks:40]]", model=I14)
    done = (await ws.until("done"))[-1]
    row = await Usage.objects.aget()
    assert row.cost_source == "computed" and not row.cost_estimated and not row.estimated
    assert row.reasoning_tokens > 0
    assert row.cost == price.cost(row.prompt_tokens, row.completion_tokens, row.reasoning_tokens) > 0
    assert done["usage"]["cost"] == float(row.cost)
    # A later price change does not rewrite this row, and the next stream uses the new price.
    await Price.objects.acreate(provider=price.provider, model=I14, prompt=100, completion=100)
    await ws.send(type="send", conversation=None, content="[[chunks:5]]", model=I14)
    await ws.until("done")
    first, second = [u async for u in Usage.objects.order_by("pk")]
    assert first.cost == row.cost
    assert second.cost == Decimal(100 * second.total_tokens) / 1_000_000


async def test_the_upstreams_reported_cost_wins_over_the_price_table(connect, alice, providers):
    await Price.objects.acreate(model=API14, prompt=1000, completion=1000, effective_from=timezone.now() - timedelta(1))
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[chunks:10]]", model=API14)
    await ws.until("done")
    row = await Usage.objects.aget()
    assert row.cost_source == "reported" and row.cost is not None and not row.cost_estimated
    assert row.cost < Decimal(1000 * row.total_tokens) / 1_000_000  # the fake's own price, not the table's


async def test_estimated_counts_give_an_estimated_cost_and_no_price_gives_none(connect, alice, providers, price):
    _, _, ws = await connect(alice)
    # Cut before the usage chunk: the counts are estimated from the text.
    await ws.send(type="send", conversation=None, content="[[chunks:20]] [[fault:cut]]", model=I14)
    await ws.until("done")
    row = await Usage.objects.aget()
    assert row.estimated and row.cost_source == "computed" and row.cost_estimated and row.cost > 0
    await ws.send(type="send", conversation=None, content="[[chunks:5]]", model=MODELS["infyrence"])
    await ws.until("done")
    unpriced = await Usage.objects.filter(model=MODELS["infyrence"]).aget()
    assert unpriced.cost is None and unpriced.cost_source == "unknown"


def test_api_requests_are_priced_at_their_final_save(server, alice, providers, price, fake):
    token = ApiToken.issue(alice, "t")[1]
    Budget.objects.create(user=alice, usd=Decimal("5"))  # a USD limit: the USD worst case is reserved
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0)
    client.chat.completions.create(**body("[[chunks:12]]"))
    assert wait_until(lambda: Usage.objects.exclude(status="streaming").exists())
    row = Usage.objects.get()
    assert row.source == "api" and row.cost_source == "computed"
    assert row.cost == price.cost(row.prompt_tokens, row.completion_tokens, row.reasoning_tokens)
    assert row.reserved_tokens == reservation_tokens("[[chunks:12]]")
    assert row.reserved_usd == price.worst_case(row.reserved_tokens - MAX_TOKENS, MAX_TOKENS)


# --- which budget applies ----------------------------------------------------------------------


def test_budget_is_the_users_own_else_the_most_generous_group_else_the_default(alice, bob):
    with override_settings(BUDGET_DEFAULT_USD=None, BUDGET_DEFAULT_TOKENS=None):
        assert not budget_for(alice).limited
    with override_settings(BUDGET_DEFAULT_USD=Decimal("10"), BUDGET_DEFAULT_TOKENS=5000):
        assert (budget_for(alice).usd, budget_for(alice).tokens, budget_for(alice).source) == (10, 5000, "default")
        interns, staff = Group.objects.create(name="interns"), Group.objects.create(name="staff")
        alice.groups.add(interns, staff)
        Budget.objects.create(group=interns, usd=Decimal("5"), tokens=1000)
        Budget.objects.create(group=staff, usd=Decimal("50"), tokens=None)
        # Several groups: the most generous of each kind; no limit of a kind in one group is no limit.
        limit = budget_for(alice)
        assert (limit.usd, limit.tokens, limit.source) == (Decimal("50"), None, "group")
        assert budget_for(bob).source == "default"  # not in the groups
        Budget.objects.create(user=alice, usd=Decimal("1"), tokens=None)
        limit = budget_for(alice)
        assert (limit.usd, limit.tokens, limit.source) == (Decimal("1"), None, "user")


def test_sums_of_costs_are_exact_decimals_on_every_database(alice):
    for _ in range(3):
        Usage.objects.create(user=alice, model="m", status="complete", cost=Decimal("0.1"))
    now = timezone.now()
    assert budgets.month_spent(alice).usd == Decimal("0.3")
    assert budgets.spent_by("user_id", alice.pk, month_start(now), now).usd == Decimal("0.3")


def test_a_budget_row_is_for_exactly_one_user_group_or_token(alice):
    from django.db import IntegrityError

    group = Group.objects.create(name="g")
    with pytest.raises(IntegrityError), transaction.atomic():
        Budget.objects.create(user=alice, group=group, usd=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Budget.objects.create(usd=1)


def reserve(user, token=None, prompt=10, max_tokens=100):
    with transaction.atomic():
        return budgets.reserve(user, token=token, provider_id=None, model="m", prompt_tokens=prompt,
                               max_tokens=max_tokens)  # fmt: skip


def test_the_default_and_group_budgets_refuse_once_spent(alice):
    Usage.objects.create(user=alice, model="m", status="complete", total_tokens=900, cost=Decimal("2"))
    with override_settings(BUDGET_DEFAULT_TOKENS=1000, BUDGET_DEFAULT_USD=None):
        assert reserve(alice).tokens == 110
        Usage.objects.create(user=alice, model="m", status="complete", total_tokens=100)
        with pytest.raises(BudgetExceeded) as refused:
            reserve(alice)
        assert "Your monthly budget of 1,000 tokens is used up (1,000 used" in refused.value.detail
    group = Group.objects.create(name="team")
    alice.groups.add(group)
    Budget.objects.create(group=group, usd=Decimal("2.00"))
    with pytest.raises(BudgetExceeded) as refused:
        reserve(alice)
    resets = timezone.localtime(next_month_start())
    assert refused.value.detail == (
        f"Your monthly budget of $2.00 is used up ($2.00 spent or reserved this month); it resets on 1 {resets:%B %Y}."
    )
    # Last month's spending does not count.
    Usage.objects.update(started=month_start() - timedelta(seconds=1))
    assert reserve(alice).tokens == 110


def test_the_usd_reservation_uses_the_price_in_force_only_under_a_usd_limit(alice, providers):
    now = timezone.now()
    i14 = providers["i14"]
    Price.objects.create(model="m", prompt=1, completion=2, effective_from=now - timedelta(days=9))
    Price.objects.create(
        provider=i14, model="m", prompt=3, completion=4, reasoning=9, effective_from=now - timedelta(2)
    )
    Price.objects.create(provider=i14, model="m", prompt=50, completion=60, effective_from=now + timedelta(days=1))

    def reserved(provider):
        with transaction.atomic():
            return budgets.reserve(alice, provider_id=provider.pk, model="m", prompt_tokens=1000, max_tokens=500)

    assert reserved(i14) == budgets.Reservation(None, 1500)  # no USD limit: no price needed
    Budget.objects.create(user=alice, usd=Decimal("10"))
    assert reserved(i14).usd == Decimal(1000 * 3 + 500 * 9) / 1_000_000
    assert reserved(providers["api14"]).usd == Decimal(1000 * 1 + 500 * 2) / 1_000_000
    Price.objects.all().delete()
    assert reserved(i14) == budgets.Reservation(None, 1500)


def test_running_streams_count_their_reservation_and_stale_ones_do_not(alice, settings):
    Budget.objects.create(user=alice, tokens=300)
    Usage.objects.create(user=alice, model="m", status="streaming", reserved_tokens=200)
    assert budgets.month_spent(alice).tokens == 200
    reserve(alice)  # 200 < 300: may start
    Usage.objects.create(user=alice, model="m", status="streaming", reserved_tokens=110)
    with pytest.raises(BudgetExceeded):
        reserve(alice)
    # A row left `streaming` past the longest possible stream was left by a dead process.
    # The plain-SQL sum of the check agrees with the queryset's.
    now = timezone.now()
    assert budgets.spent_by("user_id", alice.pk, month_start(now), now) == budgets.month_spent(alice)
    Usage.objects.update(started=timezone.now() - timedelta(seconds=settings.UPSTREAM_DEADLINE + 120))
    assert budgets.spent(Usage.objects.filter(user=alice), month_start()).tokens == 0
    assert budgets.spent_by("user_id", alice.pk, month_start(now), now).tokens == 0


def month_of_rows(alice, bob, settings):
    """Rows of every kind in alice's month, and some outside it: what her budget counts is $1.75 and 1,800 tokens."""
    token = ApiToken.issue(alice, "t")[0]
    dead = timezone.now() - timedelta(seconds=settings.UPSTREAM_DEADLINE + 120)
    for status, cost, tokens in [("complete", "1.25", 1000), ("failed", "0.5", 400), ("stopped", None, 100)]:
        Usage.objects.create(user=alice, model="m", status=status, cost=cost and Decimal(cost), total_tokens=tokens)
    Usage.objects.create(user=alice, model="m", status="refused", total_tokens=0)
    Usage.objects.create(user=alice, token=token, source="api", model="m", status="complete", total_tokens=100)
    # Running: counted by the reservation; one left by a dead process, not at all.
    Usage.objects.create(user=alice, model="m", status="streaming", prompt_tokens=50, reserved_tokens=200)
    Usage.objects.create(user=alice, model="m", status="streaming", reserved_tokens=900, reserved_usd=9, started=dead)
    Usage.objects.create(user=alice, model="m", status="complete", cost=Decimal(7), total_tokens=7000,
                         started=month_start() - timedelta(seconds=1))  # fmt: skip
    Usage.objects.create(user=bob, model="m", status="complete", cost=Decimal(3), total_tokens=3000)
    return budgets.Spent(usd=Decimal("1.75"), tokens=1800)


def test_a_persons_month_is_read_from_the_summary_and_agrees_with_the_rows(alice, bob, settings):
    """The monthly summary's budget sums (kept by triggers) and the running rows give what the rows give."""
    expected = month_of_rows(alice, bob, settings)
    now = timezone.now()
    with CaptureQueriesContext(connection) as captured:
        assert budgets.spent_by("user_id", alice.pk, month_start(now), now) == expected
    (sql,) = [query["sql"] for query in captured.captured_queries]
    assert "chat_personmonth" in sql
    assert budgets.month_spent(alice) == expected  # the ORM's sum over the rows
    # The page's budget bar (read after every answer) too.
    with CaptureQueriesContext(connection) as captured:
        assert budgets.summary(alice)["tokens"]["spent"] == expected.tokens
    assert any("chat_personmonth" in query["sql"] for query in captured.captured_queries)
    # A running row that ends moves from its reservation to its cost and reported tokens.
    Usage.objects.filter(status="streaming", reserved_tokens=200).update(
        status="complete", cost=Decimal("0.25"), total_tokens=60
    )
    assert budgets.spent_by("user_id", alice.pk, month_start(now), now) == budgets.Spent(Decimal("2.00"), 1660)
    assert budgets.month_spent(alice) == budgets.Spent(Decimal("2.00"), 1660)
    # A start reads neither the month's rows nor the dead process's: the summary's row and the running ones.
    assert connection.vendor == "sqlite"  # the suite's database
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        plan = "\n".join(row[-1] for row in cursor.fetchall())
    assert "SEARCH chat_personmonth USING INDEX" in plan and "(day=? AND user_id=?)" in plan, plan
    assert "SEARCH chat_usage USING INDEX usage_streaming (user_id=? AND started>?)" in plan, plan
    assert plan.count("chat_usage") == 1, plan


def test_a_tokens_month_is_read_from_its_summary_and_agrees_with_the_rows(alice, bob, settings):
    month_of_rows(alice, bob, settings)
    token, other = ApiToken.issue(alice, "script")[0], ApiToken.issue(alice, "other")[0]
    for owner, key in [(alice, token), (alice, other), (alice, None)]:
        Usage.objects.create(user=owner, token=key, source="api", model="m", status="complete",
                             cost=Decimal("0.5"), total_tokens=40)  # fmt: skip
        Usage.objects.create(user=owner, token=key, source="api", model="m", status="streaming", reserved_tokens=30)
    Usage.objects.create(user=alice, token=token, source="api", model="m", status="complete", cost=Decimal(4),
                         total_tokens=400, started=month_start() - timedelta(seconds=1))  # fmt: skip
    now = timezone.now()

    def month_of(key):
        with CaptureQueriesContext(connection) as captured:
            used = budgets._month_and_price("token_id", key.pk, month_start(now), now, None, user_id=alice.pk)[0]
        assert "chat_tokenmonth" in captured.captured_queries[0]["sql"]
        return used

    assert (
        month_of(token)
        == budgets.spent(Usage.objects.filter(token=token), month_start())
        == budgets.Spent(Decimal("0.5"), 70)
    )
    assert budgets.spent_by("token_id", token.pk, month_start(now), now) == month_of(token)
    assert summary_triggers.mismatches() == []
    # A token deleted leaves its rows to its person (token_id emptied): the summaries follow.
    other.delete()
    assert summary_triggers.mismatches() == []
    assert month_of(token) == budgets.Spent(Decimal("0.5"), 70)


def test_a_persons_month_is_summed_from_the_rows_while_the_summaries_are_not_current(alice, bob, settings):
    expected = month_of_rows(alice, bob, settings)
    now = timezone.now()
    try:
        summary_triggers.uninstall()  # no triggers: the summaries are stale from now on
        Usage.objects.create(user=alice, model="m", status="complete", cost=Decimal("0.25"), total_tokens=10)
        grown = budgets.Spent(expected.usd + Decimal("0.25"), expected.tokens + 10)
        assert budgets.spent_by("user_id", alice.pk, month_start(now), now) == grown
        call_command("rollup")
        with override_settings(TIME_ZONE="Asia/Tokyo"):  # summaries counting days in UTC: the rows answer
            PersonMonth.objects.filter(user=alice).update(budget_cost=0, budget_tokens=0)
            # Tokyo's month begins at 15:00 UTC the day before UTC's (so it may hold the $7 row).
            in_tokyo = budgets.month_spent(alice)
            assert in_tokyo.tokens >= grown.tokens  # not the zeroed summary's (the reservation's 200)
            assert budgets.spent_by("user_id", alice.pk, month_start(now), now) == in_tokyo
    finally:
        call_command("rollup")  # triggers back, in the tests' zone
    assert budgets.spent_by("user_id", alice.pk, month_start(now), now) == grown


# --- refusals, as a person sees them ------------------------------------------------------------


def test_v1_over_budget_is_a_429_insufficient_quota_and_nothing_goes_upstream(server, alice, providers, fake):
    token = ApiToken.issue(alice, "t")[1]
    Budget.objects.create(user=alice, usd=Decimal("0.50"))
    Usage.objects.create(user=alice, model=I14, status="complete", cost=Decimal("0.50"))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**body("hello"))
    error = caught.value.body
    assert caught.value.status_code == 429 and error["type"] == "insufficient_quota"
    assert error["code"] == "budget_exceeded"
    assert (
        error["message"].startswith("Your monthly budget of $0.50 is used up") and "it resets on 1 " in error["message"]
    )
    assert len(fake.app.streams) == 0
    refused = Usage.objects.get(status="refused")
    assert refused.source == "api" and refused.token.name == "t" and refused.error == error["message"]
    assert refused.cost is None
    # Nothing was sent: the dashboard's tokens in count none for it (its month's summary has the refusal alone).
    assert (refused.prompt_tokens, refused.total_tokens) == (0, 0)
    month = PersonMonth.objects.get(user=alice, source="api")
    assert (month.requests, month.prompt_tokens) == (1, 0)
    # An SDK that retries (its default) does not here: the refusal says so (x-should-retry), one row more only.
    with pytest.raises(openai.RateLimitError) as again:
        openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=2).chat.completions.create(**body("hi"))
    assert again.value.response.headers["x-should-retry"] == "false"
    assert Usage.objects.filter(status="refused").count() == 2


def test_an_api_tokens_own_budget_limits_that_token_only(server, alice, providers, fake):
    ci, laptop = ApiToken.issue(alice, "ci"), ApiToken.issue(alice, "laptop")
    Budget.objects.create(token=ci[0], tokens=1)
    first = httpx.post(server.url + "/v1/chat/completions", json=body("[[chunks:3]]"),
                       headers={"Authorization": f"Bearer {ci[1]}"}, timeout=30)  # fmt: skip
    assert first.status_code == 200  # nothing spent yet: it may start, and spends more than the 1 token
    refused = httpx.post(server.url + "/v1/chat/completions", json=body("[[chunks:3]]"),
                         headers={"Authorization": f"Bearer {ci[1]}"}, timeout=30)  # fmt: skip
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert refused.json()["error"]["message"].startswith("This API token's monthly budget of ")
    other = httpx.post(server.url + "/v1/chat/completions", json=body("[[chunks:3]]"),
                       headers={"Authorization": f"Bearer {laptop[1]}"}, timeout=30)  # fmt: skip
    assert other.status_code == 200
    assert len(fake.app.streams) == 2


async def test_websocket_over_budget_answers_budget_exceeded_and_stores_nothing(server, alice, providers, fake):
    await Budget.objects.acreate(user=alice, tokens=1000)
    await Usage.objects.acreate(user=alice, model=I14, status="complete", total_tokens=1000)
    async with Tab(server, alice) as tab:
        await tab.send(type="send", conversation=None, content="hello", model=I14)
        error = await tab.receive()
    assert error["type"] == "error" and error["code"] == "budget_exceeded"
    resets = timezone.localtime(next_month_start())
    assert error["detail"] == (
        f"Your monthly budget of 1,000 tokens is used up (1,000 used or reserved this month); "
        f"it resets on 1 {resets:%B %Y}."
    )
    assert len(fake.app.streams) == 0
    assert not await Message.objects.aexists()
    refused = await Usage.objects.aget(status="refused")
    assert refused.source == "chat" and refused.message_id is None and refused.error == error["detail"]


# --- reservations released ----------------------------------------------------------------------


def test_v1_reservation_is_released_after_a_stop_and_a_failure(server, alice, providers, fake):
    token = ApiToken.issue(alice, "t")[1]
    # Room for one running stream's reservation and no more.
    Budget.objects.create(user=alice, tokens=reservation_tokens(ENDLESS))
    headers = {"Authorization": f"Bearer {token}"}
    url = server.url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body(ENDLESS, stream=True), headers=headers, timeout=30) as held:
        assert held.status_code == 200
        pieces = held.iter_raw()  # kept: a dropped iterator closes the response
        next(pieces)
        assert httpx.post(url, json=body("[[chunks:2]]"), headers=headers).status_code == 429
    # The client left: the row is settled as stopped and only what was used counts.
    assert wait_until(lambda: Usage.objects.filter(status="stopped").exists())
    assert httpx.post(url, json=body("[[status:500]]"), headers=headers).status_code == 500
    failed = Usage.objects.get(status="failed")
    assert failed.reserved_tokens > 0
    spent = budgets.month_spent(alice)
    assert spent.tokens == sum(Usage.objects.exclude(status="refused").values_list("total_tokens", flat=True))
    assert spent.tokens < reservation_tokens(ENDLESS)
    assert httpx.post(url, json=body("[[chunks:2]]"), headers=headers).status_code == 200


async def test_chat_reservation_is_released_after_a_stop(connect, alice, providers, fake):
    await Budget.objects.acreate(user=alice, tokens=reservation_tokens(ENDLESS))
    _, _, ws = await connect(alice)
    params = {"max_tokens": MAX_TOKENS}
    await ws.send(type="send", conversation=None, content=ENDLESS, model=I14, params=params)
    started = (await ws.until("started"))[-1]
    await ws.send(type="send", conversation=None, content=ENDLESS, model=I14, params=params)
    assert (await ws.until("error"))[-1]["code"] == "budget_exceeded"
    await ws.send(type="stop", message=started["message"])
    assert (await ws.until("done"))[-1]["status"] == "stopped"
    await ws.send(type="send", conversation=None, content="[[chunks:2]]", model=I14, params=params)
    assert (await ws.until("done"))[-1]["status"] == "complete"


def test_the_orphan_sweep_settles_a_dead_streams_reservation(alice, providers, price):
    Budget.objects.create(user=alice, tokens=10_000)
    entry = CatalogEntry(providers["i14"], I14)
    turn = begin_turn(alice, entry, {"max_tokens": 5000}, content="hello there")
    assert budgets.month_spent(alice).tokens == turn.usage.reserved_tokens > 5000
    Message.objects.filter(pk=turn.reply.pk).update(content="a partial answer")
    # What the sweep of another process (or of this one at start-up) does with a dead stream.
    recover_orphans(None)
    row = Usage.objects.get()
    assert row.status == "interrupted" and row.estimated
    assert row.cost_source == "computed" and row.cost_estimated and row.cost > 0
    assert budgets.month_spent(alice).tokens == row.total_tokens < 100


def test_a_dead_processes_reservation_is_released_when_the_sweep_settles_it(alice, providers, price, fake):
    from django.db import connection

    Budget.objects.create(user=alice, tokens=2 * reservation_tokens(ENDLESS))
    token = ApiToken.issue(alice, "t")[1]
    params = {"max_tokens": MAX_TOKENS}

    async def start_and_get_refused(live):
        async with Tab(live, alice) as tab:
            await tab.send(type="send", conversation=None, content=ENDLESS, model=I14, params=params)
            await tab.until("delta")
            await tab.send(type="send", conversation=None, content=ENDLESS, model=I14, params=params)
            return (await tab.until("error"))[-1]

    with LiveServer({"DATABASE_URL": database_url(connection.settings_dict)}) as live:
        headers = {"Authorization": f"Bearer {token}"}
        url = live.url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body(ENDLESS, stream=True), headers=headers, timeout=30) as held:
            pieces = held.iter_raw()
            next(pieces)
            # One API stream and one chat stream fill the budget: a third is refused.
            assert asyncio.run(start_and_get_refused(live))["code"] == "budget_exceeded"
            live.restart()  # killed mid-stream; the new process sweeps what the dead one left at start-up
        assert wait_until(lambda: not Usage.objects.filter(status="streaming").exists())
    rows = list(Usage.objects.exclude(status="refused").order_by("source"))
    assert [(row.source, row.status) for row in rows] == [("api", "interrupted"), ("chat", "interrupted")]
    for row in rows:
        assert row.estimated and row.cost_source == "computed" and row.cost_estimated and row.cost > 0
    total = sum(row.total_tokens for row in rows)
    assert budgets.month_spent(alice).tokens == total < reservation_tokens(ENDLESS)


# --- the concurrent case, against two server processes on SQLite and on PostgreSQL --------------


def manage(database_url: str, *args: str, **env: str) -> str:
    made = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url, **env},
        check=True,
        capture_output=True,
    )
    return made.stdout.decode()


def rows(database_url: str, username: str) -> list[tuple]:
    """(status, total_tokens, reserved_tokens) of a user's usage rows, read straight from the database."""
    sql = (
        "SELECT u.status, u.total_tokens, u.reserved_tokens FROM chat_usage u "
        "JOIN auth_user a ON a.id = u.user_id WHERE a.username = {}"
    )
    if database_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as db:
            return db.execute(sql.format("?"), (username,)).fetchall()
    with psycopg.connect(database_url) as db:
        return db.execute(sql.format("%s"), (username,)).fetchall()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def pair(request, fake_server, tmp_path_factory):
    """Two server processes on a database of their own, per-person stream and rate limits out of the way."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            database_url = f"sqlite:///{tmp_path_factory.mktemp('budgets') / 'db.sqlite3'}"
        else:
            database_url = stack.enter_context(postgres_database("chat_budgets", migrated=True))
        env = {
            "DATABASE_URL": database_url,
            "UPSTREAM_BASE_URL": fake_server.base_url("i14"),
            "UPSTREAM_API_KEY": FAKE_KEY,
            "UPSTREAM_NAME": "i14",
            "UPSTREAM_MODEL": I14,
            "CHAT_MAX_STREAMS": "100",
            "API_MAX_STREAMS": "100",
            "RATE_LIMIT_PER_MINUTE": "1000",
            "UPSTREAM_MAX_CONNECTIONS": "40",
        }
        manage(database_url, "migrate", "--noinput")
        for name in ("carol", "dave"):
            manage(database_url, "createsuperuser", "--noinput", "--username", name, "--email", "",
                   DJANGO_SUPERUSER_PASSWORD=f"{name}-secret-pw")  # fmt: skip
        servers = [stack.enter_context(LiveServer(env)), stack.enter_context(LiveServer(env))]
        servers[0].database_url = database_url
        yield servers


def sign_in(server, username: str) -> str:
    with httpx.Client(base_url=server.url) as browser:
        browser.get("/accounts/login/")
        form = {"username": username, "password": f"{username}-secret-pw",
                "csrfmiddlewaretoken": browser.cookies["csrftoken"]}  # fmt: skip
        assert browser.post("/accounts/login/", data=form).status_code == 302
        return browser.cookies["sessionid"]


def budget_line(database_url: str, username: str) -> str:
    return manage(database_url, "budget", username).strip().splitlines()[-1]


@pytest.mark.cluster
async def test_twenty_simultaneous_api_requests_within_a_budget_for_five(pair, fake_server):
    first, second = pair
    database_url = first.database_url
    fake_server.app.reset()
    token = (await asyncio.to_thread(manage, database_url, "createtoken", "carol")).strip().splitlines()[-1]
    allowed = 5 * reservation_tokens(ENDLESS)
    await asyncio.to_thread(manage, database_url, "budget", "carol", "--tokens", str(allowed))
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        opened = [
            client.stream("POST", server.url + "/v1/chat/completions", json=body(ENDLESS, stream=True))
            for server in (first, second) * 10
        ]
        responses = await asyncio.gather(*(stream.__aenter__() for stream in opened))
        ran = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code != 200]
        errors = [orjson.loads(await r.aread())["error"] for r in refused]
        assert 5 <= len(ran) <= 6, [r.status_code for r in responses]
        assert len(fake_server.app.streams) == len(ran)
        statuses = await asyncio.to_thread(rows, database_url, "carol")
        assert sorted(s for s, _, _ in statuses).count("streaming") == len(ran)
        for stream in opened:
            await stream.__aexit__(None, None, None)
    assert {r.status_code for r in refused} == {429}
    assert {(e["type"], e["code"]) for e in errors} == {("insufficient_quota", "budget_exceeded")}
    await settled(database_url, "carol", len(ran), len(refused))


@pytest.mark.cluster
async def test_twenty_simultaneous_websocket_sends_within_a_budget_for_five(pair, fake_server):
    first, second = pair
    database_url = first.database_url
    fake_server.app.reset()
    content = ENDLESS
    allowed = 5 * reservation_tokens(content)
    await asyncio.to_thread(manage, database_url, "budget", "dave", "--tokens", str(allowed))
    cookies = {server.url: await asyncio.to_thread(sign_in, server, "dave") for server in (first, second)}
    async with aiohttp.ClientSession() as session:
        sockets = [
            await session.ws_connect(
                server.url.replace("http", "ws") + "/ws/chat/",
                headers={"Origin": server.url, "Cookie": f"sessionid={cookies[server.url]}"},
            )
            for server in (first, second) * 10
        ]
        frame = orjson.dumps(
            {"type": "send", "conversation": None, "content": content, "params": {"max_tokens": MAX_TOKENS}}
        ).decode()
        await asyncio.gather(*(ws.send_str(frame) for ws in sockets))
        answers = await asyncio.gather(*(ws.receive_json(timeout=30) for ws in sockets))
        started = [(ws, a) for ws, a in zip(sockets, answers, strict=True) if a["type"] == "started"]
        errors = [a for a in answers if a["type"] == "error"]
        assert 5 <= len(started) <= 6, answers
        assert len(started) + len(errors) == 20
        assert {e["code"] for e in errors} == {"budget_exceeded"}
        assert all("it resets on 1 " in e["detail"] for e in errors)
        for ws, _ in started:  # `started` goes out as the upstream is asked: its first delta says it was
            while (frame_in := await ws.receive_json(timeout=30))["type"] != "delta":
                assert frame_in["type"] != "done", frame_in
        assert len(fake_server.app.streams) == len(started)
        for ws, answer in started:
            await ws.send_str(orjson.dumps({"type": "stop", "message": answer["message"]}).decode())
        for ws, _ in started:
            while (frame_in := await ws.receive_json(timeout=30))["type"] != "done":
                pass
            assert frame_in["status"] == "stopped"
        for ws in sockets:
            await ws.close()
    await settled(database_url, "dave", len(started), len(errors))


async def settled(database_url: str, username: str, ran: int, refused: int) -> None:
    """Every stream settled, the refusals recorded, and the budget's figure is the sum of the rows."""
    deadline = time.monotonic() + 60
    while True:
        statuses = await asyncio.to_thread(rows, database_url, username)
        if not any(status == "streaming" for status, _, _ in statuses) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert sorted(status for status, _, _ in statuses) == ["refused"] * refused + ["stopped"] * ran
    total = sum(tokens for _, tokens, _ in statuses)
    assert 0 < total < ran * reservation_tokens(ENDLESS)
    line = await asyncio.to_thread(budget_line, database_url, username)
    assert f"spent $0, {total} tokens;" in line, line
    # The dashboard's daily summaries followed every start, refusal and settlement (chat/metering/summary_triggers.py).
    checked = await asyncio.to_thread(manage, database_url, "rollup", "--check")
    assert "The daily summaries match the usage rows" in checked, checked


# --- the command, the endpoint and the admin -----------------------------------------------------


def test_budget_command_sets_shows_and_clears(alice, settings):
    settings.BUDGET_DEFAULT_USD, settings.BUDGET_DEFAULT_TOKENS = Decimal("20"), 50_000
    Usage.objects.create(user=alice, model="m", status="complete", total_tokens=1200, cost=Decimal("1.25"))

    def run(*args) -> str:
        out = io.StringIO()
        call_command("budget", "alice", *args, stdout=out)
        return out.getvalue().strip().splitlines()[-1]

    assert run() == (
        f"alice (default budget, month from {month_start():%Y-%m-%d}): budget $20, 50000 tokens; "
        "spent $1.25, 1200 tokens; remaining $18.75, 48800 tokens"
    )
    # Setting one kind keeps the inherited other.
    assert run("--usd", "5.50").endswith(
        "budget $5.5, 50000 tokens; spent $1.25, 1200 tokens; remaining $4.25, 48800 tokens"
    )
    assert run("--tokens", "none").endswith("remaining $4.25, no token limit")
    assert "(user budget" in run()
    assert Budget.objects.get(user=alice).usd == Decimal("5.50")
    assert "(default budget" in run("--clear") and not Budget.objects.exists()
    for args, message in [
        (("--usd", "lots"), "--usd must be an amount of USD"),
        (("--usd", "-1"), "--usd must be 0 or more"),
        (("--usd", "1e30"), "--usd must be 0 or more, in whole cents, below"),  # was an InvalidOperation traceback
        (("--tokens", "9" * 20), "--tokens must be 0 or more and below 2\\*\\*63"),
        (("--tokens", "1.5"), "--tokens must be a whole number"),
        (("--clear", "--usd", "1"), "cannot be combined"),
    ]:
        with pytest.raises(CommandError, match=message):
            call_command("budget", "alice", *args)
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        call_command("budget", "nobody")


def test_budget_endpoint_shows_only_the_persons_own_month(alice, bob):
    Budget.objects.create(user=alice, usd=Decimal("10"))
    Usage.objects.create(user=alice, model="m", status="complete", total_tokens=10, cost=Decimal("8.5"))
    Usage.objects.create(user=bob, model="m", status="complete", total_tokens=99, cost=Decimal("3"))
    client = Client()
    assert client.get("/api/budget").status_code == 401
    client.force_login(alice)
    month = client.get("/api/budget").json()
    assert month["usd"] == {"limit": "10.00", "spent": "8.50000000", "remaining": "1.50000000", "share": 0.85}
    assert month["tokens"] == {"limit": None, "spent": 10, "remaining": None, "share": None}
    assert month["source"] == "user" and month["resets_on"] == f"{timezone.localdate(next_month_start()):%Y-%m-%d}"


def test_prices_and_budgets_in_the_admin(client, django_user_model, alice):
    client.force_login(django_user_model.objects.create_superuser("root", password="root-pw-123456"))
    Price.objects.create(model="gpt-x", prompt=1, completion=2)
    Budget.objects.create(user=alice, usd=Decimal("7"))
    Usage.objects.create(user=alice, model="m", status="refused", cost_source="unknown")
    assert b"gpt-x" in client.get("/admin/chat/price/?q=gpt").content
    assert client.get("/admin/chat/budget/").status_code == 200
    user_page = client.get(f"/admin/auth/user/{alice.pk}/change/").content
    assert b"Monthly budget" in user_page and b'value="7.00"' in user_page
    usage = client.get("/admin/chat/usage/?status__exact=refused&cost_source__exact=unknown")
    assert usage.status_code == 200 and b"refused (over budget)" in usage.content
    added = client.post(
        "/admin/chat/price/add/",
        {"model": "gpt-y", "prompt": "0.15", "completion": "0.60", "effective_from_0": "2026-01-01",
         "effective_from_1": "00:00:00"},
    )  # fmt: skip
    assert added.status_code == 302 and Price.objects.get(model="gpt-y").completion == Decimal("0.6")


@pytest.mark.parametrize("value", ["lots", "-1", "NaN"])
def test_a_bad_default_budget_stops_the_server_at_start(value):
    checked = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, "BUDGET_DEFAULT_USD": value},
        capture_output=True,
    )
    assert checked.returncode != 0 and b"BUDGET_DEFAULT_USD must be" in checked.stderr


def test_a_stream_its_upstream_did_not_price_is_priced_at_the_rate_it_last_reported():
    """api14 reports each answer's cost, but none for one it did not finish (stopped, cut): that one is priced at
    the USD per token it last reported for the model, flagged as estimated, so stopping every answer costs."""
    started = timezone.now()
    assert budgets.priced(7, "ds", started, {"total_tokens": 100})["cost_source"] == "unknown"  # nothing reported yet
    reported = budgets.priced(7, "ds", started, {"cost": Decimal("0.002"), "total_tokens": 1000})
    assert reported == {"cost": Decimal("0.002"), "cost_source": "reported", "cost_estimated": False}
    stopped = budgets.priced(7, "ds", started, {"prompt_tokens": 50, "completion_tokens": 200})
    assert stopped == {"cost": Decimal("0.0005"), "cost_source": "rate", "cost_estimated": True}
    assert budgets.priced(7, "other", started, {"total_tokens": 100})["cost"] is None  # another model's rate unknown
