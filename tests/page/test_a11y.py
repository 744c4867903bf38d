"""Accessibility in a real Chromium: axe-core finds no serious or critical violation on any page, light
or dark, and the chat can be used with the keyboard alone.

axe-core (tests/vendor/axe-core, never served) is evaluated through the browser's protocol, which the
page's CSP does not apply to, so the page is checked exactly as it is served.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from chat.models import Usage
from tests.page_helpers import conversation_for, open_chat, screenshot, send, wait_done

AXE = (Path(__file__).parent.parent / "vendor" / "axe-core" / "axe.min.js").read_text()
SCHEMES = ["light", "dark"]


def violations(page: Page) -> list[str]:
    """The serious and critical axe-core violations on the page as it is now, one line each."""
    page.evaluate(AXE)
    found = page.evaluate(
        """async () => (await axe.run(document, { resultTypes: ["violations"] })).violations
            .filter((v) => v.impact === "serious" || v.impact === "critical")
            .map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", ")}`)"""
    )
    return found


@pytest.fixture
def staff(django_user_model, transactional_db):
    return django_user_model.objects.create_superuser("stella", password="stella-secret-pw")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_chat_page_and_its_settings(new_page, alice, providers, scheme):
    conversation = conversation_for(alice, "Reading list", "hi", "Some **bold** text and `code`.\n\n- a\n- b")
    page = new_page(alice, color_scheme=scheme)
    open_chat(page, f"/c/{conversation.pk}/")
    expect(page.locator(".answer strong")).to_have_text("bold")
    assert violations(page) == []
    page.get_by_role("button", name="Settings").click()
    assert violations(page) == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_sign_in_tokens_and_guide_pages(new_page, alice, providers, scheme):
    page = new_page(color_scheme=scheme)
    page.goto("/accounts/login/")
    assert violations(page) == []
    page = new_page(alice, color_scheme=scheme)
    page.goto("/settings/tokens/")
    assert violations(page) == []
    page.goto("/docs/api/")
    expect(page.get_by_test_id("api-guide").get_by_role("heading", level=1)).to_be_visible()
    assert violations(page) == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_usage_pages_for_staff(new_page, alice, staff, providers, scheme):
    conversation = conversation_for(alice, "Metered", "hi", "ho")
    Usage.objects.create(
        user=alice, message=conversation.messages.last(), model="m", status="complete", prompt_tokens=3,
        completion_tokens=4,
    )  # fmt: skip
    page = new_page(staff, color_scheme=scheme)
    page.goto("/usage/")
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    assert violations(page) == []
    page.goto("/admin/chat/usage/")
    expect(page.locator("#result_list")).to_be_visible()
    assert violations(page) == []


def test_sending_stopping_regenerating_renaming_and_deleting_by_keyboard_alone(page: Page, alice):
    # The first stop of the Tab key is a skip link straight to the composer (which also has the
    # focus when a chat opens); it shows when focused.
    skip = page.get_by_role("link", name="Skip to the message box")
    first = "() => document.querySelector('a[href], button, input, select, textarea, [tabindex]')"
    assert page.evaluate(f"({first})() === document.getElementById('skip-link')")
    skip.focus()
    expect(skip).to_be_in_viewport()
    page.keyboard.press("Enter")
    box = page.get_by_label("Message", exact=True)
    expect(box).to_be_focused()
    page.keyboard.type("[[delay:30]] [[chunks:300]] by keyboard")
    page.keyboard.press("Enter")
    reply = page.locator("article.message.assistant").last
    expect(reply).to_have_attribute("data-status", "streaming")
    expect(box).to_be_focused()  # focus stays in the composer while it streams
    # Escape in the search box is the box's own (it clears it), not a stop.
    page.keyboard.press("Control+k")
    page.keyboard.type("zz")
    page.keyboard.press("Escape")
    expect(page.get_by_label("Search conversations")).to_have_value("")
    expect(reply).to_have_attribute("data-status", "streaming")
    page.keyboard.press("Shift+Escape")
    expect(box).to_be_focused()
    page.keyboard.press("Escape")  # in the message box, it stops the stream
    wait_done(reply, "stopped")
    # Regenerate: Tab from the composer backwards reaches the answer's buttons.
    regenerate = reply.get_by_role("button", name="Regenerate")
    focus_by_tab(page, regenerate, backwards=True)
    page.keyboard.press("Enter")
    wait_done(page.locator("article.message.assistant").last, "complete", timeout=60_000)
    # Rename and delete from the sidebar: Tab to the list (one stop), Right to the row's buttons, Enter.
    item = page.locator("#conversation-list li").first
    focus_by_tab(page, item.locator("a"))
    page.keyboard.press("ArrowRight")
    expect(item.get_by_role("button", name=re.compile("^Rename"))).to_be_focused()
    page.keyboard.press("Enter")
    page.keyboard.press("Control+a")
    page.keyboard.type("Typed title")
    page.keyboard.press("Enter")
    expect(item.locator("a .conversation-title")).to_have_text("Typed title")
    expect(item.get_by_role("button", name=re.compile("^Rename"))).to_be_focused()  # kept through the redraw
    page.keyboard.press("ArrowRight")
    expect(item.get_by_role("button", name=re.compile("^Delete"))).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("dialog", name="Delete conversation?")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel")).to_be_focused()  # a stray Enter deletes nothing
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Delete", exact=True)).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#conversation-list li")).to_have_count(0)
    # The open conversation went: a new chat, the focus in its message box (not on the page's body), and its
    # address gone from the history (Back leads to what came before, not to a conversation that is no more).
    expect(page.get_by_label("Message", exact=True)).to_be_focused()
    expect(page).to_have_url(re.compile(r"/$"))
    page.go_back()
    assert "/c/" not in page.url, page.url


def focus_by_tab(page: Page, target, backwards: bool = False, limit: int = 60) -> None:
    """Press Tab (or Shift+Tab) until `target` has the focus; fail if it never does."""
    for _ in range(limit):
        if target.evaluate("el => document.activeElement === el"):
            return
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
    pytest.fail(f"{target} never got the focus by keyboard")


def test_a_finished_answer_is_announced_once_not_every_token(page: Page):
    live = page.locator("#announce")
    expect(live).to_have_attribute("aria-live", "polite")
    reply = send(page, "[[delay:10]] [[chunks:40]] announce me")
    expect(live).to_have_text("")  # nothing while it streams
    wait_done(reply)
    expect(live).to_have_text(re.compile("^Answer finished"))
    assert page.locator("article.message.assistant").get_attribute("aria-label").startswith("Answer")
    assert page.locator("article.message.user").get_attribute("aria-label").startswith("You")
    # What is heard is the answer as drawn, not its markdown; a failure says why.
    wait_done(
        send(page, "[[echo]] | Name | Score |\n|---|---:|\n| **Ann** | 12 |\n\nSee [the docs](https://example.com).")
    )
    expect(live).to_have_text(re.compile(r"^Answer finished: .*Ann.*the docs"))
    assert not re.search(r"[|*\[\]]|---", live.inner_text()), live.inner_text()
    failed = send(page, "[[status:500]] fail")
    wait_done(failed, "failed")
    expect(live).to_have_text(re.compile(r"^Answer failed: \w.{10,}"))
    # Nothing to copy, and one way to ask again, in words: Retry, not Regenerate beside it.
    expect(failed.get_by_role("button", name="Retry", exact=True)).to_be_visible()
    for hidden in ("Copy answer", "Regenerate"):
        expect(failed.get_by_role("button", name=hidden)).to_be_hidden()


def test_touch_targets_on_a_phone_are_at_least_44_pixels(new_page, alice, providers):
    conversation = conversation_for(alice, "On the phone", "hi", "Some `code`:\n\n```python\nprint(1)\n```")
    page = new_page(alice, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, color_scheme="dark")
    open_chat(page, f"/c/{conversation.pk}/")
    screenshot(page, "phone-dark")
    assert small_targets(page, "main") == []
    page.get_by_role("button", name="Menu").click()
    expect(page.locator("#sidebar")).to_be_in_viewport()
    assert small_targets(page, "#sidebar") == []


def small_targets(page: Page, within: str) -> list[str]:
    """Visible controls under `within` smaller than 44 x 44 CSS pixels, one line each."""
    return page.evaluate(
        """(within) => [...document.querySelector(within).querySelectorAll(
                "button, a, select, input, textarea, summary")]
            .filter((el) => el.checkVisibility({ visibilityProperty: true }) && !el.closest("dialog:not([open])"))
            .map((el) => [el, el.getBoundingClientRect()])
            .filter(([el, r]) => Math.round(r.width) < 44 || Math.round(r.height) < 44)
            .map(([el, r]) => `${el.tagName} ${el.id || el.getAttribute("aria-label") || el.textContent.trim()}`
                + ` ${Math.round(r.width)}x${Math.round(r.height)}`)""",
        within,
    )


@pytest.mark.parametrize("scheme", SCHEMES)
def test_settings_delete_all_section(new_page, alice, providers, scheme):
    conversation_for(alice, "To go", "hi", "ho")
    page = new_page(alice, color_scheme=scheme)
    page.goto("/settings/")
    assert violations(page) == []
    page.get_by_label("Yes, delete my 1 conversation").check()
    page.get_by_role("button", name="Delete all conversations").click()
    expect(page.locator(".delete-all").get_by_role("status")).to_have_text(
        "1 conversation deleted; your usage records are kept."
    )
    assert violations(page) == []
