"""Tool calls in Chromium: shown live inside the answer, results as text, Approve and Deny, and after a reload."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from chat.models import McpTool
from tests import page_helpers
from tests.page_helpers import last_reply, send, wait_done

pytestmark = pytest.mark.django_db(transaction=True)
expect.set_options(timeout=15_000)


@pytest.fixture
def tools_page(new_page, alice, team, tools_server, tool_providers):
    team.user_set.add(alice)
    McpTool.objects.filter(server=tools_server, name="echo").update(asks_first=True)
    page = new_page(alice)
    page_helpers.open_chat(page)
    page_helpers.choose_model(page, "infyrence/claude-sonnet-5")
    return page


def test_calls_show_live_with_results_as_text_and_wait_for_approval(tools_page):
    page = tools_page
    expect(page.locator("#tools-button")).to_be_visible()
    # The menu says what each tool does and which ask first, in words a phone shows (no hover).
    page.locator("#tools-button").click()
    echo = page.locator("#tools-panel label").filter(has=page.locator('input[value="tests__echo"]'))
    expect(echo.locator(".tools-description")).to_have_text("Says the text back, with a prefix.")
    expect(echo.locator(".tools-asks")).to_have_text("asks first")
    adder = page.locator("#tools-panel label").filter(has=page.locator('input[value="tests__add"]'))
    expect(adder.locator(".tools-description")).to_have_text("Adds two integers.")
    expect(adder.locator(".tools-asks")).to_have_count(0)
    page.locator("#tools-button").click()
    reply = send(page, '[[call:tests.hostile {}]] [[call:tests.echo {"text": "hi"}]] use the tools')
    runs = reply.locator("details.tool-run")
    waiting = runs.and_(page.locator('[data-status="waiting"]'))
    expect(waiting).to_have_count(1)
    expect(waiting.locator(".tool-name")).to_have_text("echo · tests")
    hostile = runs.and_(page.locator('[data-status="ok"]'))
    expect(hostile).to_have_count(1)  # it ran at once, beside the one that waits
    hostile.locator("summary").click()
    expect(hostile.locator(".tool-result")).to_contain_text("<script>window.__pwned=1</script>")
    assert hostile.locator(".tool-result img, .tool-result script, .tool-result b").count() == 0
    waiting.get_by_role("button", name="Approve").click()
    wait_done(reply)
    expect(runs.and_(page.locator('[data-status="ok"]'))).to_have_count(2)
    expect(reply.locator(".answer")).to_contain_text("Tool results:")
    assert page.evaluate("window.__pwned") is None
    page.reload()  # stored with the answer
    runs = last_reply(page).locator("details.tool-run")
    expect(runs).to_have_count(2)
    expect(runs.nth(1).locator(".tool-result")).to_have_text("echo: hi")


def test_a_denied_call_says_so_and_the_model_hears_it(tools_page):
    page = tools_page
    reply = send(page, '[[call:tests.echo {"text": "no"}]] try')
    waiting = reply.locator('details.tool-run[data-status="waiting"]')
    expect(waiting).to_have_count(1)
    waiting.get_by_role("button", name="Deny").click()
    wait_done(reply)
    expect(reply.locator('details.tool-run[data-status="denied"] .tool-status')).to_have_text("Denied")
    expect(reply.locator(".answer")).to_contain_text("[tool call denied]")


def test_a_reload_during_a_call_shows_it_and_stop_cancels_a_running_one(tools_page):
    page = tools_page
    reply = send(page, '[[call:tests.echo {"text": "later"}]] [[call:tests.hang {}]] wait')
    expect(reply.locator('details.tool-run[data-status="waiting"]')).to_have_count(1)
    expect(reply.locator('details.tool-run[data-status="running"] .tool-elapsed')).to_have_text(re.compile(r"^\d+ s$"))
    page.reload()  # the calls so far come back with the answer and its snapshot
    expect(page.locator("html")).to_have_attribute("data-socket", "open")
    reply = last_reply(page)
    waiting = reply.locator('details.tool-run[data-status="waiting"]')
    expect(waiting).to_have_count(1)
    expect(reply.locator('details.tool-run[data-status="running"]')).to_have_count(1)
    waiting.get_by_role("button", name="Approve").click()
    expect(reply.locator('details.tool-run[data-status="ok"]')).to_have_count(1)
    page.get_by_role("button", name="Stop").click()
    wait_done(reply, "stopped")
    expect(reply.locator('details.tool-run[data-status="cancelled"]')).to_have_count(1)
    expect(reply.locator("details.tool-call")).to_have_count(0)  # the model's calls, shown once: in the round


def test_a_call_that_waits_or_runs_is_not_taken_for_a_silent_model(tools_page):
    page = tools_page
    # The model thinks first: the page then says it is silent after 4 s without data, not 10.
    reply = send(page, '[[reasoning:3]] [[call:tests.echo {"text": "later"}]] [[call:tests.hang {}]] wait')
    expect(reply.locator(".thinking")).not_to_be_empty()
    expect(reply.locator('details.tool-run[data-status="waiting"]')).to_have_count(1)
    # Past the page's 4 s of silence before "Waiting for the model… nothing for N s", counted by the call's clock.
    elapsed = reply.locator('details.tool-run[data-status="running"] .tool-elapsed')
    expect(elapsed).to_have_text(re.compile(r"^([6-9]|\d\d+) s$"), timeout=30_000)
    expect(reply.locator(".message-waiting")).to_be_hidden()
    page.get_by_role("button", name="Stop").click()
    wait_done(reply, "stopped")


def test_the_settings_page_sets_the_tools_a_new_chat_starts_with(new_page, alice, team, tools_server, tool_providers):
    from chat.models import ChatDefaults

    team.user_set.add(alice)
    page = new_page(alice)
    page.goto("/settings/")
    echo = page.get_by_label("tests: echo")
    expect(echo).to_be_checked()  # no default set: every tool
    expect(page.locator("#defaults-save")).to_be_enabled()
    echo.uncheck()
    page.locator("#defaults-save").click()
    expect(page.locator("#defaults-status")).to_have_text("Saved.")
    chosen = ChatDefaults.objects.get(user=alice).tools
    assert "tests__echo" not in chosen and "tests__add" in chosen
    page_helpers.open_chat(page)  # a new chat's menu starts from it
    page.locator("#tools-button").click()
    expect(page.locator('#tools-panel input[value="tests__echo"]')).not_to_be_checked()
    expect(page.locator('#tools-panel input[value="tests__add"]')).to_be_checked()


def test_past_the_round_limit_the_call_never_asked_leaves_no_box_saying_asking(tools_page, settings):
    """The last round's calls, written by the model but never run (the turn's rounds were used up), went on
    showing "Asking…" in the finished answer."""
    page = tools_page
    reply = send(page, '[[rounds:7]] [[call:tests.add {"a": 1, "b": 2}]] add')  # add runs at once
    wait_done(reply)
    runs = reply.locator("details.tool-run")
    expect(runs).to_have_count(settings.MCP_MAX_ROUNDS)
    expect(reply.locator('details.tool-run[data-status="streaming"]')).to_have_count(0)
    expect(reply.locator(".message-error")).to_contain_text(f"{settings.MCP_MAX_ROUNDS} rounds")


def test_unticking_a_tool_keeps_a_down_servers_tools_on(tools_page, team):
    """Making "every tool" a list of names left out a server that was down then, for good: back up, its tools
    stayed off in that conversation and a call to one was "not available"."""
    from chat.models import Conversation, McpServer

    down = McpServer.objects.create(name="later", url="http://127.0.0.1:9/mcp", health="down",
                                    tools=[{"name": "ping", "input_schema": {"type": "object"}}])  # fmt: skip
    down.groups.add(team)
    page = tools_page
    page.reload()
    page.locator("#tools-button").click()
    page.locator('#tools-panel input[value="tests__add"]').uncheck()
    page.locator("#tools-button").click()
    wait_done(send(page, "[[echo]] hello"))
    chosen = Conversation.objects.get().tools
    assert "tests__add" not in chosen and "later__ping" in chosen and "tests__echo" in chosen, chosen
