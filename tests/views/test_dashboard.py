"""The usage dashboard (/usage/) on the real server: figures against hand-computed totals, CSV, who sees what."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from datetime import UTC, date, datetime
from decimal import Decimal

import httpx
import pytest
from django.test import override_settings

from chat.metering import dashboard, percentiles
from tests.conftest import session_cookie
from tests.dashboard_data import MARCH, MODELS, PASSWORDS, PEOPLE, TOTALS, seed
from tests.live import ROOT, LiveServer
from tests.services import postgres_database

DATA = re.compile(r'<script id="usage-data" type="application/json">(.*?)</script>', re.S)


@pytest.fixture
def team(transactional_db):
    return seed()


def get(server, cookie: str, path: str, **params) -> httpx.Response:
    return httpx.get(server.url + path, params=params, cookies={"sessionid": cookie}, timeout=60)


def figures(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return json.loads(DATA.search(response.text).group(1))


def check_march(data: dict, percentiles: bool = True) -> None:
    """Every figure of the page for March against the hand-computed ones."""
    totals = data["totals"]
    assert {k: totals[k] for k in TOTALS if k != "cost"} == {k: v for k, v in TOTALS.items() if k != "cost"}
    assert Decimal(totals["cost"]) == TOTALS["cost"]
    people = {p["username"]: p for p in data["people"]}
    assert set(people) == set(PEOPLE)
    for name, (requests, prompt, completion, reasoning, cost, last) in PEOPLE.items():
        person = people[name]
        assert (person["requests"], person["prompt_tokens"], person["completion_tokens"]) == (
            requests,
            prompt,
            completion,
        )
        assert person["reasoning_tokens"] == reasoning and Decimal(person["cost"]) == cost
        assert person["last_active"].replace("Z", "+00:00") == last
    assert [p["username"] for p in data["people"]] == ["bob", "alice", "carol"]  # by cost, highest first
    assert [m["model"] for m in data["models"]] == ["model-b", "model-a"]
    for row in data["models"]:
        requests, tokens, cost, p50, p95, tps, stopped, interrupted, failed = MODELS[row["model"]]
        assert (row["requests"], row["tokens"], Decimal(row["cost"])) == (requests, tokens, cost)
        assert (row["stopped_share"], row["interrupted_share"], row["failed_share"]) == (stopped, interrupted, failed)
        if percentiles:
            assert (row["ttft_p50"], row["ttft_p95"], row["tps_p50"]) == pytest.approx((p50, p95, tps))
    assert len(data["days"]) == 31 and data["days"][0] == "2026-03-01"
    assert data["cost"]["model-a"][0] == pytest.approx(0.75) and data["cost"]["model-a"][1] == pytest.approx(1.0)
    assert data["cost"]["model-a"][30] == pytest.approx(0.125) and sum(data["cost"]["model-b"]) == pytest.approx(2.0625)
    assert data["tokens"]["model-a"][0] == 450 and data["tokens"]["model-b"][1] == 1500


def test_staff_see_everyones_figures_as_computed_by_hand(server, team, django_user_model):
    carol = django_user_model.objects.get(username="carol")
    response = get(server, session_cookie(carol), "/usage/", **MARCH)
    check_march(figures(response))
    page = response.text
    assert "Cost per day by model" in page and 'id="people-table"' in page
    assert "$3.94" in page and "2,060" in page  # the totals as shown
    assert "Traceback" not in server.output()


def test_filters_by_source_group_person_and_model(server, team, django_user_model):
    cookie = session_cookie(django_user_model.objects.get(username="carol"))
    api = figures(get(server, cookie, "/usage/", source="api", **MARCH))["totals"]
    assert (api["requests"], Decimal(api["cost"]), api["people"]) == (2, Decimal("2.5"), 2)
    group = django_user_model.objects.get(username="bob").groups.get().pk
    research = figures(get(server, cookie, "/usage/", group=group, **MARCH))
    assert [p["username"] for p in research["people"]] == ["bob"] and Decimal(research["totals"]["cost"]) == 3
    alice = figures(get(server, cookie, "/usage/", user=team["alice"], model="model-a", **MARCH))["totals"]
    assert (alice["requests"], alice["prompt_tokens"], Decimal(alice["cost"])) == (3, 310, Decimal("0.875"))


def test_someone_not_staff_sees_only_their_own_figures(server, team, django_user_model):
    alice = django_user_model.objects.get(username="alice")
    cookie = session_cookie(alice)
    data = figures(get(server, cookie, "/usage/", **MARCH))
    assert [p["username"] for p in data["people"]] == ["alice"]
    assert (data["totals"]["requests"], Decimal(data["totals"]["cost"]), data["totals"]["people"]) == (
        3,
        Decimal("0.875"),
        1,
    )
    assert "bob" not in get(server, cookie, "/usage/", **MARCH).text  # not even in a filter's choices
    for params in ({"user": team["bob"]}, {"group": 1}):
        refused = get(server, cookie, "/usage/", **params, **MARCH)
        assert refused.status_code == 403 and "You can only see your own usage." in refused.text
        assert get(server, cookie, "/usage/csv", **params, **MARCH).status_code == 403
    assert figures(get(server, cookie, "/usage/", user=team["alice"], **MARCH))["totals"]["requests"] == 3


def test_staff_without_the_permission_to_view_usage_see_only_their_own(server, team, django_user_model):
    """is_staff alone (staff given, say, only the providers) is not the team's figures: the permission is."""
    dana = django_user_model.objects.create_user("dana", password="dana-secret-pw", is_staff=True)
    cookie = session_cookie(dana)
    page = get(server, cookie, "/usage/", **MARCH)
    assert figures(page)["people"] == [] and "bob" not in page.text and "<h1>My usage</h1>" in page.text
    assert get(server, cookie, "/usage/", user=team["bob"], **MARCH).status_code == 403
    assert get(server, cookie, "/usage/csv", group=1, **MARCH).status_code == 403
    assert '">My usage</a>' in get(server, cookie, "/").text


