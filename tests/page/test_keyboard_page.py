"""The keyboard in a real Chromium (static/chat/rovinglist.js, shortcuts.js): one Tab stop for the whole
conversation list with arrow keys inside it, and the shortcuts people know from other chat apps
(Ctrl+K search, Ctrl+Shift+O new chat, Ctrl+Shift+C copy the last answer, Shift+Esc the message box,
Esc stop, Ctrl+/ the list, also on the settings page).
"""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Conversation
from tests.page_helpers import CLAUDE, choose_model, conversation_for, open_chat, screenshot, send, wait_done

expect.set_options(timeout=15_000)


def focused_row(page) -> str | None:
    """The title of the row whose control has the focus (None: the focus is outside the list)."""
    return page.evaluate(
        """() => {
            const row = document.activeElement?.closest('#conversation-list li[data-conversation-id]');
            return row ? row.querySelector('.conversation-title, a').textContent : null;
        }"""
    )


def three_rows(new_page, alice):
    """Alice's page with three conversations, newest first: Third, Second, First; the page and the list's rows."""
    for age, title in enumerate(["Third", "Second", "First"]):
        conversation = conversation_for(alice, title, "hi", "ho")
        Conversation.objects.filter(pk=conversation.pk).update(updated=timezone.now() - timedelta(minutes=age))
    page = new_page(alice)
    open_chat(page)
    rows = page.locator("#conversation-list li")
    expect(rows).to_have_count(3)
    return page, rows


def test_the_conversation_list_is_one_tab_stop_with_arrow_keys_inside(new_page, alice, providers):
    page, rows = three_rows(new_page, alice)
    # Before: the link and three buttons of every row were Tab stops (twelve here).
    page.locator("#show-archived").focus()
    page.keyboard.press("Tab")
    assert focused_row(page) == "Third"  # the newest, first
    page.keyboard.press("Tab")
    assert focused_row(page) is None  # one Tab leaves the list
    page.keyboard.press("Shift+Tab")
    assert focused_row(page) == "Third"
    page.keyboard.press("ArrowDown")
    expect(rows.nth(1).locator("a")).to_be_focused()
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")  # stays on the last
    expect(rows.nth(2).locator("a")).to_be_focused()
    page.keyboard.press("Home")
    expect(rows.nth(0).locator("a")).to_be_focused()
    page.keyboard.press("End")
    expect(rows.nth(2).locator("a")).to_be_focused()
    page.keyboard.press("ArrowUp")
    expect(rows.nth(1).locator("a")).to_be_focused()
    # Right and Left move through the row's buttons; its menu still opens by keyboard.
    page.keyboard.press("ArrowRight")
    expect(rows.nth(1).get_by_role("button", name="Rename “Second”")).to_be_focused()
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    more = rows.nth(1).get_by_role("button", name="More actions for “Second”")
    expect(more).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("menuitem", name="Pin")).to_be_focused()
    page.keyboard.press("Escape")
    expect(more).to_be_focused()
    # The list remembers where the reader was: Tab out and back lands on that row again.
    page.keyboard.press("Tab")
    assert focused_row(page) is None
    page.keyboard.press("Shift+Tab")
    assert focused_row(page) == "Second"
    # Enter on a row opens it, and its row stays the list's stop.
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    expect(rows.nth(1).locator("a")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#chat-title")).to_have_text("Second")
    tab_stops = page.evaluate(
        "() => [...document.querySelectorAll('#conversation-list a, #conversation-list button')]"
        ".filter((el) => el.tabIndex >= 0).length"
    )
    assert tab_stops == 1


def test_the_shortcuts_people_know(new_page, alice, providers):
    conversation_for(alice, "Zebra notes", "about zebras", "stripes")
    page = new_page(alice, viewport={"width": 1440, "height": 900})
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_chat(page)
    box = page.get_by_label("Message")
    # Ctrl+K searches (it used to start a new chat).
    page.keyboard.press("Control+k")
    expect(page.get_by_label("Search conversations")).to_be_focused()
    page.keyboard.type("zebra")
    expect(page.locator("#conversation-list li")).to_have_count(1)
    # Shift+Esc: back to the message box.
    page.keyboard.press("Shift+Escape")
    expect(box).to_be_focused()
    choose_model(page, CLAUDE)
    reply = send(page, "[[echo]] copy me please")
    wait_done(reply)
    # Ctrl+Shift+C copies the last answer.
    box.focus()
    page.keyboard.press("Control+Shift+C")
    expect(reply.get_by_role("button", name="Copied")).to_be_attached()
    expect(page.locator("#announce")).to_have_text("Copied")  # heard, though the focus stayed in the message box
    assert page.evaluate("() => navigator.clipboard.readText()") == "copy me please"
    # Ctrl+Shift+O: a new chat, the message box focused.
    page.keyboard.press("Control+Shift+O")
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("#chat-title")).to_have_text("New chat")
    expect(box).to_be_focused()
    # Ctrl+/ lists them; Escape closes the list.
    page.keyboard.press("Control+/")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("row", name=re.compile("^Search conversations"))).to_contain_text("Ctrl + K")
    expect(dialog.get_by_role("row", name=re.compile("^New chat"))).to_contain_text("Ctrl + Shift + O")
    screenshot(page, "shortcuts")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    # And the settings page lists them too.
    page.goto("/settings/")
    section = page.get_by_role("region", name="Keyboard shortcuts")
    expect(section.get_by_role("row", name=re.compile("^Copy the last answer"))).to_contain_text("Ctrl + Shift + C")
    expect(section.get_by_role("row", name=re.compile("^Focus the message box"))).to_contain_text("Shift + Esc")


