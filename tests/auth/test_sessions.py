"""Sockets follow their session (chat/auth/session_sockets.py) and the Origin rule (chat/ws/origins.py), live.

A socket whose session ends (sign-out, a password change elsewhere, deactivation, or
a session deleted behind its back) is closed with 4401; streams go on.
"""

from __future__ import annotations

import asyncio
import io
import re
from contextlib import asynccontextmanager
from importlib import import_module

import aiohttp
import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.db import connection

from chat.models import ApiToken, Conversation, Message, Usage
from tests.conftest import session_cookie
from tests.live import LiveServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)
SLOW = "[[delay:20]] [[chunks:150]]"  # ~3 s
LONG = "[[delay:20]] [[chunks:1500]]"  # ~30 s: stopped long before its end, or the test fails
CLAUDE = "claude-sonnet-5"


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker):
    """The real server; every send/regenerate/edit re-reads the session (no cache), so a test need not wait."""
    env = {"DATABASE_URL": database_url(connection.settings_dict), "CHAT_SESSION_CHECK_SECONDS": "0"}
    with LiveServer(env) as server:
        yield server


class Browser:
    """One signed-in browser: its cookie jar (kept up to date by the server's answers) and its sockets."""

    def __init__(self, url: str, cookie: str) -> None:
        self.url = url
        self.http = httpx.AsyncClient(base_url=url, cookies={settings.SESSION_COOKIE_NAME: cookie})

    @property
    def session_key(self) -> str:
        """The newest session cookie (a password change sends a new one)."""
        return [c.value for c in self.http.cookies.jar if c.name == settings.SESSION_COOKIE_NAME][-1]

    async def post(self, path: str, **data: str) -> httpx.Response:
        """A form POST with the CSRF token the page would carry."""
        if "csrftoken" not in self.http.cookies:
            assert (await self.http.get("/")).status_code == 200
        return await self.http.post(path, data={**data, "csrfmiddlewaretoken": self.http.cookies["csrftoken"]})

    @asynccontextmanager
    async def socket(self, origin: str | None = None):
        headers = {"Origin": origin or self.url, "Cookie": f"{settings.SESSION_COOKIE_NAME}={self.session_key}"}
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(self.url.replace("http", "ws", 1) + "/ws/chat/", headers=headers) as ws:
                yield ws


@pytest.fixture
def fresh(live):
    """The server restarted: the test database's content types were made anew since it cached theirs,
    and the admin's log entry of a change points at one."""
    live.restart()


@pytest.fixture
async def browsers(live):
    """browser(user): a new session of `user` on the live server."""
    made: list[Browser] = []

    async def make(user) -> Browser:
        made.append(Browser(live.url, await sync_to_async(session_cookie)(user)))
        return made[-1]

    yield make
    for browser in made:
        await browser.http.aclose()


async def send(ws, **frame) -> None:
    await ws.send_str(orjson.dumps(frame).decode())


async def until(ws, frame_type: str, timeout: float = 20) -> list[dict]:
    frames: list[dict] = []
    while not frames or frames[-1]["type"] != frame_type:
        message = await ws.receive(timeout=timeout)
        assert message.type == aiohttp.WSMsgType.TEXT, f"socket closed ({ws.close_code}) before {frame_type!r}"
        frames.append(orjson.loads(message.data))
    return frames


async def close_code(ws, timeout: float = 30) -> int | None:
    """Read (and drop) frames until the server closes the socket; its close code."""
    async with asyncio.timeout(timeout):
        while True:
            message = await ws.receive()
            if message.type == aiohttp.WSMsgType.CLOSE:
                # The server's code as sent: aiohttp's close_code turns 1006 when its answering
                # close frame finds the server already gone.
                return message.data
            if message.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                return ws.close_code


async def settled_reply(message_id: int) -> Message:
    """The reply once the server process has saved its end (30 s at most): no event reaches the test for that."""
    for _ in range(300):
        if (reply := await Message.objects.aget(pk=message_id)).status != "streaming":
            break
        await asyncio.sleep(0.1)
    return reply


async def still_open(ws) -> bool:
    await send(ws, type="attach", conversation=999_999_999)
    return (await until(ws, "error"))[-1]["code"] == "not_found"


def text(frames: list[dict]) -> str:
    return "".join(f.get("content", "") for f in frames if f["type"] == "delta")


# --- the handshake ----------------------------------------------------------------


async def test_a_socket_without_a_session_is_accepted_then_closed_with_4401(live):
    # A handshake refused outright reaches the browser as 1006 and the page keeps reconnecting.
    url = live.url.replace("http", "ws", 1) + "/ws/chat/"
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers={"Origin": live.url}) as ws:
        assert await close_code(ws) == 4401


