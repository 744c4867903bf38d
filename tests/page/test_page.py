"""The chat page in a real Chromium, against the real server (daphne) and the fake upstream.

Nothing here sleeps to synchronise: Playwright's expect() and wait_for_function() poll the
page, and "it grows while it streams" is checked by capturing a length and waiting for more.
"""

from __future__ import annotations

import json
import re
import threading

from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection
from playwright.sync_api import expect

from chat.models import ApiToken, Conversation, Message
from fakeupstream.texts import filler_pieces, reasoning_pieces
from tests.live import LiveServer, database_url
from tests.page_helpers import (
    API14_MINI,
    CLAUDE,
    answer_length,
    choose_model,
    control_sockets,
    conversation_for,
    last_reply,
    open_chat,
    screenshot,
    send,
    wait_done,
    wait_longer_while_streaming,
)

expect.set_options(timeout=15_000)
ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"


def filler(chunks: int) -> str:
    """The text the fake streams for [[chunks:N]]."""
    return "".join(filler_pieces(chunks)).strip()


# --- signing in -------------------------------------------------------------------


def test_sign_in_through_the_form_and_a_wrong_password_is_refused(new_page, alice, providers):
    page = new_page()
    page.goto("/c/1/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/c/1/"))  # every chat URL needs a user
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("not-her-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("correct username and password")
    screenshot(page, "login-error")
    page.get_by_label("Password").fill("alice-secret-pw")
    page.get_by_role("button", name="Sign in").click()
    # /c/1/ is nobody's: a 404 proves the redirect kept `next`; then the chat itself.
    expect(page.get_by_role("heading", name="Not Found")).to_be_visible()
    open_chat(page)
    expect(page.locator(".sidebar-foot .username")).to_have_text("alice")
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))


def test_signing_out_in_another_tab_sends_this_tab_to_the_sign_in_page(new_page, alice, providers):
    page = new_page(alice)
    open_chat(page)
    other = page.context.new_page()  # a second tab of the same browser: the same session
    open_chat(other)
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(re.compile(r"/accounts/login/$"))
    # The first tab's socket is closed with 4401 and the page goes to sign in, to come back where it was.
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=%2F$"))
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_a_page_whose_session_ended_while_its_socket_was_down_goes_to_sign_in(new_page, alice, providers):
    """The reconnect is refused with 4401 (accepted, then closed): before, a refused handshake looked
    like a network drop (1006) and the page kept reconnecting, saying so, forever."""
    page = new_page(alice)
    sockets = []

    def through(ws):  # the page's websocket, passed through to the server as it is
        sockets.append(ws)
        ws.connect_to_server()

    page.route_web_socket(re.compile(r"/ws/chat/$"), through)
    open_chat(page)
    session = next(c["value"] for c in page.context.cookies() if c["name"] == settings.SESSION_COOKIE_NAME)
    Session.objects.filter(session_key=session).delete()  # expired, or cleared
    sockets[-1].close(code=1012)  # as the page sees a server restart
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=%2F$"))


def test_change_password(new_page, alice, providers):
    page = new_page(alice)
    open_chat(page)
    page.get_by_role("link", name="Change password").click()
    page.get_by_label("Old password").fill("alice-secret-pw")
    page.get_by_label("New password", exact=True).fill("a-brand-new-secret-19")
    page.get_by_label("New password confirmation").fill("a-brand-new-secret-19")
    page.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("heading", name="Password changed")).to_be_visible()
    alice.refresh_from_db()
    assert alice.check_password("a-brand-new-secret-19")


# --- streaming ----------------------------------------------------------------------


def test_send_and_watch_the_reply_grow_while_it_streams(page):
    expect(page.get_by_role("button", name="New chat")).to_be_visible()
    expect(page.locator("#demo-banner")).to_have_count(0)  # real providers: no demo banner
    box = page.get_by_label("Message")
    box.fill("first line")
    box.press("Shift+Enter")  # a new line, not a send
    box.press_sequentially("second line")
    assert box.input_value() == "first line\nsecond line"
    height = box.evaluate("el => el.offsetHeight")
    box.press("Shift+Enter")
    box.press("Shift+Enter")
    assert box.evaluate("el => el.offsetHeight") > height  # it grows with the text
    reply = send(page, "[[delay:40]] [[chunks:120]] hello")
    first = wait_longer_while_streaming(page, reply, 0)
    # The box keeps the focus and takes the next message meanwhile, but one stream per conversation.
    expect(box).to_be_focused()
    box.fill("the next question")
    box.press("Enter")
    expect(box).to_have_value("the next question")
    expect(page.locator("article.message.user")).to_have_count(1)
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    expect(page.get_by_role("button", name="Send")).to_be_hidden()
    second = wait_longer_while_streaming(page, reply, first)
    assert second > first
    screenshot(page, "streaming")
    wait_done(reply)
    expect(reply.locator(".answer")).to_have_text(filler(120))
    expect(box).to_have_value("the next question")  # kept, to send now
    expect(page.get_by_role("button", name="Send")).to_be_visible()
    expect(page).to_have_url(re.compile(r"/c/\d+/$"))


def test_reasoning_streams_in_an_open_thinking_block_that_folds_when_the_answer_starts(page):
    reply = send(page, "[[reasoning:60]] [[delay:40]] [[chunks:30]] think first")
    thinking = reply.locator("details.thinking")
    # Checked in the page at every frame: open, titled "Thinking…", growing, no answer yet.
    thinking_now = """([article, than]) => {
        const details = article.querySelector("details.thinking");
        const length = details.querySelector(".thinking-body").textContent.length;
        const ok = article.dataset.status === "streaming" && details.open && length > than
            && details.querySelector("summary").textContent === "Thinking…"
            && article.querySelector(".answer").textContent === "";
        return ok ? length : false;
    }"""
    article = reply.element_handle()
    length = page.wait_for_function(thinking_now, arg=[article, 0]).json_value()
    page.wait_for_function(thinking_now, arg=[article, length])
    screenshot(page, "thinking")
    expect(reply.locator(".answer")).not_to_be_empty()
    expect(thinking).not_to_have_attribute("open", "")  # folded as soon as the answer starts
    wait_done(reply)
    reasoning = "".join(reasoning_pieces(60))
    # 60 reasoning chunks 40 ms apart: about 2.4 s of thinking, measured by the server and stored (in ms:
    # no less than the chunks' pauses, and a loaded machine only lengthens it; ten times that is no unit).
    thought = Message.objects.get(pk=int(reply.get_attribute("data-message-id"))).thinking_ms
    assert 2000 <= thought <= 24_000, thought
    seconds = int(thought / 1000 + 0.5)  # the page's Math.round, not Python's round half to even
    expect(thinking.locator("summary")).to_have_text(f"Thought for {seconds} s")
    expect(thinking).not_to_have_attribute("open", "")
    expect(thinking.locator(".thinking-body")).to_have_text(reasoning.strip())
    page.reload()  # a finished message keeps it, folded
    reply = last_reply(page)
    expect(reply.locator("details.thinking summary")).to_have_text(f"Thought for {seconds} s")
    expect(reply.locator("details.thinking")).not_to_have_attribute("open", "")


