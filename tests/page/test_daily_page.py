"""What a daily user trips over (issue #37), in a real Chromium at 1440×900 and 390×844.

Each test drives the state a person met and checks the fixed one; nothing sleeps, every wait is
Playwright's polling of the page.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from chat.models import Conversation, Provider
from tests import files
from tests.conftest import FAKE_KEY
from tests.page.test_attachments_page import drop, paste, ready
from tests.page.test_page import filler
from tests.page_helpers import (
    API14_MINI,
    CLAUDE,
    choose_model,
    conversation_for,
    last_reply,
    open_chat,
    screenshot,
    send,
    wait_done,
    wait_longer_while_streaming,
)

expect.set_options(timeout=15_000)
DESKTOP = {"viewport": {"width": 1440, "height": 900}}
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
SCREENS = {"desktop": DESKTOP, "phone": PHONE}


@pytest.fixture(params=sorted(SCREENS))
def screen(request):
    return request.param


# --- 1. the buttons under a finished answer ---------------------------------------------

AT_BOTTOM = "el => el.scrollHeight - el.scrollTop - el.clientHeight <= 1"


def test_a_finished_answer_ends_at_the_true_bottom_with_its_buttons_above_the_composer(
    new_page, alice, providers, screen
):
    page = new_page(alice, **SCREENS[screen])
    open_chat(page)
    send(page, "[[chunks:40]] a first question")
    wait_done(page.locator("article.message.assistant").last)
    reply = send(page, "[[chunks:60]] [[length]] a long answer, cut at max tokens")
    wait_done(reply)
    expect(reply.get_by_role("button", name="Continue this answer")).to_be_visible()
    messages = page.get_by_test_id("messages")
    page.wait_for_function(AT_BOTTOM, arg=messages.element_handle())
    composer = page.locator("#composer").bounding_box()
    for name in ("Copy answer", "Regenerate", "Continue this answer"):
        box = reply.get_by_role("button", name=name).bounding_box()
        assert box["y"] + box["height"] <= composer["y"], (name, box, composer)
    screenshot(page, f"finished-controls-{screen}")


# --- 3. wide tables and code on the phone ----------------------------------------------

WIDE_TABLE = """Here is the comparison:

| Cache | Latency | Memory | Persistence | Clustering | Licence | Difficulty |
|---|---|---|---|---|---|---|
| Memcached | Low | Medium | None | Client-side | BSD | Easy |
| Redis | Low | Medium | Snapshots | Built-in | RSALv2 | Medium |