# --- sessions that end while their socket is open ------------------------------------


async def test_sign_out_closes_that_sessions_sockets_only_and_the_stream_goes_on(browsers, alice, providers):
    leaving, staying = await browsers(alice), await browsers(alice)
    async with leaving.socket() as ws, staying.socket() as other:
        await send(ws, type="send", conversation=None, content=SLOW, model=CLAUDE)
        started = (await until(ws, "delta"))[0]
        assert (await leaving.post("/accounts/logout/")).status_code == 302
        assert await close_code(ws) == 4401
        assert await still_open(other)
        await send(other, type="attach", conversation=started["conversation"])
        frames = await until(other, "done")
    assert frames[1]["type"] == "snapshot" and frames[-1]["status"] == "complete"
    # The socket was closed while its ~3 s stream still ran (the close takes a few ms): deltas followed.
    assert any(frame["type"] == "delta" for frame in frames[2:-1])
    reply = await Message.objects.aget(pk=started["message"])
    assert reply.content == frames[1]["content"] + text(frames[2:]) and reply.status == "complete"
    usage = await Usage.objects.aget(message=reply)
    assert usage.status == "complete" and usage.completion_tokens > 0


def test_sign_out_ends_the_session_before_its_sockets_are_told(client, alice, monkeypatch):
    # Django sends user_logged_out before it flushes the session. A tab sent to the sign-in page by
    # the 4401 that still found the session there was bounced back to the chat, then to ?next=/.
    from chat.auth import session_sockets
    from chat.ws import overload

    client.force_login(alice)
    key = client.session.session_key
    overload.users.entries[key] = "cached for new sockets"
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    told = []
    notify = session_sockets.notify_user
    monkeypatch.setattr(session_sockets, "notify_user", lambda *a: told.append((a, store.exists(key))) or notify(*a))
    assert client.post("/accounts/logout/").status_code == 302
    assert told == [((alice.pk, key), False)]
    assert key not in overload.users.entries  # the other receivers still see the session's key


async def test_a_password_change_closes_the_other_sessions_sockets_and_keeps_the_changing_one(browsers, alice):
    changing, elsewhere = await browsers(alice), await browsers(alice)
    async with elsewhere.socket() as ws:
        assert await still_open(ws)
        changed = await changing.post(
            "/accounts/password/",
            old_password="alice-secret-pw",
            new_password1="a-brand-new-secret-19",
            new_password2="a-brand-new-secret-19",
        )
        assert changed.status_code == 302
        assert await close_code(ws) == 4401
    # The session that changed the password is still signed in (under its new cookie): its sockets work.
    async with changing.socket() as ws:
        assert await still_open(ws)
    assert (await changing.http.get("/")).status_code == 200


async def deactivate_in_admin(staff: Browser, user) -> None:
    """Untick "active" on the user's admin page and save, as staff would."""
    form = await staff.http.get(f"/admin/auth/user/{user.pk}/change/")
    assert form.status_code == 200
    # The management fields of whatever inlines the user admin has (the budget one, say).
    management = dict(re.findall(r'name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)" value="(\d*)"',
                                 form.text))  # fmt: skip
    saved = await staff.post(
        f"/admin/auth/user/{user.pk}/change/",
        **management,
        username=user.username,
        date_joined_0=user.date_joined.strftime("%Y-%m-%d"),
        date_joined_1=user.date_joined.strftime("%H:%M:%S"),
        _save="Save",
    )  # is_active left out: the checkbox unticked
    assert saved.status_code == 302, saved.text


async def test_deactivating_a_user_in_the_admin_closes_all_their_sockets(fresh, browsers, alice, django_user_model):
    admin = await sync_to_async(django_user_model.objects.create_superuser)("root", password="root-secret-pw")
    first, second = await browsers(alice), await browsers(alice)
    staff = await browsers(admin)
    async with first.socket() as one, second.socket() as two:
        assert await still_open(one) and await still_open(two)
        await deactivate_in_admin(staff, alice)
        assert await close_code(one) == 4401 and await close_code(two) == 4401
    assert not (await django_user_model.objects.aget(pk=alice.pk)).is_active


