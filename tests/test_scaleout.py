"""Scale-out: two daphne processes on PostgreSQL and Redis, a stream on one watched and stopped from the other."""

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
    yield servers
    for server in servers:
        server.stop()


def sign_in(server) -> str:
    with httpx.Client(base_url=server.url) as browser:
        browser.get("/accounts/login/")
        form = {"username": "carol", "password": "carol-secret-pw", "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
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