```python
print("a line of code far wider than any phone held upright could ever show in one go, so it scrolls")
```
"""


def test_a_wide_table_and_a_long_code_line_scroll_sideways_inside_the_answer_on_a_phone(new_page, alice, providers):
    conversation = conversation_for(alice, "Caches", "compare caches", WIDE_TABLE)
    page = new_page(alice, **PHONE)
    open_chat(page, f"/c/{conversation.pk}/")
    answer = last_reply(page).locator(".answer")
    table = answer.locator("table")
    expect(table).to_be_visible()
    # No word is broken over two lines ("Memc/ached"): every cell's text is one line.
    lines = table.evaluate(
        """table => [...table.querySelectorAll("th, td")].map((cell) => {
            const range = document.createRange();
            range.selectNodeContents(cell);
            return [cell.textContent, new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size];
        })"""
    )
    assert all(count == 1 for _, count in lines), lines
    # The table scrolls inside the answer; the page itself does not scroll sideways.
    assert table.evaluate("el => el.scrollWidth > el.clientWidth + 50")
    width = answer.evaluate("el => el.getBoundingClientRect().width")
    assert table.evaluate("el => el.getBoundingClientRect().width") <= width + 1
    pre = answer.locator(".code-block pre")
    assert pre.evaluate("el => el.scrollWidth > el.clientWidth + 50")
    assert answer.locator(".code-block").evaluate("el => el.getBoundingClientRect().width") <= width + 1
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["viewport"]["width"]
    table.evaluate("el => { el.scrollLeft = el.scrollWidth; }")
    assert table.evaluate("el => el.scrollLeft") > 0
    table.evaluate("el => { el.scrollLeft = 0; }")
    screenshot(page, "phone-table")


# --- 6. Copied ---------------------------------------------------------------------------


def test_copied_is_said_by_the_copy_button_itself_for_a_moment_over_nothing_else(new_page, alice, providers):
    conversation = conversation_for(alice, "Copy me", "hi", "Something worth copying.")
    page = new_page(alice, **DESKTOP)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_chat(page, f"/c/{conversation.pk}/")
    reply = last_reply(page)
    reply.get_by_role("button", name="Copy answer").click()
    copied = reply.get_by_role("button", name="Copied")
    expect(copied).to_be_visible()
    expect(copied).to_have_attribute("title", "Copied")
    # Nothing is drawn beside the button, over the Regenerate icon.
    assert copied.evaluate("el => getComputedStyle(el, '::after').content") in ("none", "normal")
    box, regenerate = copied.bounding_box(), reply.get_by_role("button", name="Regenerate").bounding_box()
    assert box["x"] + box["width"] <= regenerate["x"]
    screenshot(page, "copied")
    expect(reply.get_by_role("button", name="Copy answer")).to_be_visible()  # then it is Copy again
    expect(reply.get_by_role("button", name="Copy answer")).to_have_attribute("title", "Copy answer")


# --- 9. Retry ----------------------------------------------------------------------------


def test_every_failed_or_interrupted_answer_has_a_labelled_retry(new_page, alice, providers, fake):
    conversation = conversation_for(alice, "Flaky", "first question", "partial one", "second question", "partial two")
    first, second = conversation.messages.filter(role="assistant").order_by("id")
    first.status, first.error = "failed", "The upstream refused the request (502): Bad gateway."
    first.save()
    second.status = "interrupted"
    second.save()
    page = new_page(alice, **DESKTOP)
    open_chat(page, f"/c/{conversation.pk}/")
    replies = page.locator("article.message.assistant")
    expect(replies).to_have_count(2)
    for index in range(2):
        retry = replies.nth(index).get_by_role("button", name="Retry", exact=True)
        expect(retry).to_be_visible()
        expect(retry).to_have_text("Retry")
    screenshot(page, "retry")
    replies.first.get_by_role("button", name="Retry", exact=True).click()  # the older one
    expect(replies).to_have_count(1)
    wait_done(replies.first)
    assert fake.app.last().body["messages"][-1]["content"] == "first question"
    expect(replies.first.get_by_role("button", name="Retry", exact=True)).to_be_hidden()


# --- 4. the full-size image viewer -------------------------------------------------------


def test_the_image_viewer_shows_the_whole_image_fitted_and_centred_and_zooms_on_click(
    new_page, alice, providers, screen
):
    providers["api14"].image_models = "openai/gpt-5-mini"
    providers["api14"].save()
    page = new_page(alice, **SCREENS[screen])
    open_chat(page)
    choose_model(page, API14_MINI)
    paste(page, "photo.png", files.image(1200, 800, color=(30, 120, 200)), "image/png")
    ready(page, 1)
    wait_done(send(page, "what is in this photo?"))
    page.locator("article.message.user").get_by_role("button", name="Open photo.png full size").click()
    image = page.locator("#image-full")
    expect(image).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())
    view = SCREENS[screen]["viewport"]
    box = image.bounding_box()
    # All of it, in proportion, inside the screen and centred.
    assert abs(box["width"] / box["height"] - 1.5) < 0.02, box
    assert box["x"] >= 0 and box["y"] >= 0, box
    assert box["x"] + box["width"] <= view["width"] and box["y"] + box["height"] <= view["height"], box
    assert abs(box["x"] * 2 + box["width"] - view["width"]) <= 2, box
    assert abs(box["y"] * 2 + box["height"] - view["height"]) <= 2, box
    assert box["width"] >= min(1200, view["width"] - 40), box  # as large as the screen lets it be
    screenshot(page, f"image-viewer-{screen}")
    image.click()
    zoomed = image.bounding_box()
    assert zoomed["width"] >= max(1200, box["width"] * 2) - 1, zoomed
    stage = page.locator(".image-stage")
    assert stage.evaluate("el => el.scrollWidth > el.clientWidth")
    image.click(position={"x": 10, "y": 10})
    expect(image).to_have_css("max-width", "100%")
    assert image.bounding_box()["width"] == pytest.approx(box["width"], abs=1)
    page.keyboard.press("Escape")
    expect(image).to_be_hidden()


# --- 5. error banners go with their cause; the picker marks the models that take images -------------

NOTES = b"# Launch checklist\n\n- book the room\n"


def test_error_banners_go_once_their_cause_is_gone_and_the_picker_marks_image_models(new_page, alice, providers, fake):
    providers["api14"].image_models = "openai/gpt-5-mini"
    providers["api14"].save()
    page = new_page(alice, **DESKTOP)
    open_chat(page)
    options = page.locator("#model option")
    expect(options.filter(has_text="openai/gpt-5-mini")).to_have_text("openai/gpt-5-mini · images")
    expect(options.filter(has_text="claude-sonnet-5")).to_have_text("claude-sonnet-5")
    notice = page.locator("#notice")
    # A model two providers serve names its provider: closed, the picker shows only the option.
    twin = Provider.objects.create(name="infyrence-eu", base_url=providers["infyrence"].base_url, api_key=FAKE_KEY)
    page.reload()
    open_chat(page)
    expect(options.filter(has_text="claude-sonnet-5")).to_have_text(
        ["claude-sonnet-5 · infyrence", "claude-sonnet-5 · infyrence-eu"]
    )
    twin.delete()
    # A refused file, then a valid one: the refusal goes.
    drop(page, "data.bin", bytes(range(256)) * 8, "application/octet-stream")
    expect(notice).to_contain_text("data.bin")
    expect(notice).to_contain_text("not supported")
    drop(page, "notes.md", NOTES, "text/markdown")
    ready(page, 1)
    expect(notice).to_be_hidden()
    page.get_by_role("button", name="Remove notes.md").click()
    # An image for a model that takes none, then a model that does: the refusal goes, the message is sent.
    choose_model(page, CLAUDE)
    paste(page, "screenshot.png", files.image(50, 50), "image/png")
    ready(page, 1)
    box = page.get_by_label("Message")
    box.fill("What is this?")
    box.press("Enter")
    expect(notice).to_contain_text("does not accept images")
    choose_model(page, API14_MINI)
    expect(notice).to_be_hidden()
    box.press("Enter")
    wait_done(last_reply(page))
    expect(notice).to_be_hidden()
    assert fake.app.last().body["model"] == "openai/gpt-5-mini"


# --- 12. a silent stall says so ------------------------------------------------------------


def test_a_stream_that_goes_silent_says_it_is_waiting_for_the_model(page):
    reply = send(page, "[[delay:30]] [[chunks:40]] [[fault:stall]] then nothing")
    waiting = reply.locator(".message-waiting")
    expect(reply.locator(".answer")).not_to_be_empty()
    expect(waiting).to_have_text(re.compile(r"^Waiting for the model… nothing for \d+ s$"))
    expect(reply).to_have_attribute("data-status", "streaming")
    screenshot(page, "stalled")
    page.get_by_role("button", name="Stop").click()
    wait_done(reply, "stopped")
    expect(waiting).to_be_hidden()


def test_a_stream_whose_browser_goes_offline_says_the_connection_is_lost_and_ends_once_back(page):
    reply = send(page, "[[delay:100]] [[chunks:150]] a long one")
    wait_longer_while_streaming(page, reply, 20)
    page.context.set_offline(True)
    waiting = reply.locator(".message-waiting")
    expect(waiting).to_have_text("Connection lost; reconnecting…")
    expect(page.locator("#reconnecting")).to_be_visible()
    page.context.set_offline(False)
    reply = last_reply(page)
    wait_done(reply, timeout=60_000)
    expect(reply.locator(".answer")).to_contain_text(filler(150)[-40:])
    expect(reply.locator(".message-waiting")).to_be_hidden()


# --- 2. the first message, typed before the page's scripts are ready ----------------------

APP_MODULE = re.compile(r"/static/chat/app\.[0-9a-f]+\.js$")


def test_a_message_sent_before_the_scripts_are_ready_goes_out_once_they_are(new_page, alice, providers, fake):
    page = new_page(alice, **DESKTOP)
    held = []
    page.route(APP_MODULE, lambda route: held.append(route))
    page.goto("/", wait_until="commit")
    box = page.get_by_label("Message")
    send_button = page.get_by_role("button", name="Send")
    expect(box).to_be_editable()
    expect(send_button).to_have_attribute("aria-disabled", "true")  # it does not look ready
    box.fill("typed before the page was ready")
    box.press("Enter")
    expect(box).to_have_value("typed before the page was ready")  # not a new line
    page.wait_for_function("() => document.documentElement.dataset.earlySend !== undefined")
    screenshot(page, "early-send")
    assert held, "the main module was not requested"
    held[0].continue_()
    user = page.locator("article.message.user")
    expect(user).to_have_count(1)
    expect(user).to_contain_text("typed before the page was ready")
    wait_done(last_reply(page))
    expect(box).to_have_value("")
    expect(send_button).not_to_have_attribute("aria-disabled", "true")
    assert fake.app.last().body["messages"][-1]["content"] == "typed before the page was ready"


def test_send_pressed_before_the_scripts_are_ready_is_no_native_submit_and_sends_once_ready(
    new_page, alice, providers, fake
):
    conversation = conversation_for(alice, "Earlier", "hi", "hello")  # it goes to the conversation open
    page = new_page(alice, **PHONE)
    held = []
    page.route(APP_MODULE, lambda route: held.append(route))
    page.goto(f"/c/{conversation.pk}/", wait_until="commit")
    box = page.get_by_label("Message")
    expect(box).to_be_editable()
    box.fill("sent with the button")
    navigations = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    send_button = page.get_by_role("button", name="Send")
    expect(send_button).to_have_attribute("aria-disabled", "true")
    send_button.click(force=True)  # it looks not ready (aria-disabled), yet a person can press it
    page.wait_for_function("() => document.documentElement.dataset.earlySend !== undefined")
    assert not navigations and page.url.endswith(f"/c/{conversation.pk}/")  # no native form submit left the page
    expect(box).to_have_value("sent with the button")
    held[0].continue_()
    replies = page.locator("article.message.assistant")
    expect(replies).to_have_count(2)  # the conversation's answer, and the new one
    wait_done(replies.nth(1))
    expect(page.locator("article.message.user").last).to_contain_text("sent with the button")
    assert [m["content"] for m in fake.app.last().body["messages"]] == ["hi", "hello", "sent with the button"]
    assert Conversation.objects.count() == 1 and conversation.messages.count() == 4


# --- installable ----------------------------------------------------------------------------


def test_the_chat_is_installable_with_a_manifest_and_icons_and_keeps_no_offline_copy(new_page, alice, providers):
    page = new_page(alice, **PHONE)
    open_chat(page)
    href = page.locator("link[rel=manifest]").get_attribute("href")
    cdp = page.context.new_cdp_session(page)
    found = cdp.send("Page.getAppManifest")
    assert found["url"].endswith(href) and not found["errors"], found
    anonymous = new_page()  # a browser fetches the manifest without cookies
    response = anonymous.request.get(href)
    assert response.ok and response.headers["content-type"].startswith("application/manifest+json")
    manifest = response.json()
    assert manifest["start_url"] == "/" and manifest["scope"] == "/" and manifest["display"] == "standalone"
    assert manifest["name"] == "Team chat"
    purposes = {(icon["sizes"], icon["purpose"]) for icon in manifest["icons"]}
    assert {("192x192", "any"), ("512x512", "any"), ("512x512", "maskable")} <= purposes
    for icon in manifest["icons"]:
        width, height = (int(n) for n in icon["sizes"].split("x"))
        size = page.evaluate(
            """(src) => new Promise((resolve, reject) => {
                const image = new Image();
                image.onload = () => resolve([image.naturalWidth, image.naturalHeight]);
                image.onerror = reject;
                image.src = src;
            })""",
            icon["src"],
        )
        assert size == [width, height], (icon, size)
    # Chromium's own verdict; a test's browser context is an incognito one, which alone may install nothing.
    errors = cdp.send("Page.getInstallabilityErrors")["installabilityErrors"]
    assert [error["errorId"] for error in errors if error["errorId"] != "in-incognito"] == [], errors
    # It opens on the chat, and nothing keeps answers offline: no service worker at all.
    assert page.evaluate("() => navigator.serviceWorker.getRegistrations().then((r) => r.length)") == 0


@pytest.mark.parametrize("path", ["/settings/", "/settings/tokens/", "/docs/api/"])
def test_the_settings_token_and_api_pages_fit_a_phone(new_page, alice, providers, path):
    """A long model name in a select, the tokens table, the guide's code: each scrolls or wraps, the page does not."""
    from chat.models import ApiToken

    ApiToken.issue(alice, "the laptop's nightly evaluation scripts")
    page = new_page(alice, **PHONE)
    page.goto(path)
    expect(page.locator("main")).to_be_visible()
    if path == "/docs/api/":
        expect(page.get_by_test_id("api-guide").locator("pre").first).to_be_visible()  # drawn by its script
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["viewport"]["width"]


