"""Daily summaries (chat/metering/summary_triggers.py): equal to a GROUP BY of the usage rows, whatever wrote them"""

from __future__ import annotations

import asyncio
import importlib
import io
from dataclasses import asdict

import httpx
import pytest
from django.core.management import call_command
from django.test import override_settings

from chat.actions.orphans import recover_orphans
from chat.actions.turns import begin_turn
from chat.metering import dashboard, summary_triggers
from chat.metering.budgets import Budget
from chat.models import ApiToken, Message, PersonDay, PersonMonth, Usage, UsageDay
from chat.streaming.catalog import CatalogEntry
from tests.dashboard_data import MARCH, seed
from tests.live import Tab
from tests.metering.test_budgets import ENDLESS, I14, body, price, wait_until  # noqa: F401 (price: a fixture)
from tests.services import check_on_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_summaries_follow_streams_of_every_ending(server, alice, bob, providers, price, fake):  # noqa: F811
    """Completed, failed, stopped and refused on /v1 and the websocket, swept orphans, a deleted person."""
    token = ApiToken.issue(alice, "t")[1]
    headers = {"Authorization": f"Bearer {token}"}
    url = server.url + "/v1/chat/completions"
    assert httpx.post(url, json=body("[[chunks:3]]"), headers=headers, timeout=30).status_code == 200
    assert httpx.post(url, json=body("[[status:500]]"), headers=headers, timeout=30).status_code == 500
    with httpx.stream("POST", url, json=body(ENDLESS, stream=True), headers=headers, timeout=30) as held:
        pieces = held.iter_raw()  # kept: a dropped iterator closes the response
        next(pieces)
        assert Usage.objects.filter(status="streaming").exists()
        assert summary_triggers.mismatches() == []  # a running stream counts with its reservation's row as it stands
    assert wait_until(lambda: Usage.objects.filter(status="stopped").exists())

    async def chat():
        async with Tab(server, alice) as tab:
            await tab.send(type="send", conversation=None, content="[[chunks:4]]", model=I14)
            assert (await tab.until("done"))[-1]["status"] == "complete"
            await tab.send(type="send", conversation=None, content=ENDLESS, model=I14)
            started = (await tab.until("started"))[-1]
            await tab.until("delta")
            await tab.send(type="stop", message=started["message"])
            assert (await tab.until("done"))[-1]["status"] == "stopped"

    asyncio.run(chat())
    Budget.objects.create(user=bob, tokens=0)
    bobs = ApiToken.issue(bob, "t")[1]
    refused = httpx.post(url, json=body("hi"), headers={"Authorization": f"Bearer {bobs}"}, timeout=30)
    assert refused.status_code == 429
    # A stream whose process died: the sweep marks it interrupted, then prices it (two updates).
    turn = begin_turn(alice, CatalogEntry(providers["i14"], I14), {"max_tokens": 500}, content="hello there")
    Message.objects.filter(pk=turn.reply.pk).update(content="a partial answer")
    recover_orphans(None)
    statuses = sorted(Usage.objects.values_list("status", flat=True))
    assert statuses == ["complete", "complete", "failed", "interrupted", "refused", "stopped", "stopped"]
    assert Usage.objects.get(status="interrupted").cost > 0
    assert summary_triggers.mismatches() == []
    assert sum(UsageDay.objects.filter(model=I14, source="api").values_list("failed", flat=True)) == 1
    assert sum(PersonMonth.objects.filter(user=alice).values_list("requests", flat=True)) == 6
    bob_id = bob.pk
    bob.delete()  # his rows go with him, and his person rows
    assert summary_triggers.mismatches() == [] and not PersonDay.objects.filter(user_id=bob_id).exists()


def test_a_summary_that_went_wrong_is_found_and_rebuilt(alice):
    Usage.objects.create(user=alice, model="m", status="complete", prompt_tokens=10, cost=1)
    UsageDay.objects.update(requests=5)
    PersonMonth.objects.update(cost=0)
    assert len(summary_triggers.mismatches()) == 2
    Usage.objects.create(user=alice, model="m", status="complete", prompt_tokens=1)  # the same day, another shard
    out = io.StringIO()
    call_command("rollup", stdout=out)
    assert summary_triggers.mismatches() == []
    assert "1 days by model, 1 days by person" in out.getvalue()  # a day's shards count once


def figures(filters: dashboard.Filters, summaries: bool, monkeypatch) -> dict:
    with monkeypatch.context() as patch:
        if not summaries:
            patch.setattr(dashboard, "from_summaries", lambda filters: False)
        found = dashboard.figures(filters)
    return {**asdict(found), "people": sorted(found.people, key=lambda p: p["user_id"])}


