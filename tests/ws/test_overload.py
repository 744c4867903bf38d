"""A busy database and a reconnect storm: the server answers and says so (chat/ws/overload.py, chat/runtime/db_busy.py).

The lock tests run their own server on their own SQLite file, and another process
holds that file's write lock (`BEGIN IMMEDIATE`) for up to 30 s, as a long
migration, a backup or a stuck writer would.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import aiohttp
import httpx
import openai
import pytest
from channels.testing import WebsocketCommunicator
from playwright.sync_api import expect, sync_playwright

from chat.ws.overload import TRY_AGAIN_LATER, ConnectGuard
from tests.conftest import FAKE_KEY, MODELS
from tests.live import LiveServer, wait_until
from tests.page_helpers import CHROMIUM, CHROMIUM_ARGS
from tests.proxy import TcpProxy
from tests.services import postgres_database
from tests.sites import Site, make_site

MODEL = MODELS["infyrence"]
BUSY_TEXT = "The server is busy; retrying…"

# Holds the write lock until told (a line on stdin), or for 100 s should the test die: longer than
# two of SQLite's busy timeouts (20 s) queued on the one database thread, so a wait never outlives it.
HOLDER = """
import select, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
select.select([sys.stdin], [], [], 100)
db.execute("ROLLBACK")
"""


@pytest.fixture(scope="module")
def site(fake_server, tmp_path_factory):
    """A server of its own on a SQLite file of its own, with a user, a session, a token and a provider."""
    path = str(tmp_path_factory.mktemp("locked") / "chat.sqlite3")
    made = make_site(path, fake_server.base_url("infyrence"), FAKE_KEY)
    # A send waits this long for the lock: long enough for a second connect to happen while it waits,
    # a tenth of SQLite's busy timeout (20 s), which it must not wait instead.
    with LiveServer({"DATABASE_URL": made.database_url, "API_DB_WAIT_SECONDS": "1"}) as live:
        made.url, made.server = live.url, live
        # A running server: its first chat has registered the process (its lease row) already.
        first = asyncio.run(chat_once(made, "warm up [[chunks:1]]"))
        assert first[-1]["type"] == "done", first
        yield made


@contextmanager
def write_lock(path: str):
    """Another process holds SQLite's write lock on `path` for the block (100 s at most)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        try:
            holder.stdin.write("release\n")
            holder.stdin.close()
        except BrokenPipeError:
            pass  # it already let go after its 100 s
        holder.wait(10)


def ws_url(site: Site) -> str:
    return site.url.replace("http://", "ws://") + "/ws/chat/"


async def chat_once(site: Site, content: str) -> list[dict]:
    """One message on a new socket; every frame up to `done` or an error."""
    async with aiohttp.ClientSession(cookies={"sessionid": site.session}) as http:
        async with http.ws_connect(ws_url(site), origin=site.url) as ws:
            await ws.send_json({"type": "send", "content": content, "model": MODEL})
            frames = [await next_frame(ws)]
            while frames[-1]["type"] not in ("done", "error"):
                frames.append(await next_frame(ws))
            return frames


async def next_frame(ws, timeout: float = 30) -> dict:
    message = await ws.receive(timeout=timeout)
    assert message.type == aiohttp.WSMsgType.TEXT, (message.type, message.data)
    return json.loads(message.data)


