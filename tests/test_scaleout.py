"""Scale-out: two daphne processes on PostgreSQL and Redis.

A stream on one is watched and stopped from the other; a session ended on one closes its sockets on the other.
"""

import asyncio
import os
import subprocess
import sys

import aiohttp
import httpx
import orjson
import psycopg
import pytest

from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer
from tests.services import REDIS_URL, postgres_database, redis_prefix

SLOW = "[[delay:20]] [[chunks:300]]"


@pytest.fixture(scope="module")
def cluster(fake_server):
    """Two server processes sharing a fresh PostgreSQL database and a Redis channel layer."""
    with postgres_database("chat_scaleout") as database_url, redis_prefix("chat_scaleout") as prefix:
        yield from _cluster(fake_server, database_url, prefix)


def _cluster(fake_server, database_url, prefix):
    env = {
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        "REDIS_PREFIX": prefix,
        "UPSTREAM_BASE_URL": fake_server.base_url("i14"),
        "UPSTREAM_API_KEY": FAKE_KEY,
        "UPSTREAM_NAME": "i14",
        "UPSTREAM_MODEL": MODELS["i14"],
        "CHAT_ORPHAN_AFTER": "3",
    }
    setup = {**os.environ, **env, "DJANGO_SUPERUSER_PASSWORD": "carol-secret-pw"}
    for command in (["migrate", "--noinput"], ["createsuperuser", "--noinput", "--username", "carol", "--email", ""]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=setup, check=True, capture_output=True)
    servers = [LiveServer(env), LiveServer(env)]
    for server in servers:
        server.start()
    servers[0].database_url = database_url
    servers[0].setup_env = setup
    yield servers
    for server in servers:
        server.stop()