def test_the_dashboard_gives_the_same_figures_from_the_summaries_as_from_the_rows(django_user_model, monkeypatch):
    seed()
    carol = django_user_model.objects.get(username="carol")
    periods = [
        MARCH,  # one whole month
        {"period": "custom", "from": "2026-02-28", "to": "2026-04-01"},  # a month and a day either side
        {"period": "custom", "from": "2026-03-02", "to": "2026-03-30"},  # days only
        {"period": "custom", "from": "2026-01-01", "to": "2026-12-31"},
    ]
    for query in [*periods, {**MARCH, "source": "api"}, {**MARCH, "model": "model-a"}]:
        filters = dashboard.parse_filters(query, carol)
        assert dashboard.from_summaries(filters)
        assert figures(filters, True, monkeypatch) == figures(filters, False, monkeypatch), query
    assert dashboard.figures(dashboard.parse_filters(periods[1], carol)).totals["requests"] == 9


def test_another_time_zone_reads_the_rows_until_rollup_recounts_the_days(django_user_model):
    """Rows stored under UTC; in New York the 1 April 00:00 UTC row falls on 31 March."""
    seed()
    carol = django_user_model.objects.get(username="carol")
    try:
        with override_settings(TIME_ZONE="America/New_York"):
            filters = dashboard.parse_filters(MARCH, carol)
            assert not dashboard.from_summaries(filters)  # counted in UTC: the rows answer
            from_rows = dashboard.figures(filters)
            call_command("rollup")
            assert summary_triggers.installed_zone() == "America/New_York" and dashboard.from_summaries(filters)
            assert summary_triggers.mismatches() == []
            assert dashboard.figures(filters).totals == from_rows.totals
            assert from_rows.cost_series["model-b"][30] == pytest.approx(9.0)
            assert dashboard.figures(filters).cost_series == from_rows.cost_series
    finally:
        call_command("rollup")  # back to the tests' zone for the tests after this one
    assert summary_triggers.installed_zone() == "UTC"


def test_migrate_makes_triggers_a_table_copy_lost_again(alice):
    """SQLite alters a table by copying it, leaving its triggers behind: the next migrate puts them back."""
    summary_triggers.uninstall()
    assert summary_triggers.installed_zone() is None
    Usage.objects.create(user=alice, model="m", status="complete", prompt_tokens=10)
    assert summary_triggers.mismatches() != []
    call_command("migrate", verbosity=0)
    assert summary_triggers.installed_zone() == "UTC" and summary_triggers.mismatches() == []


def test_the_migration_takes_the_estimate_off_refused_rows_and_their_summaries(alice):
    """Refused rows once kept the request's estimated prompt tokens, which the dashboard counted as tokens in."""
    from django.apps import apps

    zero = importlib.import_module("chat.migrations.0030_refused_rows_without_tokens").zero_refused_tokens
    Usage.objects.create(user=alice, model="m", status="refused", prompt_tokens=900, total_tokens=900)
    Usage.objects.create(user=alice, model="m", status="complete", prompt_tokens=10, total_tokens=15)
    zero(apps, None)
    assert sorted(Usage.objects.values_list("status", "prompt_tokens")) == [("complete", 10), ("refused", 0)]
    assert summary_triggers.mismatches() == []
    days = UsageDay.objects.filter(model="m")  # spread over shards
    assert (sum(d.requests for d in days), sum(d.prompt_tokens for d in days)) == (2, 10)


def check_every_kind_of_update() -> None:
    """Updates that keep a row's day and keys (one update a summary) and updates that move them, then a delete."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model

    person = get_user_model().objects.create_user("updates")
    token = ApiToken.issue(person, "t")[0]
    row = Usage.objects.create(user=person, token=token, model="m", source="api", prompt_tokens=10)
    bare = Usage.objects.create(user=person, model="m", source="chat", prompt_tokens=3)
    steps = [
        (row, {"status": "complete", "completion_tokens": 7, "total_tokens": 17, "cost": 2, "ttft_ms": 50}),
        (bare, {"status": "stopped", "completion_tokens": 1, "total_tokens": 4, "tokens_per_second": 9.5}),
        (row, {"cost": 3}),  # priced later
        (row, {"model": "n"}),
        (row, {"started": row.started - timedelta(days=40)}),  # another day and month
        (bare, {"source": "api", "status": "failed"}),
    ]
    for changed, fields in steps:
        Usage.objects.filter(pk=changed.pk).update(**fields)
        assert summary_triggers.mismatches() == [], fields
    token.delete()  # the row's token_id set to NULL: out of the token's summary
    assert summary_triggers.mismatches() == []
    Usage.objects.filter(pk=row.pk).delete()
    assert summary_triggers.mismatches() == []
    month = PersonMonth.objects.get(user=person, day=bare.started.date().replace(day=1), source="api")
    assert (month.requests, month.budget_tokens) == (1, 4)


def test_every_kind_of_update_keeps_the_summaries_exact_on_sqlite(transactional_db):
    check_every_kind_of_update()


@pytest.mark.cluster
def test_every_kind_of_update_keeps_the_summaries_exact_on_postgresql():
    check_on_postgresql("chat_updates", "tests.metering.test_rollups", "check_every_kind_of_update")