def test_a_held_write_lock_leaves_the_page_sockets_and_api_answering(site, fake):
    api = openai.OpenAI(base_url=site.url + "/v1", api_key=site.secret, max_retries=0, timeout=60)
    usage_before = site.count("chat_usage")
    with write_lock(site.path):
        started = time.monotonic()
        page = httpx.get(site.url + "/", cookies={"sessionid": site.session}, timeout=60)
        # Answered at once (~0.1 s), not after SQLite's busy timeout (20 s): a page needs no write.
        assert page.status_code == 200 and time.monotonic() - started < 5

        async def sockets() -> tuple[bool, float, dict]:
            async with aiohttp.ClientSession(cookies={"sessionid": site.session}) as http:
                async with http.ws_connect(ws_url(site), origin=site.url) as first:
                    await first.send_json({"type": "send", "content": "hello", "model": MODEL})
                    asked = time.monotonic()
                    answer = asyncio.ensure_future(next_frame(first))
                    # While that send waits for the lock (holding the one database thread), a new socket
                    # still connects: before the send's wait is over and its error is in.
                    async with http.ws_connect(ws_url(site), origin=site.url):
                        connected_first = not answer.done()
                    error = await answer
                    return connected_first, time.monotonic() - asked, error

        connected_first, error_after, error = asyncio.run(sockets())
        assert connected_first, "the second socket waited for the first one's send"
        assert error["type"] == "error" and error["code"] == "server_busy", error
        # After the send's short wait (API_DB_WAIT_SECONDS, 1 s), not SQLite's busy timeout (20 s).
        assert "busy" in error["detail"] and error_after < 15

        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert time.monotonic() - started < 15  # the same short wait
        assert refused.value.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "5"
        assert refused.value.body["code"] == "database_unavailable" and "busy" in refused.value.body["message"]
        assert len(fake.app.streams) == 0  # refused before the upstream was asked (and paid)
        # Reading needs no lock: the token (its last_used note skipped) and the models answer.
        assert MODEL in [model.id for model in api.models.list()]
    answer = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi [[chunks:3]]"}])
    assert answer.choices[0].message.content
    assert site.count("chat_usage") == usage_before + 1


@pytest.mark.slow
def test_the_usage_of_an_answer_given_while_the_lock_is_held_is_recorded_once_it_is_free(site, fake):
    api = openai.OpenAI(base_url=site.url + "/v1", api_key=site.secret, max_retries=0, timeout=60)
    complete_before = site.count("chat_usage", "status = 'complete'")
    stream = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi [[chunks:5]] [[delay:100]]"}], stream=True
    )
    with write_lock(site.path):
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        # The usage row's ending waits out SQLite's busy timeout (20 s), perhaps behind the progress
        # writer's own 20 s, fails, and is tried again later: the lock is held until the server says so.
        assert wait_until(lambda: "could not record API usage for carol yet, retrying" in site.server.output(), 100), (
            site.server.output()[-2000:]
        )
    assert wait_until(lambda: site.count("chat_usage", "status = 'complete'") > complete_before, 60), (
        site.server.output()[-2000:]
    )
    assert site.count("chat_usage", "status = 'streaming'") == 0  # ended, tokens and all


@pytest.mark.django_db
def test_a_short_wait_inside_another_gives_the_outer_ones_back():
    """A start notes its token's use (0.1 s) inside its own short wait, which must hold after it, not 20 s."""
    from django.db import connection

    from chat.runtime import db_busy

    def current() -> int:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA busy_timeout")
            return cursor.fetchone()[0]

    connection.ensure_connection()
    configured = current()
    with db_busy.short_wait(2):
        assert current() == 2000
        with db_busy.short_wait(0.1):
            assert current() == 100
        assert current() == 2000
        with db_busy.short_wait(5):
            assert current() == 2000  # the shorter of the two
        assert current() == 2000
    assert current() == configured > 2000