def test_the_thinking_block_follows_long_reasoning_unless_scrolled_up(page):
    reply = send(page, "[[reasoning:2000]] [[delay:5]] [[chunks:5]] think at length")
    body = reply.locator(".thinking-body")
    at_bottom = """body => body.scrollHeight > body.clientHeight + 50
        && body.scrollHeight - body.scrollTop - body.clientHeight < 30"""
    page.wait_for_function(at_bottom, arg=body.element_handle())
    length = body.evaluate("body => { body.scrollTop = 0; return body.textContent.length; }")
    grown = "([body, than]) => body.textContent.length > than + 200"
    page.wait_for_function(grown, arg=[body.element_handle(), length])
    assert body.evaluate("body => body.scrollTop") == 0  # the reader's place is kept


def test_a_tool_call_answer_shows_each_call_folded(page):
    reply = send(page, "[[tools]] what is the weather")
    wait_done(reply)
    calls = reply.locator("details.tool-call")
    expect(calls).to_have_count(2)
    expect(calls.first.locator("summary")).to_have_text("Tool call: get_weather")
    expect(calls.first).not_to_have_attribute("open", "")
    calls.first.locator("summary").click()
    expect(calls.first.locator("code")).to_contain_text('"')
    screenshot(page, "tool-call")
    page.reload()  # stored with the message
    expect(last_reply(page).locator("details.tool-call")).to_have_count(2)


def test_a_request_that_never_started_shows_no_guessed_usage(page):
    reply = send(page, "[[status:500]] fail at once")
    wait_done(reply, "failed")
    expect(reply.locator(".usage")).to_be_hidden()
    expect(reply.locator(".message-error")).to_be_visible()


def test_markdown_table_highlighted_code_and_copy_button(new_page, alice, providers):
    page = new_page(alice, permissions=["clipboard-read", "clipboard-write"])
    open_chat(page)
    reply = send(page, "show me markdown")
    wait_done(reply)
    answer = reply.locator(".answer")
    expect(answer.locator("table th").first).to_have_text("What")
    expect(answer.locator("ul > li")).to_have_count(3)
    expect(answer.locator("strong").first).to_have_text("demo upstream")
    block = answer.locator(".code-block")
    expect(block.locator(".code-lang")).to_have_text("python")
    expect(block.locator("code.language-python .hljs-keyword").first).to_have_text("def")
    block.get_by_role("button", name="Copy code").click()
    expect(block.get_by_role("button", name="Copy code")).to_have_text("Copied")
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied == 'def greet(name: str) -> str:\n    return f"Hello, {name}!"'
    screenshot(page, "finished")


def test_finished_blocks_are_not_rendered_again_while_the_answer_streams(page):
    reply = send(page, "[[delay:30]] incremental")
    article = reply.element_handle()
    # Mark the first paragraph once the table is there, mid-stream (checked at every frame)...
    page.wait_for_function(
        """(article) => {
            const table = article.querySelector(".answer table");
            if (!table || article.dataset.status !== "streaming") return false;
            article.querySelector(".answer p").dataset.probe = "kept";
            return true;
        }""",
        arg=article,
    )
    # ...and, blocks later, still mid-stream, it is the very same node: it was not rendered again.
    page.wait_for_function(
        """(article) => article.dataset.status === "streaming" && article.querySelector(".answer .code-block")
            && article.querySelector(".answer p").dataset.probe === "kept" """,
        arg=article,
    )
    wait_done(reply)


def test_a_20000_token_answer_streams_smoothly(page):
    paragraph = "Some **bold** words, a [link](https://example.com/) and `code` in a sentence. " * 4
    document = "\n\n".join(f"## Part {i}\n\n{paragraph}\n\n- one\n- two" for i in range(240))
    assert len(document) // 4 >= 20_000  # [[echo]] streams it 4 characters at a time
    page.evaluate(
        """() => {
            window.__longest = 0;
            new PerformanceObserver((list) => {
                for (const entry of list.getEntries()) window.__longest = Math.max(window.__longest, entry.duration);
            }).observe({ type: "longtask" });
        }"""
    )
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Max tokens").fill("30000")  # above the server's default of 8192
    # Typing 80 kB into a textarea is slow in any page (the browser's editing code): set it at once.
    box = page.get_by_label("Message")
    box.evaluate("(el, text) => { el.value = text; el.dispatchEvent(new Event('input')); }", "[[echo]] " + document)
    page.evaluate("() => { window.__longest = 0; }")
    box.press("Enter")
    reply = last_reply(page)
    expect(reply).to_have_attribute("data-status", "streaming")
    wait_done(reply, timeout=60_000)
    expect(reply.locator(".answer h2")).to_have_count(240)
    expect(reply.locator(".message-status")).to_be_hidden()
    longest = page.evaluate("() => window.__longest")
    # The page never froze: its longest task is 100-400 ms here, with the server and the fake beside it.
    assert longest < 5000, f"a task of {longest:.0f} ms blocked the page"

    # The fake sends that burst in a second or two; at a model's pace the page paints once per
    # frame for minutes. Replay it so, 8 tokens per frame: each paint must stay cheap however
    # long the answer already is (a renderer redoing the whole text per frame fails here).
    timing = page.evaluate(
        """async (text) => {
            const { StreamRenderer } = await import("/static/chat/render.js");
            const root = document.createElement("div");
            root.className = "answer";
            document.getElementById("thread").append(root);
            const renderer = new StreamRenderer(root);
            // The nodes each paint adds or removes: a paint that redraws the whole answer touches them all.
            const changes = new MutationObserver(() => {});
            changes.observe(root, { childList: true, subtree: true });
            let longest = 0, total = 0, frames = 0, touched = 0;
            for (let i = 0; i < text.length && total < 60000; i += 32, frames++) {
                renderer.append(text.slice(i, i + 32));
                const start = performance.now();
                renderer.flush();
                const took = performance.now() - start;
                total += took;
                longest = Math.max(longest, took);
                const nodes = changes.takeRecords().map((r) => r.addedNodes.length + r.removedNodes.length);
                touched = Math.max(touched, nodes.reduce((a, b) => a + b, 0));
            }
            renderer.finish();
            changes.disconnect();
            return { longest, total, frames, touched, headings: root.querySelectorAll("h2").length,
                     nodes: root.querySelectorAll("*").length };
        }""",
        document,
    )
    assert timing["headings"] == 240 and timing["frames"] >= 2500, timing
    # Each paint touches the few nodes of the open block (about 30), not the answer's thousands.
    assert timing["touched"] < 100 and timing["nodes"] > 2000, timing
    # About 2 s of paints in all, none over 50 ms, here: asserted ten times looser, as wall-clock times.
    assert timing["total"] < 25_000 and timing["longest"] < 1000, timing


