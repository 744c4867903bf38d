"""A conversation longer than a page of messages (CHAT_PAGE_MESSAGES): its last ones open, the rest on scroll-up."""

from __future__ import annotations

from playwright.sync_api import expect

from chat.actions import imports
from tests.heavy_requests import chain_file

expect.set_options(timeout=15_000)


def test_a_long_conversation_opens_at_its_end_and_shows_the_start_when_scrolled_up(new_page, alice, settings):
    page_size = settings.CHAT_PAGE_MESSAGES  # the server's own, from the same environment
    (conversation,) = imports.import_now(alice, chain_file(page_size + 30))
    page = new_page(alice)
    page.goto(f"/c/{conversation.pk}/")
    messages = page.locator("article.message")
    expect(messages).to_have_count(page_size)
    expect(page.get_by_test_id("earlier")).to_be_visible()
    page.get_by_test_id("messages").evaluate("element => { element.scrollTop = 0; }")
    expect(messages).to_have_count(page_size + 30)
    expect(page.get_by_test_id("earlier")).to_be_hidden()
    ids = [int(i) for i in messages.evaluate_all("articles => articles.map(a => a.dataset.messageId)")]
    assert ids == sorted(ids) and len(set(ids)) == page_size + 30  # in order, none twice