def test_a_database_that_is_down_answers_503_with_retry_after_everywhere(site):
    # PostgreSQL on a port where nothing listens: every query fails to connect.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with LiveServer({"DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/chat"}) as live:
        started = time.monotonic()
        api = openai.OpenAI(base_url=live.url + "/v1", api_key=site.secret, max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            api.models.list()
        assert refused.value.status_code == 503 and refused.value.response.headers["Retry-After"] == "5"
        assert refused.value.body["code"] == "database_unavailable"
        cookies = {"sessionid": site.session}
        listing = httpx.get(live.url + "/api/conversations", cookies=cookies)
        assert listing.status_code == 503 and listing.headers["Retry-After"] == "5"
        assert listing.json()["error"]["code"] == "server_busy"
        page = httpx.get(live.url + "/", cookies=cookies)
        assert page.status_code == 503 and page.text.startswith("The server is busy")
        # Refused at once (connecting fails fast), not after retries or a connect timeout.
        assert time.monotonic() - started < 10
        assert "database unavailable for GET /api/conversations" in live.output()


async def test_connects_beyond_the_rate_are_closed_with_4013_before_the_app_runs():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await receive()
        await send({"type": "websocket.accept"})

    guard = ConnectGuard(app, rate=2, in_flight=100)
    results = []
    for n in range(3):
        communicator = WebsocketCommunicator(guard, f"/ws/{n}/")
        results.append(await communicator.connect())
        if results[-1][0] and n < 2:
            await communicator.disconnect()
    assert results[:2] == [(True, None), (True, None)]
    assert results[2][0] is True  # accepted, so that the browser is told the code...
    assert (await communicator.receive_output())["code"] == TRY_AGAIN_LATER  # ...then closed at once
    assert reached == ["/ws/0/", "/ws/1/"]


async def test_connects_beyond_the_handshakes_in_flight_are_refused():
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_app(scope, receive, send):
        await receive()
        entered.set()
        await release.wait()  # a handshake stuck behind the database
        await send({"type": "websocket.accept"})

    guard = ConnectGuard(slow_app, rate=1000, in_flight=1)
    stuck = WebsocketCommunicator(guard, "/ws/")
    connecting = asyncio.ensure_future(stuck.connect(timeout=10))
    await entered.wait()
    assert guard.in_flight == 1
    refused = WebsocketCommunicator(guard, "/ws/")
    assert await refused.connect() == (True, None)
    assert (await refused.receive_output())["code"] == TRY_AGAIN_LATER
    release.set()
    assert await connecting == (True, None)
    assert guard.in_flight == 0
    again = WebsocketCommunicator(guard, "/ws/")
    assert await again.connect() == (True, None)
    await again.disconnect()
    await stuck.disconnect()


# --- the page (a real Chromium) ----------------------------------------------------


@contextmanager
def chromium_page(url: str, session: str | None = None):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(base_url=url)
        if session:
            context.add_cookies([{"name": "sessionid", "value": session, "url": url}])
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        try:
            yield page
        finally:
            browser.close()
        assert not errors, errors


@pytest.mark.browser
def test_the_page_says_the_server_is_busy_and_sends_the_message_once_it_is_not(site, fake):
    with chromium_page(site.url, site.session) as page:
        page.goto("/")
        expect(page.locator("html")).to_have_attribute("data-socket", "open", timeout=15_000)
        expect(page.locator("#model option").first).to_be_attached(timeout=15_000)
        page.get_by_label("Model").select_option(f"infyrence/{MODEL}")
        with write_lock(site.path):
            box = page.get_by_label("Message")
            box.fill("are you there? [[chunks:3]]")
            box.press("Enter")
            expect(page.locator("#notice")).to_have_text(BUSY_TEXT, timeout=20_000)
            expect(page.locator("#notice")).to_be_visible()
        # The lock is gone: the page sends the message again by itself, and it is answered once.
        reply = page.locator("article.message.assistant")
        expect(reply).to_have_attribute("data-status", "complete", timeout=30_000)
        expect(reply).to_have_count(1)
        expect(page.locator("article.message.user")).to_have_count(1)
        expect(page.locator("#notice")).to_be_hidden()
        assert len(fake.app.streams) == 1


@pytest.mark.browser
def test_the_page_backs_off_harder_when_connects_are_refused_as_overloaded(site):
    # A rate so low that every websocket connect is refused with 4013; pages still load.
    env = {"DATABASE_URL": site.database_url, "WS_CONNECTS_PER_SECOND": "0.001"}
    with LiveServer(env) as live, chromium_page(live.url) as page:
        # Anonymous is fine: the guard refuses before the session is even read.
        page.context.add_cookies([{"name": "sessionid", "value": "none", "url": live.url}])
        page.goto("/accounts/login/")
        # The pauses the page asks for before each new try (its timers over SETTLE_MS, 200 ms).
        page.evaluate("""() => import("/static/chat/socket.js").then(({ ChatSocket }) => {
            window.events = [];
            window.pauses = [];
            const setTimer = window.setTimeout;
            window.setTimeout = (callback, ms, ...rest) => {
                if (ms > 200) window.pauses.push(ms);
                return setTimer(callback, ms, ...rest);
            };
            new ChatSocket(location.origin.replace("http", "ws") + "/ws/chat/", {
                onFrame() {}, onOpen() { window.events.push("open"); },
                onDown(busy) { window.events.push(busy ? "busy" : "down"); }, onSignedOut() {},
            });
        })""")
        page.wait_for_function("() => window.pauses.length >= 2")
        events, pauses = page.evaluate("() => [window.events, window.pauses]")
        assert events and set(events) == {"busy"}, events  # a refused socket never counts as open
        # 0.5 s, then 1 s, after an ordinary close; after a 4013 the first pause is ~2 s, then ~4 s (±25 %).
        assert pauses[0] >= 1500 and pauses[1] >= 3000, pauses


@pytest.mark.browser
def test_the_page_says_the_server_is_busy_while_postgresql_is_away_and_recovers(fake_server):
    with postgres_database("ops_busy", migrated=True) as url:
        # The server reaches PostgreSQL through a proxy of this test's own, which it cuts.
        host, port = url.split("@", 1)[1].split("/", 1)[0].split(":")
        proxy = TcpProxy(host, int(port))
        proxied = url.replace(f"@{host}:{port}/", f"@127.0.0.1:{proxy.port}/")
        site = make_site("", fake_server.base_url("infyrence"), FAKE_KEY, database_url=proxied)
        try:
            with LiveServer({"DATABASE_URL": proxied}) as live, chromium_page(live.url, site.session) as page:
                page.goto("/")
                expect(page.locator("html")).to_have_attribute("data-socket", "open", timeout=15_000)
                proxy.cut()
                # The search's own 503, not only the notice: another request's 503 (the model list)
                # can show the notice first, and the search, sent after its debounce, must fail too.
                searched = lambda response: "/api/conversations?q=anything" in response.url  # noqa: E731
                with page.expect_response(searched, timeout=20_000) as refused:
                    page.get_by_label("Search conversations").fill("anything")
                assert refused.value.status == 503
                expect(page.locator("#notice-text")).to_have_text(BUSY_TEXT, timeout=20_000)
                proxy.restore()
                # The search is asked again after the 503's Retry-After and answers.
                expect(page.locator("#notice")).to_be_hidden(timeout=30_000)
                expect(page.locator("#conversation-list")).to_have_attribute("data-query", "anything")
                assert "database unavailable for GET /api/conversations" in live.output()
        finally:
            proxy.close()


async def test_the_connects_of_a_session_that_miss_the_cache_together_read_its_user_once(monkeypatch):
    from types import SimpleNamespace

    from channels.auth import UserLazyObject

    from chat.ws import overload

    reads, reading, release = [], asyncio.Event(), asyncio.Event()

    async def load_user(scope):
        reads.append(scope["session"].session_key)
        reading.set()
        await release.wait()  # the read in flight while the others connect
        return "alice"

    monkeypatch.setattr(overload, "_load_user", load_user)
    overload.users.clear()
    middleware = overload.CachedAuthMiddleware(None)
    scopes = [{"session": SimpleNamespace(session_key="s1"), "user": UserLazyObject()} for _ in range(20)]
    connects = [asyncio.ensure_future(middleware.resolve_scope(scope)) for scope in scopes]
    await reading.wait()  # by then every connect has started and missed the cache (they ran first)
    connects[0].cancel()  # the first one's tab closes: the others still get the user
    release.set()
    await asyncio.gather(*connects[1:])
    assert reads == ["s1"]
    assert [scope["user"]._wrapped for scope in scopes[1:]] == ["alice"] * 19
    assert overload.users.get("s1") == "alice"  # and it is cached for the next ones
    overload.users.clear()