def test_user_message_html_is_shown_as_text(page):
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    reply = send(page, "<b>bold?</b> <img src=x onerror=alert(4)>\nsecond line [[chunks:3]]")
    wait_done(reply)
    for _ in range(2):  # as sent, then as loaded from the server
        user = page.locator("article.message.user").last
        expect(user.locator(".user-text")).to_have_text(
            "<b>bold?</b> <img src=x onerror=alert(4)>\nsecond line [[chunks:3]]"
        )
        assert user.locator("b, img").count() == 0
        page.reload()
    assert dialogs == []


def test_html_and_javascript_in_a_reply_do_nothing(page):
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    foreign: list[str] = []
    page.on("request", lambda request: "example.org" in request.url and foreign.append(request.url))
    reply = send(
        page,
        "[[echo]] <img src=x onerror=alert(1)> <script>alert(2)</script> [link](javascript:alert(3)) "
        "[fine](https://example.com/) ![pixel](https://example.org/pixel.png)",
    )
    wait_done(reply)
    messages = page.locator("#messages")
    expect(reply.locator(".answer")).to_contain_text("<img src=x onerror=alert(1)> <script>alert(2)</script>")
    assert messages.locator("img").count() == 0
    assert messages.locator("script").count() == 0
    assert messages.locator('a[href^="javascript:"]').count() == 0
    expect(reply.locator(".answer a", has_text="link")).not_to_have_attribute("href", re.compile("."))
    fine = reply.locator('.answer a[href="https://example.com/"]')
    expect(fine).to_have_attribute("rel", "noopener noreferrer")
    expect(fine).to_have_attribute("target", "_blank")
    page.reload()
    expect(last_reply(page).locator(".answer")).to_contain_text("<script>alert(2)</script>")
    assert page.locator("#messages img, #messages script").count() == 0
    assert dialogs == [] and foreign == []


# --- stop, reload, errors -------------------------------------------------------------


def test_stop_keeps_the_partial_answer_marked_stopped(page):
    reply = send(page, "[[delay:40]] [[chunks:200]] a long one")
    wait_longer_while_streaming(page, reply, 20)
    page.get_by_role("button", name="Stop").click()
    wait_done(reply, "stopped")
    expect(reply.locator(".message-status")).to_have_text("Stopped")
    partial = reply.locator(".answer").inner_text()
    assert 20 < len(partial) < len(filler(200))
    expect(page.get_by_label("Message")).to_be_enabled()
    page.reload()
    reply = last_reply(page)
    expect(reply).to_have_attribute("data-status", "stopped")
    expect(reply.locator(".answer")).to_have_text(partial)


def test_keyboard_escape_stops_and_ctrl_shift_o_starts_a_new_chat(page):
    reply = send(page, "[[delay:40]] [[chunks:200]] stop me")
    wait_longer_while_streaming(page, reply, 0)
    page.keyboard.press("Escape")
    wait_done(reply, "stopped")
    page.keyboard.press("Control+Shift+O")
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("article.message")).to_have_count(0)
    expect(page.get_by_role("heading", level=1)).to_have_text("New chat")
    expect(page.get_by_label("Message")).to_be_focused()


def test_reload_mid_stream_resumes_and_ends_complete(page):
    reply = send(page, "[[delay:30]] [[chunks:200]] survive a reload")
    message_id = reply.get_attribute("data-message-id")
    wait_longer_while_streaming(page, reply, 30)
    page.reload()
    reply = page.locator(f'article[data-message-id="{message_id}"]')
    before = wait_longer_while_streaming(page, reply, 0)
    wait_longer_while_streaming(page, reply, before)  # still growing after the reload
    wait_done(reply)
    expect(reply.locator(".answer")).to_have_text(filler(200))
    expect(page.locator("#conversation-list a", has_text="survive a reload")).to_have_attribute(
        "href", re.compile(r"^/c/\d+/$")
    )


def test_a_second_tab_on_the_same_conversation_follows_the_stream(page):
    wait_done(send(page, "[[chunks:3]] start here"))
    other = page.context.new_page()
    open_chat(other, page.url)
    reply = send(page, "[[delay:30]] [[chunks:100]] watch me from the other tab")
    mirrored = other.locator(f'article[data-message-id="{reply.get_attribute("data-message-id")}"]')
    grown = wait_longer_while_streaming(other, mirrored, 0)
    wait_longer_while_streaming(other, mirrored, grown)
    expect(other.locator("article.message.user .user-text").last).to_have_text(
        "[[delay:30]] [[chunks:100]] watch me from the other tab"
    )
    wait_done(mirrored)
    expect(mirrored.locator(".answer")).to_have_text(filler(100))


def test_failed_upstream_shows_the_error_under_the_partial_text(page):
    choose_model(page, API14_MINI)
    reply = send(page, "[[fault:midstream]] [[chunks:40]] break please")
    wait_done(reply, "failed")
    # The upstream's words, with its code, in a sentence of ours (websocket.md: status, code and message).
    expect(reply.locator(".message-error")).to_contain_text(
        "The upstream reported an error during the answer (502): Provider disconnected; the text so far was kept."
    )
    expect(reply.locator(".message-status")).to_have_text("Failed")
    assert 0 < answer_length(reply) < len(filler(40))
    below = reply.evaluate(
        "el => !!(el.querySelector('.answer').compareDocumentPosition(el.querySelector('.message-error'))"
        " & Node.DOCUMENT_POSITION_FOLLOWING)"
    )
    assert below
    screenshot(page, "error")


def test_cut_at_max_tokens_is_shown(page):
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Max tokens").fill("12")
    reply = send(page, "[[chunks:40]] [[reasoning:0]] too long")
    wait_done(reply)
    expect(reply.locator(".message-status")).to_have_text("Cut at the max tokens limit")