def test_the_period_is_written_out_in_the_pages_language(server, team, django_user_model):
    cookie = session_cookie(django_user_model.objects.get(username="alice"))
    english = get(server, cookie, "/usage/", **MARCH).text
    assert '<p class="usage-period">1 March 2026 – 31 March 2026</p>' in english
    french = httpx.get(server.url + "/usage/", params=MARCH, cookies={"sessionid": cookie, "django_language": "fr"},
                       timeout=60).text  # fmt: skip
    assert '<p class="usage-period">1 mars 2026 – 31 mars 2026</p>' in french  # not "1 Mar", nor "1 Déc"


def test_bad_filters_get_a_sentence(server, team, django_user_model):
    cookie = session_cookie(django_user_model.objects.get(username="carol"))
    cases = {
        ("custom", "2026-03-31", "2026-03-01"): "The range starts after it ends",
        ("custom", "March", "2026-03-01"): "Give the first day of the custom range as YYYY-MM-DD.",
        ("weekly", "", ""): "There is no period called weekly",
        # The day after the last one is past what a date can hold (it was a 500, and a CSV that never ended).
        ("custom", "9999-12-31", "9999-12-31"): "must be between 1900-01-01 and 9998-12-31",
        ("custom", "0001-01-01", "0001-01-02"): "must be between 1900-01-01 and 9998-12-31",
    }
    for (period, first, last), sentence in cases.items():
        for path in ("/usage/", "/usage/csv"):
            response = get(server, cookie, path, period=period, **{"from": first, "to": last})
            assert response.status_code == 400 and sentence in response.text, (path, first)
    fax = get(server, cookie, "/usage/", source="fax")
    assert fax.status_code == 400 and "choose chat, api or titl (the titles models wrote)." in fax.text
    assert "<title>Usage · Team chat</title>" in fax.text  # staff's page, not "My usage", with the sentence
    assert get(server, "", "/usage/").status_code == 302  # sign in first


def test_csv_has_the_rows_behind_the_filters(server, team, django_user_model):
    carol = session_cookie(django_user_model.objects.get(username="carol"))
    response = get(server, carol, "/usage/csv", source="api", **MARCH)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    assert 'filename="usage-2026-03-01-to-2026-03-31.csv"' in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [(r["user"], r["model"], r["cost_usd"], r["prompt_tokens"]) for r in rows] == [
        ("alice", "model-a", "0.50000000", "200"),
        ("bob", "model-b", "2.00000000", "1000"),
    ]
    assert rows[0]["started"] == "2026-03-01T12:00:00+00:00" and rows[0]["status"] == "stopped"
    alice = session_cookie(django_user_model.objects.get(username="alice"))
    mine = list(csv.DictReader(io.StringIO(get(server, alice, "/usage/csv", **MARCH).text)))
    assert [r["user"] for r in mine] == ["alice"] * 3 and mine[-1]["ttft_ms"] == "" and mine[-1]["estimated"] == "0"


