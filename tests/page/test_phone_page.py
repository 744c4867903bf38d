"""The page on a phone in a real Chromium (touch, 390×844 and 360 px wide): one menu per sidebar row with
rename and delete inside it (no trash can under every thumb), titles cut with an ellipsis, and a header
whose controls fit 360 px without squeezing the title; Enter on the screen keyboard starts a new line.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from chat.models import Conversation
from tests.page_helpers import conversation_for, open_chat, screenshot, wait_done

expect.set_options(timeout=15_000)

PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True, "device_scale_factor": 2}
LONG = "Quarterly planning for the infrastructure migration and the on-call rota"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_phone_rows_have_one_menu_with_rename_and_delete_and_titles_end_in_an_ellipsis(
    new_page, alice, providers, scheme
):
    short = conversation_for(alice, "Lunch", "hi", "ho")
    conversation_for(alice, LONG, "hi", "ho")
    page = new_page(alice, color_scheme=scheme, **PHONE)
    open_chat(page)
    page.get_by_role("button", name="Menu").tap()
    rows = page.locator("#conversation-list li")
    expect(rows).to_have_count(2)
    long_row = rows.filter(has_text=LONG)
    # One button per row: the menu. Rename and delete are not on the row.
    for row in (long_row, rows.filter(has_text="Lunch")):
        buttons = row.get_by_role("button")
        expect(buttons).to_have_count(1)
        expect(buttons).to_have_accessible_name(
            f"More actions for “{LONG if row is long_row else 'Lunch'}”", ignore_case=False
        )
    title = long_row.locator(".conversation-title")
    cut = title.evaluate("el => [el.scrollWidth > el.clientWidth, getComputedStyle(el).textOverflow, el.clientWidth]")
    assert cut[0] and cut[1] == "ellipsis", cut
    # The title has most of the row: the one button takes at most 25 % of it.
    row_width = long_row.bounding_box()["width"]
    assert cut[2] > 0.6 * row_width, (cut, row_width)
    screenshot(page, f"phone-sidebar-{scheme}")
    # The menu has rename and delete; delete still asks first.
    lunch = rows.filter(has_text="Lunch")
    lunch.get_by_role("button", name="More actions for “Lunch”").tap()
    menu = page.get_by_role("menu")
    expect(menu.get_by_role("menuitem")).to_have_text(["Pin", "Archive", "Move to folder…", "Rename", "Delete"])
    menu.get_by_role("menuitem", name="Delete").tap()
    page.get_by_role("dialog", name="Delete conversation?").get_by_role("button", name="Delete").tap()
    expect(rows).to_have_count(1)
    assert not Conversation.objects.filter(pk=short.pk).exists()


def test_the_header_fits_360_px_with_the_title_whole(new_page, alice, providers):
    page = new_page(alice, viewport={"width": 360, "height": 780}, is_mobile=True, has_touch=True)
    open_chat(page)
    title = page.locator("#chat-title")
    expect(title).to_have_text("New chat")
    assert title.evaluate("el => el.scrollWidth <= el.clientWidth"), "the title is cut"
    boxes = page.evaluate(
        """() => [...document.querySelectorAll('.topbar > *')].filter((el) => el.offsetParent !== null)
            .map((el) => { const r = el.getBoundingClientRect(); return [el.id || el.className, r.left, r.right]; })"""
    )
    assert len(boxes) >= 4, boxes
    for name, left, right in boxes:
        assert left >= 4 and right <= 356, (name, left, right)  # inside the header's padding
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 360
    # The model picker is wide enough to read the model's name.
    picker = page.get_by_label("Model").bounding_box()
    assert picker["width"] >= 200, picker
    screenshot(page, "phone-header-360")


@pytest.mark.parametrize("size", ["phone", "zoomed"])
def test_the_drawer_takes_the_focus_keeps_it_and_gives_it_back(new_page, alice, providers, size):
    """On a phone, and on a desktop at 200 % (640 px wide), the sidebar is a drawer: by keyboard alone it opens
    with the focus inside, the page behind is out of reach, and Escape or Close hands the focus back."""
    options = PHONE if size == "phone" else {"viewport": {"width": 640, "height": 400}}
    conversation_for(alice, "Lunch", "hi", "ho")
    page = new_page(alice, **options)
    open_chat(page)
    menu = page.get_by_role("button", name="Menu", exact=True)
    menu.focus()
    page.keyboard.press("Enter")
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_role("button", name="Close menu")).to_be_focused()
    stops = set()
    for _ in range(16):  # round the drawer and beyond: never into the page behind, which is inert
        page.keyboard.press("Tab")
        where = page.evaluate(
            "(e => e.closest('#sidebar') ? 'drawer:' + (e.id || e.textContent.trim().slice(0, 20))"
            " : e === document.body ? 'body' : 'behind:' + (e.id || e.tagName))(document.activeElement)"
        )
        assert not where.startswith("behind"), where
        stops.add(where)
    assert "drawer:search" in stops and "drawer:close-sidebar" in stops, stops
    page.keyboard.press("Escape")
    expect(menu).to_have_attribute("aria-expanded", "false")
    expect(menu).to_be_focused()
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")  # on Close menu
    expect(menu).to_be_focused()
    expect(menu).to_have_attribute("aria-expanded", "false")
    # Ctrl+K opens it on the search box, whatever had the focus.
    page.get_by_label("Message", exact=True).focus()
    page.keyboard.press("Control+k")
    expect(page.get_by_label("Search conversations")).to_be_focused()
    page.keyboard.type("lun")
    expect(page.locator("#conversation-list li")).to_have_count(1)
    # Wider again while open: the page is usable, not left inert behind a drawer that is gone.
    page.set_viewport_size({"width": 1200, "height": 800})
    # The page hears of the width in its own time (a media query's change event); until then it is still inert.
    expect(page.locator("#menu-button")).to_have_attribute("aria-expanded", "false")  # hidden now: by its id
    page.get_by_label("Message", exact=True).focus()
    expect(page.get_by_label("Message", exact=True)).to_be_focused()


def test_a_long_draft_in_a_short_window_leaves_the_conversation_room(new_page, alice, providers):
    """A desktop at 200 % zoom is 640 × 400: a draft of many lines took 40 % of it, leaving the messages 70 px."""
    page = new_page(alice, viewport={"width": 640, "height": 400})
    open_chat(page)
    box = page.get_by_label("Message", exact=True)
    box.fill("\n".join(f"line {n}" for n in range(12)))
    expect(box).to_have_value(re.compile("line 11$"))
    assert box.bounding_box()["height"] <= 0.25 * 400 + 1, box.bounding_box()


def test_on_a_touch_screen_enter_starts_a_new_line_and_send_sends(new_page, alice, providers):
    """A screen keyboard has no Shift to hold for a new line: there Enter makes one, and Send sends."""
    page = new_page(alice, **PHONE)
    open_chat(page)
    box = page.get_by_label("Message", exact=True)
    box.fill("[[echo]] first line")
    box.press("Enter")
    box.press_sequentially("second line")
    expect(box).to_have_value("[[echo]] first line\nsecond line")
    expect(page.locator("article.message")).to_have_count(0)  # nothing sent
    page.get_by_role("button", name="Send").tap()
    reply = page.locator("article.message.assistant")
    wait_done(reply)
    expect(page.locator("article.message.user")).to_contain_text("second line")
    expect(box).to_have_value("")