def test_usage_line_shows_tokens_cost_and_time_to_first_token(page):
    choose_model(page, API14_MINI)
    reply = send(page, "[[chunks:30]] count me")
    wait_done(reply)
    usage = reply.locator(".usage")
    expect(usage).to_contain_text(re.compile(r"\d+ in"))
    expect(usage).to_contain_text("30 out")
    expect(usage).to_contain_text(re.compile(r"\$0\.\d+"))
    expect(usage).to_contain_text(re.compile(r"TTFT \d+ ms"))
    expect(usage).to_contain_text("tok/s")
    choose_model(page, "api14/deepseek/deepseek-r1")
    reply = send(page, "[[chunks:5]] and reasoning")
    wait_done(reply)
    expect(reply.locator(".usage")).to_contain_text("13 out (8 reasoning)")


# --- regenerate and edit -----------------------------------------------------------------


def test_regenerate_streams_a_new_reply(page):
    reply = send(page, "[[echo]] [[delay:10]] the same again")
    wait_done(reply)
    old_id = reply.get_attribute("data-message-id")
    reply.get_by_role("button", name="Regenerate").click()
    new = page.locator("article.message.assistant")
    expect(new).to_have_count(1)
    expect(new).not_to_have_attribute("data-message-id", old_id)
    wait_done(new)
    expect(new.locator(".answer")).to_have_text("the same again")


def test_edit_the_last_message_and_resend(page):
    reply = send(page, "[[echo]] original text")
    wait_done(reply)
    old_id = reply.get_attribute("data-message-id")
    user = page.locator("article.message.user")
    user.get_by_role("button", name="Edit").click()
    editor = page.get_by_label("Edit message")
    editor.fill("[[echo]] [[delay:10]] edited text")
    editor.press("Enter")
    new = page.locator("article.message.assistant")
    expect(new).not_to_have_attribute("data-message-id", old_id)
    wait_done(new)
    expect(new.locator(".answer")).to_have_text("edited text")
    expect(user.locator(".user-text")).to_have_text("[[echo]] [[delay:10]] edited text")
    expect(page.locator("article.message")).to_have_count(2)


# --- settings and models ---------------------------------------------------------------


def test_request_settings_go_with_the_first_message_then_are_saved_on_the_conversation(page, fake):
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Temperature").fill("0.3")
    page.get_by_label("Max tokens").fill("500")
    page.get_by_label("System prompt").fill("Answer like a pirate.")
    screenshot(page, "settings")
    expect(page.locator("#settings-note")).to_have_text("Sent with the first message of this new chat.")
    wait_done(send(page, "[[chunks:3]] ahoy"))
    body = fake.app.last().body
    assert body["temperature"] == 0.3 and body["max_tokens"] == 500
    assert body["messages"][0] == {"role": "system", "content": "Answer like a pirate."}
    expect(page.locator("#settings-note")).to_have_text("Saved on this conversation when changed.")
    # Out of range: said under the field, with the range, and neither saved nor sent.
    expect(page.locator("#temperature-hint")).to_have_text("0 to 2")
    page.get_by_label("Temperature").fill("7")
    page.get_by_label("Temperature").press("Tab")
    expect(page.locator("#temperature-error")).to_contain_text("from 0 to 2")
    expect(page.get_by_label("Temperature")).to_have_attribute("aria-invalid", "true")
    assert Conversation.objects.get().params["temperature"] == 0.3
    sent = len(fake.app.streams)
    page.get_by_label("Message").fill("[[chunks:3]] not with a bad setting")
    page.get_by_label("Message").press("Enter")
    expect(page.locator("#notice")).to_contain_text("out of range")
    expect(page.get_by_label("Temperature")).to_be_focused()
    assert len(fake.app.streams) == sent
    page.get_by_label("Message").fill("")
    page.get_by_label("Temperature").fill("0.7")
    page.get_by_label("Temperature").press("Tab")
    expect(page.locator("#settings-note")).to_have_text("Saved.")
    expect(page.locator("#temperature-error")).to_be_hidden()
    assert Conversation.objects.get().params == {"temperature": 0.7, "max_tokens": 500}
    wait_done(send(page, "[[chunks:3]] again"))
    assert fake.app.last().body["temperature"] == 0.7
    page.reload()
    page.get_by_role("button", name="Settings").click()
    expect(page.get_by_label("System prompt")).to_have_value("Answer like a pirate.")


def test_model_picker_remembers_the_last_choice_but_a_conversation_keeps_its_own(page, alice):
    conversation = conversation_for(alice, "On claude", "hi", "hello", model=CLAUDE)
    choose_model(page, API14_MINI)
    open_chat(page)
    expect(page.get_by_label("Model")).to_have_value(API14_MINI)
    page.locator("#conversation-list a", has_text="On claude").click()
    expect(page).to_have_url(re.compile(rf"/c/{conversation.pk}/$"))
    expect(page.get_by_label("Model")).to_have_value(CLAUDE)
    page.get_by_role("button", name="New chat").click()
    expect(page.get_by_label("Model")).to_have_value(API14_MINI)


def test_model_picker_shows_only_the_models_of_the_persons_groups(new_page, alice, providers):
    from django.contrib.auth.models import Group

    from chat.models import GroupDefaults, ModelAccess

    research = Group.objects.create(name="research")
    ModelAccess.objects.create(provider=providers["infyrence"]).groups.add(research)
    GroupDefaults.objects.create(group=research, default_model=API14_MINI)
    page = new_page(alice)
    open_chat(page)
    options = page.locator("#model option")
    expect(options).to_have_count(3)  # i14's one and api14's two; infyrence's are the group's
    assert not [
        value for value in options.evaluate_all("els => els.map(e => e.value)") if value.startswith("infyrence/")
    ]
    alice.groups.add(research)
    open_chat(page)
    expect(options).to_have_count(5)
    expect(page.get_by_label("Model")).to_have_value(API14_MINI)  # the group's default


# --- the sidebar ----------------------------------------------------------------------


