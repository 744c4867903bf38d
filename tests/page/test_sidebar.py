"""The organised sidebar in a real Chromium (static/chat/sidebar.js, folders.js, dategroups.js): pin, archive
and restore, folders by menu and by drag and drop, the date groups in the browser's time zone, and
infinite scroll through 2,000 conversations.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.utils import timezone
from playwright.sync_api import Page, expect

from chat.models import Conversation, Folder
from tests.page.test_a11y import small_targets, violations
from tests.page_helpers import SCREENSHOTS, conversation_for, open_chat, screenshot

expect.set_options(timeout=15_000)


def row(page: Page, conversation: Conversation):
    return page.locator(f'#conversation-list li[data-conversation-id="{conversation.pk}"]')


def menu_action(page: Page, conversation: Conversation, action: str) -> None:
    """Opens the row's "More" menu and picks `action` (Pin, Archive, Move to folder…, …) with the mouse."""
    row(page, conversation).hover()  # its buttons show (and take clicks) on hover or focus
    row(page, conversation).get_by_role("button", name=re.compile("^More actions")).click()
    page.get_by_role("menuitem", name=action).click()


def titles(locator) -> list[str]:
    return [text.strip() for text in locator.locator("li a").all_inner_texts()]


def backdate(conversation: Conversation, when: datetime) -> None:
    Conversation.objects.filter(pk=conversation.pk).update(updated=when)


def test_pin_by_keyboard_puts_a_conversation_on_top_and_unpin_puts_it_back(new_page, alice, providers):
    older = conversation_for(alice, "Older plan", "hi", "ho")
    conversation_for(alice, "Newer notes", "hi", "ho")
    backdate(older, timezone.now() - timedelta(hours=1))
    page = new_page(alice)
    open_chat(page)
    nav = page.locator("#conversation-list")
    expect(nav.locator("li").first).to_have_text("Newer notes")
    # Keyboard only: the row's "More" button, Enter opens the menu on its first item, arrows move.
    more = row(page, older).get_by_role("button", name="More actions for “Older plan”")
    more.focus()
    page.keyboard.press("Enter")
    menu = page.get_by_role("menu")
    expect(menu.get_by_role("menuitem", name="Pin")).to_be_focused()
    page.keyboard.press("ArrowDown")
    expect(menu.get_by_role("menuitem", name="Archive")).to_be_focused()
    page.keyboard.press("Escape")  # closes, the focus back on the button
    expect(menu).to_have_count(0)
    expect(more).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")  # Pin
    pinned = page.locator(".pinned-section")
    expect(pinned.get_by_role("heading", name="Pinned")).to_be_visible()
    expect(pinned.locator("li")).to_have_text(["Older plan"])
    expect(nav.locator("li").first).to_have_text("Older plan")  # on top of the newer one
    expect(row(page, older).get_by_role("button", name=re.compile("^More actions"))).to_be_focused()  # not lost
    older.refresh_from_db()
    assert older.pinned
    page.reload()
    expect(pinned.locator("li")).to_have_text(["Older plan"])  # stored, not only drawn
    menu_action(page, older, "Unpin")
    expect(pinned).to_be_hidden()
    expect(nav.locator("li")).to_have_text(["Newer notes", "Older plan"])


def test_archive_hides_a_conversation_search_still_finds_it_and_restore_brings_it_back(new_page, alice, providers):
    kept = conversation_for(alice, "Kept", "hi", "ho")
    old = conversation_for(alice, "Old trip", "packing list for the zebra safari", "ok")
    page = new_page(alice)
    open_chat(page)
    nav = page.locator("#conversation-list")
    menu_action(page, old, "Archive")
    expect(nav.locator("li")).to_have_text(["Kept"])
    page.get_by_label("Search conversations").fill("zebra")
    expect(nav.locator("li")).to_have_count(1)
    expect(row(page, old).locator(".archived-badge")).to_have_text("Archived")
    page.get_by_label("Search conversations").fill("")
    expect(nav.locator("li")).to_have_text(["Kept"])
    toggle = page.get_by_role("button", name="Archived conversations", exact=True)  # its state: aria-pressed
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    expect(page.get_by_role("heading", name="Archived conversations")).to_be_visible()
    expect(nav.locator("li")).to_have_text(["Old trip"])
    assert violations(page) == []
    menu_action(page, old, "Restore")
    expect(page.locator("#list-empty")).to_have_text("No archived conversations.")
    page.get_by_role("button", name="Back to all conversations").click()
    expect(toggle).to_have_attribute("aria-pressed", "false")
    expect(nav.locator("li")).to_have_text(["Old trip", "Kept"])
    old.refresh_from_db()
    kept.refresh_from_db()
    assert not old.archived and not kept.archived