def test_switching_to_a_short_version_leaves_no_scroll_button_behind(new_page, alice, providers):
    """Read up to the ‹ › of a long version, switch to a short one: nothing is below, so no ↓ button."""
    from chat.models import Message

    chat = Conversation.objects.create(owner=alice, title="versions", model=CLAUDE)
    asked = Message.objects.create(conversation=chat, role="user", content="the long version")
    Message.objects.create(conversation=chat, role="assistant", parent=asked, content=filler(300), model="m")
    edited = Message.objects.create(conversation=chat, role="user", content="the short version")
    chat.current = Message.objects.create(
        conversation=chat, role="assistant", parent=edited, content="Short.", model="m"
    )
    chat.save()
    page = new_page(alice, **PHONE)
    page.goto(f"/c/{chat.pk}/")
    question = page.locator("article.message.user").first
    question.get_by_role("button", name="Previous version").click()
    expect(page.get_by_text("the long version")).to_be_visible()
    to_bottom = page.locator("#to-bottom")
    page.locator("#messages").evaluate("el => { el.scrollTop = 0; }")  # up to the question, as a reader scrolls
    expect(to_bottom).to_be_visible()
    question.get_by_role("button", name="Next version").click()
    expect(page.get_by_text("the short version")).to_be_visible()
    expect(to_bottom).to_be_hidden()