def test_search_filters_the_sidebar_by_message_text(page, alice):
    conversation_for(alice, "Alpha notes", "where is the zebra crossing?", "down the road")
    conversation_for(alice, "Beta plan", "nothing to see", "indeed")
    open_chat(page)
    items = page.locator("#conversation-list li")
    expect(items).to_have_count(2)
    expect(items.first).to_have_text("Beta plan")  # newest first
    page.get_by_label("Search conversations").fill("zebra")
    expect(items).to_have_count(1)
    expect(items.locator(".conversation-title")).to_have_text("Alpha notes")
    expect(items.locator(".conversation-snippet")).to_have_text("where is the zebra crossing?")
    page.get_by_label("Search conversations").fill("beta")
    expect(items).to_have_text("Beta plan")
    page.get_by_label("Search conversations").fill("no such words")
    expect(items).to_have_count(0)
    expect(page.locator("#list-empty")).to_have_text("No conversation matches.")
    page.get_by_label("Search conversations").fill("")
    expect(items).to_have_count(2)


def test_rename_and_delete_a_conversation(page, alice):
    conversation = conversation_for(alice, "Old name", "hi", "hello")
    open_chat(page, f"/c/{conversation.pk}/")
    item = page.locator(f'#conversation-list li[data-conversation-id="{conversation.pk}"]')
    item.get_by_role("button", name=re.compile("^Rename")).click()
    dialog = page.get_by_role("dialog", name="Rename conversation")
    dialog.get_by_label("Title").fill("New name")
    dialog.get_by_role("button", name="Rename").click()
    expect(item.locator("a")).to_have_text("New name")
    expect(page.get_by_role("heading", level=1)).to_have_text("New name")
    conversation.refresh_from_db()
    assert conversation.title == "New name"
    # Enter in the field saves (it used to press Cancel, the form's first button); Escape cancels.
    item.get_by_role("button", name=re.compile("^Rename")).click()
    dialog.get_by_label("Title").fill("Newer name")
    dialog.get_by_label("Title").press("Enter")
    expect(item.locator("a")).to_have_text("Newer name")
    item.get_by_role("button", name=re.compile("^Rename")).click()
    dialog.get_by_label("Title").fill("Not this")
    dialog.get_by_label("Title").press("Escape")
    expect(dialog).to_be_hidden()
    expect(item.locator("a")).to_have_text("Newer name")
    item.get_by_role("button", name=re.compile("^Rename")).click()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    conversation.refresh_from_db()
    assert conversation.title == "Newer name"

    item.get_by_role("button", name=re.compile("^Delete")).click()
    confirm = page.get_by_role("dialog", name="Delete conversation?")
    expect(confirm).to_contain_text("Newer name")
    screenshot(page, "confirm-delete")
    confirm.get_by_role("button", name="Cancel").click()
    expect(confirm).to_be_hidden()
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    item.get_by_role("button", name=re.compile("^Delete")).click()
    confirm.get_by_role("button", name="Delete").click()
    expect(item).to_have_count(0)
    expect(page).to_have_url(re.compile(r"/$"))
    assert not Conversation.objects.filter(pk=conversation.pk).exists()


def test_a_rename_an_archive_and_a_delete_in_one_tab_reach_the_others(new_page, alice, providers):
    conversation = conversation_for(alice, "Old name", "hi", "hello")
    here, there = new_page(alice), new_page(alice)
    for page in (here, there):
        open_chat(page, f"/c/{conversation.pk}/")
    item = here.locator(f'#conversation-list li[data-conversation-id="{conversation.pk}"]')
    item.get_by_role("button", name=re.compile("^Rename")).click()
    here.get_by_role("dialog", name="Rename conversation").get_by_label("Title").fill("New name")
    here.get_by_role("dialog", name="Rename conversation").get_by_role("button", name="Rename").click()
    expect(there.get_by_role("heading", level=1)).to_have_text("New name")
    expect(there.locator(f'#conversation-list li[data-conversation-id="{conversation.pk}"] a')).to_have_text("New name")

    item.hover()
    item.get_by_role("button", name=re.compile("^More actions")).click()
    here.get_by_role("menuitem", name="Archive").click()
    for page in (here, there):  # the open conversation says it is archived, in the tab that did it too
        expect(page.locator("#archived-notice")).to_be_visible()
    here.locator("#archived-notice").get_by_role("button", name="Restore").click()
    expect(there.locator("#archived-notice")).to_be_hidden()

    item.get_by_role("button", name=re.compile("^Delete")).click()
    here.get_by_role("dialog", name="Delete conversation?").get_by_role("button", name="Delete").click()
    expect(there).to_have_url(re.compile(r"/$"))
    expect(there.locator("#notice")).to_contain_text("deleted in another tab")
    expect(there.locator(f'#conversation-list li[data-conversation-id="{conversation.pk}"]')).to_have_count(0)
    expect(here).to_have_url(re.compile(r"/$"))
    expect(here.locator("#notice")).to_be_hidden()  # its own doing


def test_a_turn_sent_to_a_stopping_server_goes_out_again_on_the_next_socket(new_page, alice, providers):
    """A process that has begun its graceful stop refuses new turns (server_restarting) and closes with 1012."""
    page = new_page(alice)
    sockets = []

    def stopping_first(route):
        sockets.append(route)
        server = route.connect_to_server()
        if len(sockets) > 1:
            return  # the next process: everything goes through

        def from_page(message):
            if json.loads(message).get("type") != "send":
                server.send(message)
                return
            refusal = {"type": "error", "code": "server_restarting", "message": None,
                       "detail": "This server is restarting; your message goes out again."}  # fmt: skip
            route.send(json.dumps(refusal))
            route.close(code=1012, reason="The server is restarting.")
            server.close()

        route.on_message(from_page)

    page.route_web_socket(re.compile(r"/ws/chat/$"), stopping_first)
    open_chat(page)
    reply = send(page, "[[echo]] sent again")
    wait_done(reply)
    expect(reply.locator(".answer")).to_have_text("sent again")
    expect(page.locator("#notice")).to_be_hidden()  # not "not sent": it went out on the next socket
    assert len(sockets) == 2 and Conversation.objects.filter(owner=alice).count() == 1


def test_another_user_cannot_see_the_conversation(new_page, alice, bob, providers):
    secret = conversation_for(alice, "Alice's secret plan", "the plan", "noted")
    page = new_page(bob)
    open_chat(page)
    expect(page.locator(".sidebar-foot .username")).to_have_text("bob")
    expect(page.locator("#list-empty")).to_be_visible()
    expect(page.locator("#conversation-list li")).to_have_count(0)
    response = page.goto(f"/c/{secret.pk}/")
    assert response.status == 404
    api = page.request.get(f"/api/conversations/{secret.pk}")
    assert api.status == 404


# --- the connection -------------------------------------------------------------------


