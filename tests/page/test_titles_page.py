"""Titles in a real Chromium (chat/actions/titles.py): one title per conversation, set by its person or after
its first answer, the same on the page, in the sidebar, on a share link and in an export whichever branch is
shown; and the demo upstream's canned answer never becomes a title.
"""

from __future__ import annotations

import json
import re

from django.db import connection
from playwright.sync_api import expect

from chat.actions import exports
from chat.actions.shares import create_share
from chat.models import Conversation, Usage
from tests.live import LiveServer, database_url
from tests.page_helpers import CLAUDE, open_chat, send, wait_done

expect.set_options(timeout=20_000)

ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"
WRITTEN = re.compile(r"^Hi! This reply comes from the demo upstream \(i14, model")


def test_editing_the_first_message_keeps_the_title_on_every_branch_share_and_export(new_page, alice, providers):
    env = {"DATABASE_URL": database_url(connection.settings_dict), "CHAT_TITLES": "1", ASYNC_UNSAFE: ""}
    with LiveServer(env) as live:
        page = new_page(alice, url=live.url)
        open_chat(page)
        wait_done(send(page, "[[chunks:2]] Plan a trip to Lyon"))
        title = page.locator("#chat-title")
        expect(title).to_have_text(WRITTEN)  # written by the (fake) model after the first answer
        written = title.inner_text()
        # Another model answers the edited first message: its title request would name it (infyrence).
        page.get_by_label("Model", exact=True).select_option(CLAUDE)
        first = page.locator("article.message.user").first
        first.get_by_role("button", name="Edit").click()
        page.get_by_label("Edit message").fill("[[echo]] Plan a trip to Grenoble instead")
        page.get_by_label("Edit message").press("Enter")
        wait_done(page.locator("article.message.assistant").first)
        expect(first.locator(".branch-position")).to_have_text("2 / 2")
        # Back to the first version and forth again: the one title all along.
        first.get_by_role("button", name="Previous version").click()
        expect(first.locator(".branch-position")).to_have_text("1 / 2")
        first.get_by_role("button", name="Next version").click()
        expect(first.locator(".branch-position")).to_have_text("2 / 2")
        conversation = Conversation.objects.get(owner=alice)
        page.reload()
        expect(title).to_have_text(written)
        expect(page.locator("#conversation-list li .conversation-title")).to_have_text([written])
        assert Usage.objects.filter(source=Usage.Source.TITLE).count() == 1  # no second title asked for
        conversation.refresh_from_db()
        assert conversation.title == written
        # The share link and the exports carry the same title.
        share = create_share(conversation, live=False, public=False, show_usage=False)
        page.goto(f"/s/{share.token}/")
        expect(page.get_by_role("heading", level=1)).to_have_text(written)
        exported = page.request.get(f"/api/conversations/{conversation.pk}/export?format=json")
        assert json.loads(exported.body())["conversations"][0]["title"] == written
        assert exports.markdown(conversation).startswith(f"# {written}")


def test_demo_mode_titles_a_chat_by_its_first_message_not_the_canned_answer(new_page, alice):
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "DEMO_UPSTREAM": "1",
        "UPSTREAM_BASE_URL": "",
        "CHAT_TITLES": "1",
        ASYNC_UNSAFE: "",
    }
    with LiveServer(env) as live:
        page = new_page(alice, url=live.url)
        with page.expect_websocket() as opened:
            open_chat(page)
        socket = opened.value

        def is_title(payload) -> bool:
            return isinstance(payload, str) and payload.startswith('{"type":"title"')

        # The title is settled once the server says so: its `title` frame, whatever it wrote.
        with socket.expect_event("framereceived", predicate=is_title, timeout=60_000) as framed:
            wait_done(send(page, "Plan a trip to Lyon in **May**"), timeout=30_000)
        assert json.loads(framed.value)["title"] == "Plan a trip to Lyon in May"
        expect(page.locator("#chat-title")).to_have_text("Plan a trip to Lyon in May")
        assert Conversation.objects.get(owner=alice).title == "Plan a trip to Lyon in May"
        assert not Usage.objects.filter(source=Usage.Source.TITLE).exists()  # the demo was not asked