def test_a_draft_stays_with_its_conversation_through_a_switch_and_a_reload(new_page, alice, providers):
    """What is typed is kept per conversation: it does not follow the person into the next conversation, and
    comes back in its own after a switch or a reload; sending it clears it."""
    older = conversation_for(alice, "Older chat", "hello", "hi there")
    page = new_page(alice, **DESKTOP)
    open_chat(page)
    box = page.get_by_label("Message")
    box.fill("a draft for a new chat")
    page.get_by_role("link", name="Older chat").click()
    expect(page).to_have_url(re.compile(rf"/c/{older.pk}/$"))
    expect(box).to_have_value("")  # not the new chat's draft
    box.fill("a reply to the older chat, half written")
    page.reload()
    open_chat(page, f"/c/{older.pk}/")
    expect(box).to_have_value("a reply to the older chat, half written")
    page.get_by_role("button", name="New chat", exact=True).click()
    expect(box).to_have_value("a draft for a new chat")
    box.press("Enter")
    wait_done(page.locator("article.message.assistant").last)
    expect(box).to_have_value("")
    page.get_by_role("button", name="New chat", exact=True).click()
    expect(box).to_have_value("")  # sent, so gone
    # The "too long" notice goes as soon as the text is short enough again, not only at the next send.
    box.fill("x" * 100_001)
    box.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("The message is too long")
    box.fill("short now")
    expect(page.get_by_role("alert")).to_have_count(0)