def test_reconnects_after_the_server_dies_and_chats_again(page, server):
    reply = send(page, "[[delay:40]] [[chunks:400]] cut by a crash")
    wait_longer_while_streaming(page, reply, 0)
    banner = page.locator("#reconnecting")  # the page's banner (an answer's own status may say so too)
    restart = threading.Thread(target=server.restart)
    restart.start()
    try:
        expect(banner).to_be_visible()
        expect(page.locator("html")).to_have_attribute("data-socket", "down")
    finally:
        restart.join()
    expect(banner).to_be_hidden(timeout=30_000)
    # The new server marked the cut stream interrupted; the page reloaded it on reconnect.
    wait_done(reply, "interrupted")
    expect(reply.locator(".message-error")).to_contain_text("server stopped")
    reply = send(page, "[[chunks:5]] after the crash")
    wait_done(reply)
    expect(reply.locator(".answer")).to_have_text(filler(5))


def test_a_message_sent_before_the_socket_opens_goes_out_once_it_does(new_page, alice, providers):
    page = new_page(alice)
    control_sockets(page, "hold")  # the handshake is slow: the page is up, its socket is not yet
    page.goto("/")
    expect(page.locator("#model option").first).to_be_attached()
    box = page.get_by_label("Message")
    box.fill("[[chunks:3]] typed at once")
    box.press("Enter")
    expect(page.locator("#reconnecting")).to_contain_text("Connecting…")
    expect(box).to_have_value("")
    expect(page.locator("#notice")).to_be_hidden()
    page.evaluate("window.__sockets.release()")
    reply = last_reply(page)
    wait_done(reply)
    expect(reply.locator(".answer")).to_have_text(filler(3))
    expect(page.locator("#reconnecting")).to_be_hidden()
    expect(page.locator("article.message.user")).to_have_count(1)


def test_stop_pressed_while_disconnected_goes_out_when_the_socket_is_back(new_page, alice, providers):
    page = new_page(alice)
    control_sockets(page)
    open_chat(page)
    reply = send(page, "[[delay:40]] [[chunks:400]] stop me while offline")
    message_id = int(reply.get_attribute("data-message-id"))
    wait_longer_while_streaming(page, reply, 0)
    page.evaluate("window.__sockets.hold(); window.__sockets.drop()")
    expect(page.locator("html")).to_have_attribute("data-socket", "down")
    stop = page.locator("#stop")
    stop.click()
    expect(stop).to_be_disabled()
    expect(stop).to_have_attribute("aria-label", "Stopping…")
    page.evaluate("window.__sockets.release()")
    wait_done(page.locator(f'article[data-message-id="{message_id}"]'), "stopped")
    stored = Message.objects.get(pk=message_id)
    assert stored.status == "stopped" and len(stored.content) < len(filler(400))
    expect(page.locator("#send")).to_be_visible()


def test_moving_to_another_conversation_while_disconnected_keeps_url_and_content_in_step(new_page, alice, providers):
    first = conversation_for(alice, "First", "one", "first answer")
    second = conversation_for(alice, "Second", "two", "second answer")
    page = new_page(alice)
    control_sockets(page)
    open_chat(page, f"/c/{first.pk}/")
    expect(page.locator(".answer")).to_have_text("first answer")
    page.evaluate("window.__sockets.refuse(); window.__sockets.drop()")  # the server is unreachable...
    page.route("**/api/conversations/*", lambda route: route.abort())  # ...for its pages too
    expect(page.locator("html")).to_have_attribute("data-socket", "down")
    page.locator(f'#conversation-list li[data-conversation-id="{second.pk}"] a').click()
    expect(page).to_have_url(re.compile(f"/c/{second.pk}/$"))
    expect(page.get_by_text("first answer")).to_have_count(0)
    expect(page.locator("#notice")).to_contain_text("Could not open the conversation")
    # "Retry now" tries at once instead of after the backoff (by then about 4 s).
    page.wait_for_function("() => window.__sockets.made >= 4")
    made = page.evaluate("window.__sockets.made")
    page.get_by_role("button", name="Retry now").click()
    page.wait_for_function("made => window.__sockets.made > made", arg=made, timeout=1500)
    page.unroute("**/api/conversations/*")
    page.evaluate("window.__sockets.release()")  # back within the backoff's 10 s at most
    expect(page.locator(".answer")).to_have_text("second answer", timeout=20_000)
    expect(page.get_by_role("heading", level=1)).to_have_text("Second")
    expect(page.locator("#notice")).to_be_hidden()
    expect(page.locator("#reconnecting")).to_be_hidden()


# --- policy, layout, themes -----------------------------------------------------------