async def test_deactivation_deletes_sessions_stops_streams_refuses_tokens_and_keeps_the_history(
    fresh, browsers, alice, admin_user, providers, fake
):
    browser, staff = await browsers(alice), await browsers(admin_user)
    _, secret = await sync_to_async(ApiToken.issue)(alice, "script")
    token = {"Authorization": f"Bearer {secret}"}
    assert (await browser.http.get("/v1/models", headers=token)).status_code == 200
    async with browser.socket() as ws:
        await send(ws, type="send", conversation=None, content=LONG, model=CLAUDE)
        started = (await until(ws, "delta"))[0]
        await deactivate_in_admin(staff, alice)
        assert await close_code(ws) == 4401
    assert not await Session.objects.filter(session_key=browser.session_key).aexists()
    assert (await browser.http.get("/v1/models", headers=token)).status_code == 401
    # The stream was stopped, not left to run: the upstream saw its client go, well before its end.
    assert await asyncio.to_thread(fake.app.last().disconnected.wait, 30)
    reply = await settled_reply(started["message"])
    assert reply.status == "stopped"
    assert await Conversation.objects.filter(owner=alice).acount() == 1
    assert (await Usage.objects.aget(message=reply)).status == "stopped"


async def test_manage_py_deactivate_deletes_sessions_and_refuses_tokens(browsers, alice, bob):
    mine, theirs = await browsers(alice), await browsers(bob)
    _, secret = await sync_to_async(ApiToken.issue)(alice, "script")
    out = io.StringIO()
    await sync_to_async(call_command)("deactivate", "alice", stdout=out)
    assert "alice deactivated" in out.getvalue()
    assert not await Session.objects.filter(session_key=mine.session_key).aexists()
    assert await Session.objects.filter(session_key=theirs.session_key).aexists()
    assert (await mine.http.get("/")).status_code == 302  # to the sign-in page
    assert (await mine.http.get("/v1/models", headers={"Authorization": f"Bearer {secret}"})).status_code == 401
    await sync_to_async(call_command)("deactivate", "alice", stdout=out)
    assert "already deactivated" in out.getvalue()


async def test_manage_py_deactivate_from_another_process_closes_sockets_and_stops_streams_in_a_second(
    browsers, alice, providers, fake
):
    """Without Redis the command cannot reach the server: the server notices the account within a second."""
    browser = await browsers(alice)
    async with browser.socket() as ws:
        await send(ws, type="send", conversation=None, content=LONG, model=CLAUDE)
        started = (await until(ws, "delta"))[0]
        await sync_to_async(call_command)("deactivate", "alice", stdout=io.StringIO())
        assert await close_code(ws) == 4401
    assert await asyncio.to_thread(fake.app.last().disconnected.wait, 30)  # the stream was stopped
    # Stopped, not complete: noticed by the account check (every CHAT_ACCOUNT_CHECK_SECONDS, 1 s) while
    # the ~30 s stream still ran, not at its end.
    assert (await settled_reply(started["message"])).status == "stopped"


async def test_a_bulk_deactivation_that_sends_no_signal_still_closes_the_sockets(
    browsers, alice, bob, django_user_model
):
    async with (await browsers(alice)).socket() as ws, (await browsers(bob)).socket() as bobs:
        assert await still_open(ws)
        await django_user_model.objects.filter(pk=alice.pk).aupdate(is_active=False)
        assert await close_code(ws) == 4401
        assert await still_open(bobs)


async def test_deleting_a_user_in_the_admin_closes_their_sockets(fresh, browsers, alice, bob, admin_user):
    staff, other = await browsers(admin_user), await browsers(bob)
    async with (await browsers(alice)).socket() as ws, other.socket() as bobs:
        assert await still_open(ws)
        assert (await staff.http.get(f"/admin/auth/user/{alice.pk}/delete/")).status_code == 200
        assert (await staff.post(f"/admin/auth/user/{alice.pk}/delete/", post="yes")).status_code == 302
        assert await close_code(ws) == 4401
        assert await still_open(bobs)


@pytest.mark.parametrize("frame_type", ["send", "regenerate", "edit"])
async def test_a_session_deleted_behind_the_sockets_back_is_refused_at_the_next_frame(
    browsers, alice, providers, frame_type
):
    conversation = await Conversation.objects.acreate(owner=alice, title="old", model=CLAUDE)
    asked = await Message.objects.acreate(conversation=conversation, role="user", content="hi")
    await Message.objects.acreate(conversation=conversation, role="assistant", content="hello")
    frames = {
        "send": {"conversation": conversation.pk, "content": "more"},
        "regenerate": {"conversation": conversation.pk},
        "edit": {"message": asked.pk, "content": "changed"},
    }
    browser = await browsers(alice)
    async with browser.socket() as ws:
        assert await still_open(ws)
        # No signal fires for this (like `clearsessions` or a row deleted by hand): only the frame check sees it.
        await Session.objects.filter(session_key=browser.session_key).adelete()
        await send(ws, type=frame_type, **frames[frame_type])
        assert await close_code(ws) == 4401
    assert await Message.objects.filter(conversation=conversation).acount() == 2


