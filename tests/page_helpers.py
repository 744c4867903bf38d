"""Helpers for the real-browser tests of the chat page (tests/page/test_page.py)."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from django.conf import settings
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect, sync_playwright

from chat.models import Conversation, Message
from tests.conftest import session_cookie

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
I14 = "i14/i14-sugarglider-nemotron3-super-120B-v1"
API14_MINI = "api14/openai/gpt-5-mini"
CLAUDE = "infyrence/claude-sonnet-5"


def sign_in(context: BrowserContext, user, url: str) -> None:
    """A session cookie for `user`, as if they had used the login form."""
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session_cookie(user), "url": url}])


def open_chat(page: Page, path: str = "/") -> None:
    """Open the page and wait until its socket is connected and the models are listed."""
    page.goto(path)
    expect(page.locator("#model option").first).to_be_attached()
    expect(page.locator("html")).to_have_attribute("data-socket", "open")


def choose_model(page: Page, qualified: str) -> None:
    page.get_by_label("Model").select_option(qualified)


def send(page: Page, text: str) -> Locator:
    """Type a message, press Enter (on a touch screen tap Send), and return the reply's article once it exists."""
    before = page.locator("article.message.assistant").count()
    box = page.get_by_label("Message")
    box.fill(text)
    if page.evaluate("matchMedia('(hover: none) and (pointer: coarse)').matches"):
        page.get_by_role("button", name="Send").tap()
    else:
        box.press("Enter")
    reply = page.locator("article.message.assistant").nth(before)
    expect(reply).to_have_attribute("data-message-id", re.compile(r"^\d+$"))
    return reply


def last_reply(page: Page) -> Locator:
    return page.locator("article.message.assistant").last


def answer_length(reply: Locator) -> int:
    return reply.locator(".answer").evaluate("el => el.textContent.length")


def wait_longer_while_streaming(page: Page, reply: Locator, than: int) -> int:
    """Wait until the answer is longer than `than` characters while the reply is still streaming."""
    message_id = reply.get_attribute("data-message-id")
    handle = page.wait_for_function(
        """([id, than]) => {
            const article = document.querySelector(`article[data-message-id="${id}"]`);
            if (!article || article.dataset.status !== "streaming") return false;
            const length = article.querySelector(".answer").textContent.length;
            return length > than ? length : false;
        }""",
        arg=[message_id, than],
    )
    return handle.json_value()


def wait_done(reply: Locator, status: str = "complete", timeout: float = 30_000) -> None:
    expect(reply).to_have_attribute("data-status", status, timeout=timeout)
    # A long answer's last blocks may still be rendering in slices (render.js): aria-busy until in.
    expect(reply.locator(".answer")).not_to_have_attribute("aria-busy", "true", timeout=timeout)


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), animations="disabled")


# The page's websocket under the test's control, as a slow or unreachable server would leave it:
# `window.__sockets.hold()` keeps new sockets connecting, `refuse()` closes each one as it opens
# (the page backs off and retries), `drop()` closes the open one, `release()` lets them open.
# The sockets are real ones to the real server; only when the page sees them open is held back.
SOCKET_CONTROL = """
(() => {
  const Real = window.WebSocket;
  let mode = "%s";
  const waiting = [];
  const all = [];
  class Controlled extends Real {
    constructor(...args) {
      super(...args);
      this.held = mode !== "open";
      this.refused = mode === "refuse";
      all.push(this);
      if (this.held) waiting.push(this);
      window.__sockets.made += 1;
    }
    get readyState() {
      const state = super.readyState;
      return state === Real.OPEN && this.held ? Real.CONNECTING : state;
    }
    addEventListener(type, listener, options) {
      if (type !== "open") return super.addEventListener(type, listener, options);
      return super.addEventListener("open", (event) => {
        if (this.refused) return this.close();
        if (!this.held) return listener.call(this, event);
        this.openLater = () => listener.call(this, event);
      }, options);
    }
  }
  window.WebSocket = Controlled;
  window.__sockets = {
    made: 0,
    hold() { mode = "hold"; },
    refuse() { mode = "refuse"; },
    drop() { for (const socket of all) if (socket.readyState === Real.OPEN) socket.close(); },
    release() {
      mode = "open";
      for (const socket of waiting.splice(0)) {
        socket.held = false;
        if (socket.refused) continue;
        if (socket.openLater) socket.openLater();
      }
    },
  };
})();
"""


def control_sockets(page: Page, mode: str = "open") -> None:
    """Put the page's websockets under the test's control (see SOCKET_CONTROL); before page.goto()."""
    page.add_init_script(SOCKET_CONTROL % mode)


def conversation_for(user, title: str, *texts: str, model: str = CLAUDE) -> Conversation:
    """A finished conversation stored directly: (user, assistant) message pairs from `texts`."""
    conversation = Conversation.objects.create(owner=user, title=title, model=model)
    parent = None
    for index, text in enumerate(texts):
        role = Message.Role.USER if index % 2 == 0 else Message.Role.ASSISTANT
        parent = Message.objects.create(
            conversation=conversation, role=role, content=text, model=model.split("/", 1)[1], parent=parent
        )
    conversation.current = parent  # one branch, shown to its end
    conversation.save(update_fields=["current"])
    return conversation


@contextlib.contextmanager
def chromium():
    """Debian's Chromium (never a downloaded one), headless, for a module's browser fixture.

    Start the module's server first: Playwright's sync API keeps an event loop marked as
    running in this thread, so Django's ORM is told it is safe here meanwhile, and a server
    started now would inherit that.
    """
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    try:
        with sync_playwright() as playwright:
            browser: Browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