def test_csp_header_is_sent_and_a_full_chat_reports_no_violation(new_page, alice, providers):
    page = new_page(alice)
    page.add_init_script(
        "window.__csp = []; document.addEventListener('securitypolicyviolation',"
        " (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
    )
    console: list[str] = []
    page.on("console", lambda message: message.type in ("error", "warning") and console.append(message.text))
    response = page.goto("/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    open_chat(page)
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Temperature").fill("0.5")
    wait_done(send(page, "[[delay:5]] markdown, code and reasoning please"))
    page.get_by_label("Search conversations").fill("markdown")
    expect(page.locator("#conversation-list li")).to_have_count(1)
    page.reload()
    expect(last_reply(page).locator(".answer table")).to_be_visible()
    assert page.evaluate("() => window.__csp") == []
    assert console == []  # no refused resource, no error of any kind
    # The watch works: an inline style attribute is refused and reported.
    page.evaluate("() => document.body.insertAdjacentHTML('beforeend', '<div style=\"color: red\">x</div>')")
    page.wait_for_function("() => window.__csp.length > 0")


def test_phone_sized_screen_hides_the_sidebar_behind_a_menu_button(new_page, alice, providers):
    conversation_for(alice, "From the phone", "hi", "Hello! **Short** answer.")
    page = new_page(alice, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    open_chat(page)
    menu = page.get_by_role("button", name="Menu", exact=True)
    sidebar = page.locator("#sidebar")
    expect(menu).to_be_visible()
    expect(sidebar).to_be_hidden()
    menu.click()
    expect(sidebar).to_be_visible()
    expect(menu).to_have_attribute("aria-expanded", "true")
    screenshot(page, "phone-menu")
    page.locator("#conversation-list a", has_text="From the phone").click()
    expect(sidebar).to_be_hidden()
    expect(last_reply(page).locator(".answer strong")).to_have_text("Short")
    wait_done(send(page, "[[chunks:12]] from a small screen"))
    screenshot(page, "phone")


def test_dark_mode(new_page, alice, providers):
    page = new_page(alice, color_scheme="dark")
    open_chat(page)
    wait_done(send(page, "[[reasoning:4]] dark please"))
    background = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    red, green, blue = (int(n) for n in re.findall(r"\d+", background)[:3])
    assert red + green + blue < 3 * 60, background
    screenshot(page, "dark")


def test_demo_banner_when_the_only_provider_is_the_built_in_demo(new_page, alice):
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "DEMO_UPSTREAM": "1",
        "UPSTREAM_BASE_URL": "",
        ASYNC_UNSAFE: "",  # this process runs Playwright; the server must keep Django's checks
    }
    demo = LiveServer(env)
    demo.start()
    try:
        page = new_page(alice, url=demo.url)
        open_chat(page)
        banner = page.get_by_test_id("demo-banner")
        expect(banner).to_contain_text("demo")
        # Not staff: told whom to ask, not sent to an admin they cannot open (tests/views/test_views.py: staff).
        expect(banner).to_contain_text("Ask an administrator to connect a real model.")
        expect(banner.get_by_role("link")).to_have_count(0)
        reply = send(page, "hello demo")
        wait_done(reply, timeout=30_000)
        expect(reply.locator(".answer")).to_contain_text("demo upstream")
        # Dismissed once, it stays away on the next visit.
        page.get_by_role("button", name="Dismiss the demo notice").click()
        expect(banner).to_be_hidden()
        page.reload()
        open_chat(page)
        expect(banner).to_be_hidden()
    finally:
        demo.stop()


# --- what an upstream sends is bounded ------------------------------------------------

DAPHNE_FRAME_LIMIT = 1024 * 1024


def test_waiting_for_the_model_shows_the_elapsed_time_until_the_first_token(page):
    choose_model(page, CLAUDE)
    reply = send(page, "[[wait:12500]] [[echo]] finally")
    waiting = reply.locator(".message-waiting")
    expect(waiting).to_be_hidden()
    expect(waiting).to_have_text(re.compile(r"^Waiting for the model… 1[0-2] s$"), timeout=20_000)
    # A live region: its words are said once, the counting seconds (aria-hidden) not every second.
    expect(waiting.locator("[aria-hidden=true]")).to_have_text(re.compile(r"^ 1[0-2] s$"))
    wait_done(reply)
    expect(waiting).to_be_hidden()
    expect(reply.locator(".answer")).to_have_text("finally")


def test_a_3_mb_reply_streams_and_attaches_in_frames_under_the_limit(new_page, alice, providers, fake):
    """Deltas and the attach snapshot of a reply far over 1 MiB arrive split; the page joins them."""
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "CHAT_MAX_REPLY_BYTES": "5000000",
        ASYNC_UNSAFE: "",
    }
    with LiveServer(env) as live:
        frames: dict[str, list[str]] = {"first": [], "second": []}

        def record(page, name):
            page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames[name].append(payload)))

        first = new_page(alice, url=live.url)
        record(first, "first")
        open_chat(first)
        choose_model(first, CLAUDE)
        # Held after 7 events (the role's, then 1.5 MB): the second tab attaches while it streams.
        reply = send(first, "[[chunks:12]] [[size:250000]] [[hold:7]] three megabytes")
        message_id = reply.get_attribute("data-message-id")
        wait_longer_while_streaming(first, reply, 1_100_000)  # over 1 MiB already: the snapshot is split

        second = new_page(alice, url=live.url)
        record(second, "second")
        open_chat(second, first.url)
        mirrored = second.locator(f'article[data-message-id="{message_id}"]')
        wait_longer_while_streaming(second, mirrored, 1_100_000)  # the snapshot, in parts
        fake.app.last().released.set()
        wait_done(reply, timeout=60_000)
        wait_done(mirrored, timeout=60_000)
        stored = Message.objects.get(pk=message_id).content
        assert len(stored) == 3_000_000
        text = "".join(stored.split())
        for article in (reply, mirrored):  # the page shows every character (paragraphs as paragraphs)
            assert article.locator(".answer").evaluate("el => el.textContent.replace(/\\s+/g, '')") == text
    for name, received in frames.items():
        sizes = [len(payload.encode()) if isinstance(payload, str) else len(payload) for payload in received]
        assert sizes and max(sizes) < DAPHNE_FRAME_LIMIT, (name, max(sizes))
    assert any('"type":"snapshot_part"' in payload for payload in frames["second"] if isinstance(payload, str))


# --- the month's budget in the sidebar ---------------------------------------------------------


def test_sidebar_shows_the_month_so_far_warns_at_80_percent_and_updates_after_each_answer(new_page, alice, providers):
    from decimal import Decimal

    from chat.models import Budget, Price, Usage
    from tests.conftest import MODELS

    Budget.objects.create(user=alice, usd=Decimal("1.00"))
    Usage.objects.create(user=alice, model="m", status="complete", total_tokens=10, cost=Decimal("0.79"))
    Price.objects.create(model=MODELS["i14"], prompt=Decimal("1000"), completion=Decimal("1000"))
    page = new_page(alice)
    open_chat(page)
    meter = page.get_by_test_id("budget")
    expect(meter).to_contain_text("$0.79 of $1.00")
    expect(page.get_by_role("meter")).to_have_attribute("aria-valuenow", "79")
    expect(page.locator("#budget-warning")).to_be_hidden()
    # An answer priced at $1,000 a million tokens takes the month past 80 %.
    wait_done(send(page, "[[chunks:40]] [[reasoning:0]] a pricey answer"))
    expect(meter).not_to_contain_text("$0.79 of $1.00")
    expect(page.locator("#budget-warning")).to_contain_text("% of your monthly budget; it resets on ")
    # Used up: the next message is refused with the sentence, and the meter says so.
    Usage.objects.create(user=alice, model="m", status="complete", cost=Decimal("1"))
    box = page.get_by_label("Message")
    box.fill("one more")
    box.press("Enter")
    expect(page.locator("#notice-text")).to_contain_text("Your monthly budget of $1.00 is used up")
    expect(box).to_have_value("one more")  # nothing typed is lost
    expect(page.locator("#budget-warning")).to_contain_text("Your monthly budget is used up; it resets on ")
    expect(page.get_by_role("meter")).to_have_attribute("aria-valuenow", "100")


def test_sidebar_shows_spending_without_a_bar_when_there_is_no_budget(page):
    expect(page.get_by_test_id("budget")).to_contain_text("$0.00 spent")
    expect(page.get_by_role("meter")).to_be_hidden()


# --- small things a new user hits ------------------------------------------------------