# --- the Origin rule --------------------------------------------------------------


@pytest.fixture
async def cookie(alice) -> str:
    return await sync_to_async(session_cookie)(alice)


async def handshake(url: str, cookie: str, origin: str | None, host: str | None = None, **headers: str) -> int:
    """The HTTP status of a signed-in websocket handshake (101 when accepted)."""
    headers["Cookie"] = f"{settings.SESSION_COOKIE_NAME}={cookie}"
    if origin is not None:
        headers["Origin"] = origin
    if host is not None:
        headers["Host"] = host
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url.replace("http", "ws", 1) + "/ws/chat/", headers=headers):
                return 101
        except aiohttp.WSServerHandshakeError as refused:
            return refused.status


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:9999",  # another port on the same host
        "https://127.0.0.1",
        "https://127.0.0.1:{port}",  # another scheme, same port
        "ftp://127.0.0.1",
        "ftp://127.0.0.1:{port}",
        "http://evil.example",
        "http://127.0.0.1.evil.example:{port}",
        "null",
        None,
    ],
)
async def test_origins_other_than_the_servers_own_are_refused(live, cookie, origin):
    origin = origin and origin.format(port=live.port)
    assert await handshake(live.url, cookie, origin) == 403


async def test_the_servers_own_origins_are_accepted(live, cookie):
    assert await handshake(live.url, cookie, live.url) == 101
    assert await handshake(live.url, cookie, f"http://localhost:{live.port}", host=f"localhost:{live.port}") == 101
    # A host not in DJANGO_ALLOWED_HOSTS is not an origin of ours even when Origin and Host agree.
    evil = f"evil.example:{live.port}"
    assert await handshake(live.url, cookie, f"http://{evil}", host=evil) == 403


@pytest.fixture(scope="module")
def proxied(django_db_setup, django_db_blocker):
    """The server behind a TLS proxy, with trusted origins."""
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "DJANGO_HTTPS": "1",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,chat.example.com",
        "DJANGO_CSRF_TRUSTED_ORIGINS": "https://admin.example.com,https://*.corp.example",
    }
    with LiveServer(env) as server:
        yield server


@pytest.mark.parametrize(
    ("origin", "forwarded_proto", "status"),
    [
        ("https://chat.example.com", "https", 101),  # the proxy says https: the page was https
        ("http://chat.example.com", "https", 403),
        ("https://chat.example.com", None, 403),  # no proxy header: the socket itself was plain ws
        ("https://admin.example.com", None, 101),  # trusted
        ("https://team.corp.example", "https", 101),  # a subdomain of a trusted wildcard
        ("https://corp.example.evil", "https", 403),
        ("http://admin.example.com", None, 403),  # trusted origins are matched with their scheme
        ("https://admin.example.com:8443", None, 403),  # and port
    ],
)
async def test_behind_a_tls_proxy_and_trusted_origins(proxied, cookie, origin, forwarded_proto, status):
    headers = {"X-Forwarded-Proto": forwarded_proto} if forwarded_proto else {}
    assert await handshake(proxied.url, cookie, origin, host="chat.example.com", **headers) == status


# --- failures of the layer or the database ---------------------------------------------


async def test_a_channel_layer_error_at_connect_leaves_a_working_socket(connect, alice, monkeypatch, caplog):
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    group_add = layer.group_add

    async def failing_for_user_groups(group, channel):
        if group.startswith("chat.user."):
            raise ConnectionError("the layer is down")
        return await group_add(group, channel)

    monkeypatch.setattr(layer, "group_add", failing_for_user_groups)
    accepted, _, socket = await connect(alice)
    assert accepted
    await socket.send(type="attach", conversation=424242)
    assert (await socket.receive())["code"] == "not_found"
    assert "could not add a socket of user" in caplog.text


async def test_a_database_error_while_checking_the_session_does_not_sign_anyone_out(
    connect, alice, monkeypatch, caplog, settings
):
    from chat.auth import session_sockets

    settings.CHAT_SESSION_CHECK_SECONDS = 0

    def broken(*args):
        raise ConnectionError("the database is down")

    monkeypatch.setattr(session_sockets, "session_is_valid", broken)
    _, _, socket = await connect(alice)
    await socket.send(type="send", conversation=424242, content="hi")
    assert (await socket.receive())["code"] == "not_found"  # the frame went on to its own checks
    assert "could not check the session" in caplog.text