def test_folders_by_menu_and_by_drag_and_drop_and_deleting_one_keeps_its_conversations(new_page, alice, providers):
    first = conversation_for(alice, "Budget 2027", "hi", "ho")
    second = conversation_for(alice, "Hiring plan", "hi", "ho")
    third = conversation_for(alice, "Lunch ideas", "hi", "ho")
    page = new_page(alice)
    open_chat(page)
    page.get_by_role("button", name="New folder").click()
    dialog = page.get_by_role("dialog", name="New folder")
    dialog.get_by_label("Folder name").fill("Work")
    dialog.get_by_label("Folder name").press("Enter")
    folder = page.locator(".folder", has_text="Work")
    toggle = folder.locator(".folder-toggle")
    expect(toggle).to_be_focused()  # the new folder, ready to open
    # The keyboard's way: the row's menu, then a folder picked in a dialog.
    menu_action(page, first, "Move to folder…")
    move = page.get_by_role("dialog", name="Move to folder")
    move.get_by_label("Move “Budget 2027” to").select_option(label="Work")
    move.get_by_role("button", name="Move").click()
    expect(folder.locator(".folder-count")).to_have_text("1")
    expect(row(page, first)).to_have_count(0)  # closed: its rows are not drawn
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(folder.locator("li")).to_have_text(["Budget 2027"])
    # The mouse's way: drag a row onto the folder's heading.
    row(page, second).drag_to(folder.locator(".folder-head"))
    expect(folder.locator(".folder-count")).to_have_text("2")
    expect(folder.locator("li")).to_have_text(["Hiring plan", "Budget 2027"])
    expect(page.locator(".date-groups li")).to_have_text(["Lunch ideas"])
    assert set(Conversation.objects.filter(folder__name="Work").values_list("title", flat=True)) == {
        "Budget 2027",
        "Hiring plan",
    }
    page.reload()
    expect(folder.locator("li")).to_have_text(["Hiring plan", "Budget 2027"])  # open folders stay open
    # Dragged out again onto the list: out of the folder.
    row(page, first).drag_to(page.locator(".date-groups"))
    expect(page.locator(".date-groups li")).to_have_text(["Lunch ideas", "Budget 2027"])
    folder.locator(".folder-head").hover()
    folder.get_by_role("button", name="Rename folder “Work”").click()
    rename = page.get_by_role("dialog", name="Rename folder")
    rename.get_by_label("Folder name").fill("Office")
    rename.get_by_role("button", name="Rename").click()
    expect(page.locator(".folder-name")).to_have_text("Office")
    page.locator(".folder-head").hover()
    page.locator(".folder").get_by_role("button", name="Delete folder “Office”").click()
    page.get_by_role("dialog", name="Delete folder?").get_by_role("button", name="Delete folder").click()
    expect(page.locator(".folder")).to_have_count(0)
    expect(page.locator(".date-groups li")).to_have_text(["Lunch ideas", "Hiring plan", "Budget 2027"])
    assert not Folder.objects.exists() and Conversation.objects.filter(owner=alice).count() == 3
    assert third.pk


def test_date_groups_follow_the_browsers_time_zone(new_page, alice, providers):
    zone = ZoneInfo("Pacific/Auckland")  # far from the server's UTC: "today" starts at another instant
    now = timezone.now().astimezone(zone)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    dates = {
        "just now": now,
        # Halfway from midnight to now: earlier than "just now" even a moment after midnight (a run then had
        # both at the same instant, listed in either order).
        "after midnight": midnight + (now - midnight) / 2,
        "before midnight": midnight - timedelta(minutes=1),
        "three days ago": midnight - timedelta(days=3),
        "twenty days ago": midnight - timedelta(days=20),
        "seven weeks ago": midnight - timedelta(days=49),
        "a year ago": midnight - timedelta(days=400),
    }
    for title, when in dates.items():
        backdate(conversation_for(alice, title, "hi", "ho"), when)
    page = new_page(alice, timezone_id="Pacific/Auckland", locale="en-US")
    open_chat(page)
    month = (midnight - timedelta(days=49)).strftime("%B %Y")  # e.g. "October 2026"
    year_ago = (midnight - timedelta(days=400)).strftime("%B %Y")
    groups = page.locator(".date-group")
    expect(groups.locator("h2")).to_have_text(
        ["Today", "Yesterday", "Previous 7 days", "Previous 30 days", month, year_ago]
    )
    expect(groups.nth(0).locator("li")).to_have_text(["just now", "after midnight"])
    expect(groups.nth(1).locator("li")).to_have_text(["before midnight"])
    expect(groups.nth(2).locator("li")).to_have_text(["three days ago"])
    expect(groups.nth(3).locator("li")).to_have_text(["twenty days ago"])
    expect(groups.nth(4).locator("li")).to_have_text(["seven weeks ago"])
    expect(groups.nth(5).locator("li")).to_have_text(["a year ago"])