def test_copy_answer_says_copied_and_leaves_out_leading_blank_lines(new_page, alice, providers):
    conversation = conversation_for(alice, "Copy me", "hi", "\n\n  Indented first line\n\nSecond.\n")
    page = new_page(alice)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_chat(page, f"/c/{conversation.pk}/")
    page.get_by_role("button", name="Copy answer").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == "  Indented first line\n\nSecond."
    expect(page.get_by_role("button", name="Copy answer")).to_be_visible()  # the label comes back


def test_a_remote_image_shows_its_alt_text_and_link_and_is_never_fetched(new_page, alice, providers):
    answer = "Look: ![a chart of sales](https://images.example.com/chart.png) and ![](http://x.example/p.gif)"
    conversation = conversation_for(alice, "Pictures", "hi", answer)
    page = new_page(alice)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    open_chat(page, f"/c/{conversation.pk}/")
    links = page.locator(".answer a.remote-image")
    expect(links).to_have_count(2)
    expect(links.first).to_have_text("🖼 a chart of sales")
    expect(links.first).to_have_attribute("href", "https://images.example.com/chart.png")
    expect(links.nth(1)).to_have_text("🖼 image")
    expect(page.locator(".answer img")).to_have_count(0)
    assert not [url for url in requested if "example" in url]


def test_tokens_page_from_the_chat_secret_once_with_a_copy_button_and_the_api_guide(new_page, alice, providers):
    page = new_page(alice)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_chat(page)
    page.get_by_role("link", name="API tokens").click()
    expect(page).to_have_url(re.compile("/settings/tokens/$"))
    name = page.get_by_label("Name of a new token")
    assert name.bounding_box()["width"] > 200  # styled like the other fields, not a tiny default box
    name.fill("laptop")
    held = []  # the page's module waits until the test lets it run, as on a slow connection

    def hold(route):
        held.append(route.request.url)
        held_here = "window.runTokensModule = run; document.documentElement.dataset.tokensHeld = '';"
        body = f"await new Promise((run) => {{ {held_here} }});\n" + route.fetch().text()
        route.fulfill(body=body, content_type="text/javascript")

    page.route(re.compile(r"/tokens/tokens[^/]*\.js$"), hold)
    page.get_by_role("button", name="Create token").click()
    secret = page.get_by_test_id("new-token").text_content()
    assert secret.startswith("sk-chat-")
    copy = page.get_by_role("button", name="Copy")
    expect(copy).to_be_disabled()  # a click before the module runs would do nothing
    assert held
    # Awaited as an attribute: wait_for_function evaluates a string, which the page's CSP refuses.
    expect(page.locator("html")).to_have_attribute("data-tokens-held", "")
    page.evaluate("window.runTokensModule()")
    copy.click()
    expect(page.locator("#copy-status")).to_have_text("Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    screenshot(page, "tokens")
    page.reload()  # neither a second token nor the secret again
    expect(page.get_by_test_id("new-token")).to_have_count(0)
    expect(page.locator(".token-list tbody tr")).to_have_count(1)
    assert ApiToken.objects.filter(user=alice).count() == 1
    page.get_by_role("link", name="API guide").click()
    guide = page.get_by_test_id("api-guide")
    expect(guide.get_by_role("heading", level=1)).to_have_text("The OpenAI-compatible API")
    expect(guide.locator(".code-block").first).to_be_visible()
    screenshot(page, "api-guide")


def test_a_missing_conversation_url_shows_a_styled_page_with_a_way_back(new_page, alice, providers):
    page = new_page(alice)
    response = page.goto("/c/999999999/")
    assert response.status == 404
    expect(page.get_by_role("heading", level=1)).to_have_text("Page not found")
    page.get_by_role("link", name="Back to the chat").click()
    expect(page).to_have_url(re.compile("/$"))


def test_a_long_sidebar_title_uses_the_whole_row_until_its_buttons_show(new_page, alice, providers):
    long = conversation_for(alice, "A rather long title that needs the whole width of the sidebar row", "hi", "ho")
    conversation_for(alice, "Other", "hi", "ho")  # opened, so the long one is not the active row
    page = new_page(alice)
    open_chat(page)
    row = page.locator(f'#conversation-list li[data-conversation-id="{long.pk}"]')
    link = row.locator("a")
    row_box, link_box = row.bounding_box(), link.bounding_box()
    assert link_box["width"] >= row_box["width"] - 1  # no room kept for invisible buttons
    row.hover()
    expect(row.get_by_role("button", name=re.compile("^Rename"))).to_be_visible()
    buttons = row.locator(".conversation-actions").bounding_box()  # with its left padding
    text_end = link.evaluate("a => a.getBoundingClientRect().right - parseFloat(getComputedStyle(a).paddingRight)")
    assert text_end <= buttons["x"] + 1  # the title's ellipsis comes before the buttons


def test_an_error_shows_one_sentence_and_folds_the_rest(new_page, alice, providers):
    conversation = conversation_for(alice, "Broken", "hi", "partial")
    reply = conversation.messages.get(role="assistant")
    reply.status, reply.error = (
        "failed",
        "The upstream refused the request (502): Bad gateway. " + "<html>x</html> " * 40,
    )
    reply.save()
    page = new_page(alice)
    open_chat(page, f"/c/{conversation.pk}/")
    error = page.locator(".message-error")
    expect(error).to_contain_text("The upstream refused the request (502): Bad gateway.")
    details = error.locator("details")
    expect(details).not_to_have_attribute("open", "")
    expect(details.locator("pre")).to_be_hidden()
    details.locator("summary").click()
    expect(details.locator("pre")).to_contain_text("<html>x</html>")


def test_scrolled_up_during_a_stream_a_button_brings_the_reader_back_down(page):
    reply = send(page, "[[delay:20]] [[chunks:800]] a long one")
    messages = page.get_by_test_id("messages")
    overflowing = "el => el.scrollHeight > el.clientHeight + 400"
    page.wait_for_function(overflowing, arg=messages.element_handle())
    button = page.get_by_role("button", name="Scroll to the bottom")
    expect(button).to_be_hidden()  # following the answer at the bottom
    messages.evaluate("el => { el.scrollTop = 0; }")
    expect(button).to_be_visible()
    length = answer_length(reply)
    wait_longer_while_streaming(page, reply, length + 100)
    assert messages.evaluate("el => el.scrollTop") == 0  # the reader's place is kept
    button.click()
    expect(button).to_be_hidden()
    near_bottom = "el => el.scrollHeight - el.scrollTop - el.clientHeight < 80"
    wait_longer_while_streaming(page, reply, answer_length(reply) + 100)
    assert messages.evaluate(near_bottom)  # following again
