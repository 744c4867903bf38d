"""One person's heavy request on a running server, and what another person meets meanwhile (the tests and the bench).

The heavy person imports a file of one long chain of messages; meanwhile another person starts a
chat reply on the websocket and a `/v1` stream, each timed from its request to its first delta.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time

import aiohttp
import httpx
import orjson

from tests.live import ROOT, wait_until

# What the server logs once an import's first batch is stored (chat/actions/imports.py): it is under way.
IMPORT_RUNNING = "messages stored"

PERSON = """
import json, sys
import django
django.setup()
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
user = get_user_model().objects.create_user(sys.argv[1], password=sys.argv[1] + "-secret-pw")
client = Client()
client.force_login(user)
print(json.dumps({"session": client.cookies[settings.SESSION_COOKIE_NAME].value}))
"""


def add_person(database_url: str, name: str) -> str:
    """A new person on that database, signed in: their session cookie."""
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PERSON, name], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])["session"]


def chain_file(count: int) -> bytes:
    """An export of one conversation: `count` messages, each answering the one before, as small as they come."""
    chain = [{"id": n, "parent": n - 1 if n else None, "role": "user" if n % 2 == 0 else "assistant"}
             for n in range(count)]  # fmt: skip
    return json.dumps({"title": "Long", "messages": chain, "current": count - 1}, separators=(",", ":")).encode()


def page_client(url: str, session: str, timeout: float = 600) -> httpx.AsyncClient:
    """An HTTP client signed in as a session, with a CSRF cookie and header as the page sends them."""
    csrf = secrets.token_hex(16)  # 32 characters: an unmasked secret, which Django accepts
    return httpx.AsyncClient(
        base_url=url, timeout=timeout, cookies={"sessionid": session, "csrftoken": csrf},
        headers={"X-CSRFToken": csrf, "Origin": url},
    )  # fmt: skip


async def post_import(url: str, session: str, body: bytes) -> httpx.Response:
    async with page_client(url, session) as client:
        return await client.post("/api/import", content=body, headers={"Content-Type": "application/json"})


async def first_ws_delta(url: str, session: str, model: str) -> float:
    """Seconds from a `send` on a fresh socket to its reply's first delta; an error frame fails."""
    async with aiohttp.ClientSession() as client:
        ws = await client.ws_connect(
            url.replace("http", "ws") + "/ws/chat/", headers={"Origin": url, "Cookie": f"sessionid={session}"}
        )
        sent = time.monotonic()
        await ws.send_str(orjson.dumps({"type": "send", "conversation": None, "content": "hi [[chunks:5]]",
                                        "model": model}).decode())  # fmt: skip
        while True:
            received = await ws.receive()
            assert received.type == aiohttp.WSMsgType.TEXT, f"socket closed: {received}"
            frame = orjson.loads(received.data)
            assert frame["type"] != "error", frame
            if frame["type"] == "delta":
                took = time.monotonic() - sent
                break
        while frame["type"] != "done":  # the reply ends before the socket does: nothing left streaming
            frame = orjson.loads((await ws.receive()).data)
        await ws.close()
        return took


async def first_v1_chunk(url: str, secret: str, model: str) -> float:
    """Seconds from a streaming `/v1/chat/completions` request to its first content chunk; any error fails."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi [[chunks:5]]"}]}
    async with httpx.AsyncClient(timeout=600) as client:
        sent = time.monotonic()
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
        ) as response:
            assert response.status_code == 200, (response.status_code, await response.aread())
            took = None
            async for line in response.aiter_lines():
                if took is None and line.startswith("data: {") and '"content"' in line:
                    took = time.monotonic() - sent
            assert took is not None
            return took


async def sign_in(url: str, name: str) -> float:
    """Seconds to sign in with a password (the form, as a browser posts it)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await client.get("/accounts/login/")
        sent = time.monotonic()
        response = await client.post("/accounts/login/", data={
            "username": name, "password": name + "-secret-pw", "csrfmiddlewaretoken": client.cookies["csrftoken"],
        }, headers={"Origin": url})  # fmt: skip
        assert response.status_code == 302, response.status_code
        return time.monotonic() - sent


async def during_import(live, importer: str, body: bytes, others, freeze: float = 60) -> tuple[list, bool, object]:
    """Start the import, wait for the server to say it is under way, then run `others` (coroutine makers) together.

    Returns what they returned, whether the import was still running when they had all finished, and its response.
    `freeze` bounds the wait for them: generous, it only catches a server that stopped answering.
    """
    importing = asyncio.ensure_future(post_import(live.url, importer, body))
    running = await asyncio.to_thread(wait_until, lambda: IMPORT_RUNNING in live.output() or importing.done(), 120)
    assert running and not importing.done(), f"the import never said it was under way: {live.output()[-3000:]}"
    try:
        async with asyncio.timeout(freeze):
            results = await asyncio.gather(*(make() for make in others))
        still_running = not importing.done()
    except BaseException:
        importing.cancel()
        raise
    return results, still_running, await importing
