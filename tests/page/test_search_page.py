"""Search in a real Chromium: each result shows a snippet of the message that matched with the words
marked (made on the server, drawn with text nodes), the "Archived" badge whole beside a long title,
and an archived conversation, opened, says so and offers Restore.
"""

from __future__ import annotations

from playwright.sync_api import expect

from chat.models import Conversation
from tests.page_helpers import conversation_for, open_chat, screenshot

expect.set_options(timeout=15_000)

LONG = "A very long title about the family holiday plans for next summer in the mountains"


def test_search_shows_a_snippet_with_the_match_marked_and_the_archived_badge_whole(new_page, alice, providers):
    conversation_for(alice, "Trip", "Where do we go?", "We could cross the savanna to see a zebra <b>herd</b> at dawn.")
    archived = conversation_for(alice, LONG, "and the zebra crossing near the hotel <img src=x onerror=alert(1)>", "ok")
    Conversation.objects.filter(pk=archived.pk).update(archived=True)
    page = new_page(alice, viewport={"width": 1440, "height": 900})
    open_chat(page)
    page.get_by_label("Search conversations").fill("ZEBRA")
    rows = page.locator("#conversation-list li")
    expect(rows).to_have_count(2)
    trip = rows.filter(has_text="Trip")
    snippet = trip.locator(".conversation-snippet")
    expect(snippet).to_have_text("We could cross the savanna to see a zebra <b>herd</b> at dawn.")
    expect(snippet.locator("mark")).to_have_text(["zebra"])
    assert snippet.locator("b").count() == 0  # the conversation's text is text, never markup
    other = rows.filter(has=page.locator(".archived-badge"))
    expect(other.locator(".conversation-snippet mark")).to_have_text(["zebra"])
    assert other.locator("img").count() == 0
    # The badge is whole inside the row, the long title cut with an ellipsis before it.
    badge = other.locator(".archived-badge")
    expect(badge).to_have_text("Archived")
    row_box, badge_box = other.locator("a").bounding_box(), badge.bounding_box()
    assert badge_box["x"] + badge_box["width"] <= row_box["x"] + row_box["width"], (badge_box, row_box)
    title = other.locator(".conversation-title")
    assert title.evaluate("el => el.scrollWidth > el.clientWidth && getComputedStyle(el).textOverflow") == "ellipsis"
    screenshot(page, "search-snippets")

    # Opened, the archived one says so and offers Restore, which brings it back to the list.
    other.locator("a").click()
    notice = page.locator("#archived-notice")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("This conversation is archived.")
    notice.get_by_role("button", name="Restore").click()
    expect(notice).to_be_hidden()
    archived.refresh_from_db()
    assert not archived.archived
    page.get_by_label("Search conversations").fill("")
    expect(page.locator("#conversation-list li .conversation-title")).to_have_text([LONG, "Trip"])
    # A conversation that is not archived shows no notice.
    rows.filter(has_text="Trip").locator("a").click()
    expect(page.locator("#chat-title")).to_have_text("Trip")
    expect(notice).to_be_hidden()