def test_organised_sidebar_in_dark_mode_on_a_phone(new_page, alice, providers):
    """The screenshot of the organised sidebar, then a phone in dark mode: 44 px targets, no axe violation."""
    now = timezone.now()
    work = Folder.objects.create(owner=alice, name="Work")
    made = {}
    for index, (title, days) in enumerate(
        [
            ("Release checklist", 0),
            ("SQL for the monthly report", 0),
            ("Team offsite agenda", 1),
            ("Regex for log lines", 3),
            ("Onboarding guide draft", 12),
            ("Quarterly planning", 45),
            ("Holiday rota", 80),
        ]
    ):
        made[title] = conversation_for(alice, title, "hi", "ho")
        backdate(made[title], now - timedelta(days=days, minutes=index))
    Conversation.objects.filter(pk=made["Release checklist"].pk).update(pinned=True)
    Conversation.objects.filter(pk__in=[made["Quarterly planning"].pk, made["Team offsite agenda"].pk]).update(
        folder=work
    )
    page = new_page(alice, viewport={"width": 1100, "height": 900}, color_scheme="light")
    open_chat(page)
    page.locator(".folder-toggle").click()
    expect(page.locator(".folder li")).to_have_count(2)
    page.mouse.move(600, 400)  # no row hovered in the picture
    page.locator("#sidebar").screenshot(path=str(SCREENSHOTS / "sidebar.png"), animations="disabled")
    page = new_page(alice, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, color_scheme="dark")
    open_chat(page)
    page.get_by_role("button", name="Menu").click()
    expect(page.locator("#sidebar")).to_be_in_viewport()
    page.locator(".folder-toggle").click()
    expect(page.locator(".folder li")).to_have_count(2)
    page.locator(f'li[data-conversation-id="{made["Holiday rota"].pk}"]').get_by_role(
        "button", name=re.compile("^More")
    ).click()
    expect(page.get_by_role("menu")).to_be_visible()
    screenshot(page, "sidebar-phone-dark")
    assert small_targets(page, "#sidebar") == []
    assert violations(page) == []


def test_infinite_scroll_reaches_the_oldest_of_2000_conversations(new_page, alice, providers):
    start = timezone.now()
    Conversation.objects.bulk_create(
        Conversation(owner=alice, title=f"Chat number {i:04d}", updated=start - timedelta(hours=i)) for i in range(2000)
    )
    page = new_page(alice)
    open_chat(page)
    rows = page.locator("#conversation-list li")
    expect(rows.first).to_have_text("Chat number 0000")
    first_page = rows.count()
    assert 0 < first_page < 200  # a page, not everything
    nav = page.locator(".conversation-nav")
    nav.evaluate("el => { el.scrollTop = el.scrollHeight; }")
    page.wait_for_function(f"() => document.querySelectorAll('#conversation-list li').length > {first_page}")
    # Keep scrolling to the end until the oldest is there: each page loads as the end comes near.
    page.wait_for_function(
        """() => {
            const nav = document.querySelector(".conversation-nav");
            nav.scrollTop = nav.scrollHeight;
            const links = [...document.querySelectorAll("#conversation-list li a")];
            return links.some((a) => a.title === "Chat number 1999");
        }""",
        polling=100,
        timeout=180_000,  # 20 pages; a loaded machine answers slowly
    )
    expect(rows).to_have_count(2000)
    ids = rows.evaluate_all("items => items.map((li) => li.dataset.conversationId)")
    assert len(set(ids)) == 2000  # nothing twice
    # A redraw (here after pinning the oldest) loads back as many rows as were shown: the place is kept.
    oldest = Conversation.objects.get(title="Chat number 1999")
    menu_action(page, oldest, "Pin")
    expect(page.locator(".pinned-section li")).to_have_text(["Chat number 1999"])
    expect(page.locator(".date-groups li")).to_have_count(1999)
    # Search runs on the server across all of them, not only the ones loaded.
    page.get_by_label("Search conversations").fill("number 1998")
    expect(rows).to_have_text(["Chat number 1998"])