def test_a_row_that_leaves_the_list_hands_the_focus_to_its_neighbour(new_page, alice, providers):
    """Archive, a move and a delete from a row's menu: the focus does not fall to the page's body, where a screen
    reader's place would be lost, but lands on the row that followed (the one before, for the last row)."""
    page, rows = three_rows(new_page, alice)
    rows.nth(1).get_by_role("button", name="More actions for “Second”").focus()
    page.keyboard.press("Enter")
    page.get_by_role("menuitem", name="Archive").press("Enter")
    expect(rows).to_have_count(2)
    expect(rows.nth(1).locator("a")).to_be_focused()  # Second's follower, First
    rows.nth(1).get_by_role("button", name="Delete “First”").focus()
    page.keyboard.press("Enter")
    page.get_by_role("button", name="Delete", exact=True).press("Enter")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("a")).to_be_focused()  # the last row's: the one before it (Third)


def focused(page) -> str:
    """What has the focus, in a word: the message box, the page's body, or the control's accessible name."""
    return page.evaluate(
        "(e => e.id === 'input' ? 'message box' : e === document.body ? 'body'"
        " : e.getAttribute('aria-label') || e.textContent.trim())(document.activeElement)"
    )


def test_by_keyboard_the_focus_never_falls_to_the_page_after_a_message_action(new_page, alice, providers):
    """Regenerate, Edit (cancelled, then sent) and a branch's arrows: each took its own control away and left the
    focus on the page's body, where a screen reader's place is lost."""
    page = new_page(alice)
    open_chat(page)
    choose_model(page, CLAUDE)
    wait_done(send(page, "[[echo]] first"))
    reply = page.locator("article.message.assistant").last
    reply.get_by_role("button", name="Regenerate").focus()
    page.keyboard.press("Enter")  # its answer, and the button, go: the new one streams
    wait_done(page.locator("article.message.assistant").last)
    expect(page.get_by_label("Message", exact=True)).to_be_focused()
    # Back to the first version by its arrow: the arrow turns disabled, the focus goes to the other one.
    previous = page.locator("article.message.assistant").last.get_by_role("button", name="Previous version")
    previous.focus()
    page.keyboard.press("Enter")
    expect(page.locator("article.message.assistant").last.get_by_role("button", name="Next version")).to_be_focused()
    # Edit: Escape cancels, back on Edit; Enter sends, and the focus is in the message box.
    question = page.locator("article.message.user").last
    question.get_by_role("button", name="Edit").focus()
    page.keyboard.press("Enter")
    expect(page.get_by_label("Edit message")).to_be_focused()
    page.keyboard.press("Escape")
    expect(question.get_by_role("button", name="Edit")).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.type(" again")
    page.keyboard.press("Enter")
    wait_done(page.locator("article.message.assistant").last)
    assert focused(page) == "message box", focused(page)