def sign_in(server, username: str = "carol", password: str = "carol-secret-pw") -> str:
    with httpx.Client(base_url=server.url) as browser:
        browser.get("/accounts/login/")
        form = {"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        assert browser.post("/accounts/login/", data=form).status_code == 302
        return browser.cookies["sessionid"]


class Tab:
    """A browser tab's websocket to one server process."""

    def __init__(self, server, cookie: str) -> None:
        self.server, self.cookie = server, cookie

    async def __aenter__(self):
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(
            self.server.url.replace("http", "ws") + "/ws/chat/",
            headers={"Origin": self.server.url, "Cookie": f"sessionid={self.cookie}"},
        )
        return self

    async def __aexit__(self, *exc_info):
        await self.ws.close()
        await self.session.close()

    async def send(self, **frame):
        await self.ws.send_str(orjson.dumps(frame).decode())

    async def until(self, frame_type: str) -> list[dict]:
        frames = []
        while not frames or frames[-1]["type"] != frame_type:
            frames.append(orjson.loads((await self.ws.receive(timeout=20)).data))
        return frames

    async def closed(self, timeout: float = 5) -> int | None:
        """Drop frames until the server closes the socket; its close code."""
        while True:
            message = await self.ws.receive(timeout=timeout)
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                return self.ws.close_code

    async def still_open(self) -> bool:
        await self.send(type="attach", conversation=999_999_999)
        return (await self.until("error"))[-1]["code"] == "not_found"


def text(frames, field="content"):
    return "".join(f.get(field, "") for f in frames if f["type"] == "delta")


async def test_attach_from_another_process_gets_snapshot_then_the_rest(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab:
        await tab.send(type="send", conversation=None, content=SLOW)
        before = await tab.until("delta")
    async with Tab(second, cookie) as other:
        await other.send(type="attach", conversation=before[0]["conversation"])
        frames = await other.until("done")
    attached, snapshot, *rest = frames
    assert attached["message"] == before[0]["message"] and snapshot["type"] == "snapshot"
    assert snapshot["content"].startswith(text(before)) and frames[-1]["status"] == "complete"
    assert all(f["seq"] > snapshot["seq"] for f in rest if f["type"] == "delta")
    with psycopg.connect(first.database_url) as db:
        (content,) = db.execute("SELECT content FROM chat_message WHERE id = %s", [snapshot["message"]]).fetchone()
    assert content == snapshot["content"] + text(rest)


async def test_stop_from_another_process(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab, Tab(second, cookie) as other:
        await tab.send(type="send", conversation=None, content=SLOW)
        started = (await tab.until("delta"))[0]
        await other.send(type="attach", conversation=started["conversation"])
        await other.until("snapshot")
        await other.send(type="stop", message=started["message"])
        mine, theirs = await tab.until("done"), await other.until("done")
    assert mine[-1]["status"] == theirs[-1]["status"] == "stopped"


async def test_a_process_that_dies_mid_stream_is_swept_by_the_other(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab:
        await tab.send(type="send", conversation=None, content="[[delay:50]] [[chunks:2000]]")
        started = (await tab.until("delta"))[0]
    async with Tab(second, cookie) as other:
        await other.send(type="attach", conversation=started["conversation"])
        seen = await other.until("snapshot")
        while len(seen) < 40:  # ~2 s of streaming: the owner has saved the text at least once
            seen += await other.until("delta")
        first.process.kill()  # the stream's owner dies; nobody saves its text any more
        done = (await other.until("done"))[-1]
    assert done["status"] == "interrupted" and "server stopped" in done["error"]
    assert done["usage"]["estimated"] and done["usage"]["completion_tokens"] > 0
    with psycopg.connect(first.database_url) as db:
        (saved,) = db.execute("SELECT content FROM chat_message WHERE id = %s", [started["message"]]).fetchone()
    assert saved and (seen[1]["content"] + text(seen)).startswith(saved)
    first.start()  # the next test gets a working pair again


async def test_api_stream_cap_holds_for_simultaneous_requests_to_both_processes(cluster):
    """Twelve requests at once, six to each process: the user's row lock lets exactly API_MAX_STREAMS (8) in."""
    first, second = cluster
    token = await asyncio.to_thread(create_token, first.database_url)
    request = {"model": MODELS["i14"], "stream": True, "messages": [{"role": "user", "content": SLOW}]}
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        opened = [
            client.stream("POST", server.url + "/v1/chat/completions", json=request) for server in (first, second) * 6
        ]
        responses = await asyncio.gather(*(stream.__aenter__() for stream in opened))
        statuses = sorted(response.status_code for response in responses)
        for stream in opened:
            await stream.__aexit__(None, None, None)
    assert statuses == [200] * 8 + [429] * 4


def create_token(database_url: str) -> str:
    env = {**os.environ, "DATABASE_URL": database_url}
    made = subprocess.run(
        [sys.executable, "manage.py", "createtoken", "carol"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    return made.stdout.decode().strip().splitlines()[-1]


def sign_out(server, cookie: str) -> None:
    with httpx.Client(base_url=server.url, cookies={"sessionid": cookie}) as browser:
        assert browser.get("/").status_code == 200
        form = {"csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        assert browser.post("/accounts/logout/", data=form).status_code == 302


async def test_signing_out_on_one_process_closes_that_sessions_sockets_on_the_other(cluster):
    first, second = cluster
    leaving, staying = sign_in(first), sign_in(first)
    async with Tab(second, leaving) as tab, Tab(first, staying) as other:
        await tab.send(type="send", conversation=None, content=SLOW)
        started = (await tab.until("delta"))[0]
        sign_out(first, leaving)
        assert await tab.closed() == 4401
        assert await other.still_open()
        # The stream the signed-out tab started goes on, on its process, to the end.
        await other.send(type="attach", conversation=started["conversation"])
        frames = await other.until("done")
    assert frames[-1]["status"] == "complete"
    with psycopg.connect(first.database_url) as db:
        (content,) = db.execute("SELECT content FROM chat_message WHERE id = %s", [started["message"]]).fetchone()
        (tokens,) = db.execute(
            "SELECT completion_tokens FROM chat_usage WHERE message_id = %s", [started["message"]]
        ).fetchone()
    assert content == frames[1]["content"] + text(frames[2:]) and tokens > 0


USER = "from django.contrib.auth.models import User"


def manage_shell(server, code: str) -> None:
    """Python in `manage.py shell`: a process of its own, on the same database and Redis."""
    run = [sys.executable, "manage.py", "shell", "-c", code]
    subprocess.run(run, cwd=ROOT, env=server.setup_env, check=True, capture_output=True, timeout=60)


async def test_set_password_and_save_anywhere_closes_the_users_sockets_on_every_process(cluster):
    first, second = cluster
    manage_shell(first, f"{USER}; User.objects.create_user('dave', password='dave-secret-pw')")
    cookies = sign_in(first, "dave", "dave-secret-pw"), sign_in(second, "dave", "dave-secret-pw")
    async with Tab(first, cookies[0]) as one, Tab(second, cookies[1]) as two, Tab(first, sign_in(first)) as carol:
        assert await one.still_open() and await two.still_open()
        manage_shell(first, f"{USER}; u = User.objects.get(username='dave'); u.set_password('new-one-42'); u.save()")
        assert await one.closed() == 4401 and await two.closed() == 4401
        assert await carol.still_open()  # another user's sockets are not touched