def test_a_model_with_no_price_says_so_rather_than_costing_nothing(team, django_user_model):
    from django.test import Client

    from chat.models import Price, Usage

    alice, carol = (django_user_model.objects.get(username=name) for name in ("alice", "carol"))
    march = datetime(2026, 3, 5, tzinfo=UTC)
    for model in ("model-free", "model-unpriced"):
        Usage.objects.create(user=alice, source="chat", model=model, started=march, prompt_tokens=5, cost=None)
    Price.objects.create(model="model-free", prompt=0, completion=0, effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    for viewer, admin_hint in ((carol, True), (alice, False)):
        client = Client()
        client.force_login(viewer)
        page = client.get("/usage/", MARCH).content.decode()
        row = {
            m: page.split(f'data-model="{m}"')[1].split("</tr>")[0] for m in ("model-free", "model-unpriced", "model-a")
        }
        assert ">no price<" in row["model-unpriced"]
        assert "no price" not in row["model-free"] and "no price" not in row["model-a"]  # a price of 0, a cost
        assert 'id="unpriced-note"' in page and ("Chat → Prices" in page) == admin_hint
    Price.objects.create(
        model="model-unpriced", prompt=1, completion=1, effective_from=datetime(2026, 1, 1, tzinfo=UTC)
    )
    client = Client()
    client.force_login(carol)
    assert 'id="unpriced-note"' not in client.get("/usage/", MARCH).content.decode()


def test_csv_cells_never_start_a_spreadsheet_formula():
    assert dashboard.csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert dashboard.csv_cell("@model") == "'@model" and dashboard.csv_cell("model-a") == "model-a"
    assert dashboard.csv_cell(None) == "" and dashboard.csv_cell(-3) == "-3"


def test_presets_cover_the_right_days():
    today = date(2026, 3, 15)
    assert dashboard.preset_range("month", today) == (date(2026, 3, 1), today)
    assert dashboard.preset_range("last-month", today) == (date(2026, 2, 1), date(2026, 2, 28))
    assert dashboard.preset_range("7d", today) == (date(2026, 3, 9), today)
    assert dashboard.preset_range("30d", today) == (date(2026, 2, 14), today)
    assert dashboard.preset_range("year", today) == (date(2026, 1, 1), today)


def test_budget_share_is_the_period_spend_over_each_persons_budget(team, django_user_model):
    """Alice's own USD budget; bob's group's token budget; carol has none (no default set): an empty cell."""
    from django.contrib.auth.models import Group

    from chat.metering.budgets import Budget

    Budget.objects.create(user_id=team["alice"], usd=Decimal("3.50"))
    Budget.objects.create(group=Group.objects.get(name="research"), tokens=10200)
    carol = django_user_model.objects.get(username="carol")
    people = dashboard.figures(dashboard.parse_filters(MARCH, carol)).people
    shares = {person["username"]: person["budget_share"] for person in people}
    assert shares == {"alice": pytest.approx(0.875 / 3.5), "bob": pytest.approx((1700 + 850) / 10200), "carol": None}


def test_sqlite_percentiles_by_rank_give_the_hand_computed_figures(team, django_user_model):
    """SQLite has no percentile_cont: the rows ranked by a window function give the same figures."""
    rows = dashboard.usage_rows(dashboard.parse_filters(MARCH, django_user_model.objects.get(username="carol")))
    counts = {"model-a": {"ttft_ms": 4, "tokens_per_second": 4}, "model-b": {"ttft_ms": 2, "tokens_per_second": 2}}
    expected = {model: dict(zip(percentiles.PERCENTILES, MODELS[model][3:6], strict=True)) for model in counts}
    found = percentiles.percentiles_by_rank(rows, counts)
    for model in counts:
        assert found[model] == pytest.approx(expected[model]), model


def percentile_cont(values: list[float], fraction: float) -> float:
    values = sorted(values)
    position = fraction * (len(values) - 1)
    below = int(position)
    above = values[min(below + 1, len(values) - 1)]
    return values[below] + (above - values[below]) * (position - below)


@pytest.mark.parametrize(("least", "rate"), [(10, 16), (40, 4)])
def test_a_model_with_many_values_has_the_percentiles_of_a_sample(team, django_user_model, monkeypatch, least, rate):
    """The sparsest sample (ids a multiple of 16, else of 4) keeping MIN_SAMPLE values answers; model-b stays exact."""
    from chat.models import Usage

    alice = team["alice"]
    Usage.objects.bulk_create(
        Usage(
            user_id=alice,
            model="model-a",
            started=datetime(2026, 3, 20, tzinfo=UTC),
            status="complete",
            ttft_ms=(n * 37) % 1000,
            tokens_per_second=float(n % 50),
        )
        for n in range(200)
    )
    monkeypatch.setattr(percentiles, "MIN_SAMPLE", least)  # model-a has 204 values, model-b 2
    assert percentiles.sample_rate(204) == rate and percentiles.sample_rate(2) == 1
    carol = django_user_model.objects.get(username="carol")
    models = {m["model"]: m for m in dashboard.figures(dashboard.parse_filters(MARCH, carol)).models}
    rows = Usage.objects.filter(model="model-a", started__month=3, ttft_ms__isnull=False)
    sample = [(t, s) for pk, t, s in rows.values_list("pk", "ttft_ms", "tokens_per_second") if pk % rate == 0]
    assert len(sample) >= least
    expected = [
        percentile_cont([t for t, _ in sample], 0.5),
        percentile_cont([t for t, _ in sample], 0.95),
        percentile_cont([s for _, s in sample], 0.5),
    ]
    assert [models["model-a"][name] for name in percentiles.PERCENTILES] == pytest.approx(expected)
    assert [models["model-b"][name] for name in percentiles.PERCENTILES] == pytest.approx(MODELS["model-b"][3:6])


@override_settings(TIME_ZONE="America/New_York")
def test_days_are_counted_in_the_configured_time_zone(team, django_user_model):
    """2026-03-01 10:00 UTC is 05:00 in New York, the same day; 03-31 23:59:59 UTC is still the 31st there."""
    carol = django_user_model.objects.get(username="carol")
    filters = dashboard.parse_filters({"period": "custom", "from": "2026-02-28", "to": "2026-03-31"}, carol)
    found = dashboard.figures(filters)
    # In New York the 28 February row (23:59:59 UTC = 18:59:59) is in range, and April's (20:00 on 31 March) too.
    assert found.totals["requests"] == 9
    by_day = dict(zip(found.days, found.cost_series["model-b"], strict=True))
    assert by_day["2026-03-31"] == pytest.approx(9.0)  # 04-01 00:00 UTC drawn on 31 March


@pytest.mark.slow
def test_percentiles_on_postgresql(fake_server):
    """percentile_cont on PostgreSQL gives the hand-computed figures, as the SQLite fallback does above."""
    with postgres_database("chat_dashboard", migrated=True) as database_url:
        env = {"DATABASE_URL": database_url}
        setup = {**os.environ, **env}
        for command in (["migrate", "--noinput"], ["shell", "-c", "from tests.dashboard_data import seed; seed()"]):
            subprocess.run(
                [sys.executable, "manage.py", *command], cwd=ROOT, env=setup, check=True, capture_output=True
            )
        with LiveServer(env) as live, httpx.Client(base_url=live.url, timeout=60) as browser:
            browser.get("/accounts/login/")
            form = {
                "username": "carol",
                "password": PASSWORDS["carol"],
                "csrfmiddlewaretoken": browser.cookies["csrftoken"],
            }
            assert browser.post("/accounts/login/", data=form).status_code == 302
            check_march(figures(browser.get("/usage/", params=MARCH)))
            assert "Traceback" not in live.output()


def test_the_sidebar_links_to_the_dashboard(server, team, django_user_model):
    for name, label in (("carol", ">Usage</a>"), ("alice", ">My usage</a>")):
        page = get(server, session_cookie(django_user_model.objects.get(username=name)), "/").text
        assert 'href="/usage/" id="usage-link"' + label in page


# --- in a real browser (kept last: Playwright's sync API marks this thread's event loop as running) ---


def busy_month(users: dict[str, int]) -> None:
    """A month of varied usage for the screenshots (May 2026: nothing else is there): four models, five people."""
    from django.contrib.auth import get_user_model

    from chat.models import Usage

    models = {
        "gpt-5-mini": "0.0006",
        "claude-sonnet-5": "0.004",
        "nemotron3-super-120B": "0.0012",
        "llama-4-scout": "0.0003",
    }
    names = ["alice", "bob", "carol", "dave", "erin"]
    for name in names[3:]:
        users[name] = get_user_model().objects.create_user(name).pk
    rows = []
    for day in range(1, 32):
        for n, (model, price) in enumerate(models.items()):
            for k in range((day * (n + 2) + n) % 4 + 1):  # a varied but fixed number of streams
                prompt, completion = 300 + 97 * ((day + k) % 9), 150 + 61 * ((day * k + n) % 11)
                rows.append(
                    Usage(
                        user_id=users[names[(day + k + n) % len(names)]],
                        source="api" if k % 3 == 2 else "chat",
                        model=model,
                        started=datetime(2026, 5, day, 8 + k, 15 * n, tzinfo=UTC),
                        prompt_tokens=prompt,
                        completion_tokens=completion,
                        reasoning_tokens=completion // 3 if n == 2 else 0,
                        total_tokens=prompt + completion,
                        cost=Decimal(price) * (prompt + completion) / 10,
                        ttft_ms=200 + 150 * n + 37 * k,
                        tokens_per_second=40.0 + 10 * n - k,
                        status=["complete", "complete", "complete", "stopped", "failed"][(day + k) % 5],
                    )
                )
    Usage.objects.bulk_create(rows)
    from chat.metering.budgets import Budget

    Budget.objects.create(user_id=users["alice"], usd=Decimal("25.00"))
    Budget.objects.create(user_id=users["bob"], tokens=100_000)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_dashboard_in_a_browser_light_and_dark(browser, server, team, scheme, django_user_model):
    """The charts are drawn, the tables sort by a click, and a screenshot goes to test-artifacts/screenshots/."""
    from playwright.sync_api import expect

    from tests.page_helpers import SCREENSHOTS, sign_in

    busy_month(team)
    context = browser.new_context(base_url=server.url, color_scheme=scheme, viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    try:
        sign_in(context, django_user_model.objects.get(username="carol"), server.url)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.goto("/usage/?period=custom&from=2026-05-01&to=2026-05-31")
        expect(page.locator("html")).to_have_attribute("data-charts", "drawn")
        expect(page.locator("#custom-range")).to_be_visible()
        page.get_by_label("Period").select_option("month")
        expect(page.locator("#custom-range")).to_be_hidden()
        page.get_by_label("Period").select_option("custom")
        for canvas in ("#cost-chart", "#tokens-chart"):  # something drawn: not every pixel the same
            drawn = page.locator(canvas).evaluate(
                """c => { const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                          return new Set(Array.from(d.filter((_, i) => i % 4 === 0))).size; }"""
            )
            assert drawn > 10
        people = page.locator("#people-table tbody tr td:first-child")
        expect(people).to_have_count(5)
        # Rows drawn by usage.js from the page's JSON, formatted as the template formats the other tables.
        first = page.locator("#people-table tbody tr").first
        user = first.get_attribute("data-user")
        expect(first.locator("td a")).to_have_attribute("href", re.compile(rf"[?&]user={user}(&|$)"))
        expect(first.locator("td").nth(5)).to_have_text(re.compile(r"^\$\d[\d,]*\.\d{4}$"))
        expect(first.locator("td").nth(1)).to_have_text(re.compile(r"^\d[\d,]*$"))
        header = page.locator("#people-table th").filter(has_text="Person")
        header.get_by_role("button").click()
        expect(header).to_have_attribute("aria-sort", "descending")
        expect(people).to_have_text(["erin", "dave", "carol", "bob", "alice"])
        header.get_by_role("button").click()
        expect(people).to_have_text(["alice", "bob", "carol", "dave", "erin"])
        requests = page.locator("#people-table tbody tr td:nth-child(2)")
        page.locator("#people-table th").filter(has_text="Requests").get_by_role("button").click()
        counts = [int(text.replace(",", "")) for text in requests.all_text_contents()]
        assert counts == sorted(counts, reverse=True)
        expect(page.locator("#models-table tbody tr")).to_have_count(4)
        expect(page.locator("body")).not_to_contain_text("Traceback")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"usage-{scheme}.png"
        page.screenshot(path=str(path), full_page=True, animations="disabled")
    finally:
        context.close()
    assert not errors, errors


def test_a_total_under_a_dollar_is_not_shown_as_nothing():
    """The headline's whole cents would show $0.0015 of spending as "$0.00" beside rows of "$0.0013"."""
    from chat.templatetags.usage_format import usd

    assert usd(Decimal("0.00152513"), 2) == "$0.0015" and usd(Decimal("3.944"), 2) == "$3.94"
    assert usd(Decimal("0"), 2) == "$0.00" and usd(Decimal("1234.5"), 2) == "$1,234.50"
    assert usd(Decimal("0.00152513")) == "$0.0015"
