"""The real server as `make run` starts it: daphne, the demo upstream, a websocket over a socket."""

import aiohttp
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from chat.models import Message, Provider, Usage
from tests.conftest import FAKE_KEY, session_cookie
from tests.live import LiveServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)


async def chat_over_websocket(url: str, user, frame: dict, origin: str | None = None) -> list[dict]:
    """Open /ws/chat/ with the user's session, send one frame, collect frames up to `done` or `error`."""
    cookie = await sync_to_async(session_cookie)(user)
    headers = {"Origin": origin or url, "Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"}
    frames: list[dict] = []
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url.replace("http", "ws") + "/ws/chat/", headers=headers) as ws:
            await ws.send_str(orjson.dumps(frame).decode())
            async for message in ws:
                frames.append(orjson.loads(message.data))
                if frames[-1]["type"] in ("done", "error"):
                    break
    return frames


async def test_with_no_upstream_configured_the_demo_provider_answers(alice):
    env = {"DATABASE_URL": database_url(connection.settings_dict), "DEMO_UPSTREAM": "", "UPSTREAM_BASE_URL": ""}
    server = LiveServer(env)
    await sync_to_async(server.start)()
    try:
        frames = await chat_over_websocket(server.url, alice, {"type": "send", "conversation": None, "content": "hi"})
        assert frames[0]["type"] == "started" and frames[0]["provider"] == "demo"
        assert frames[-1]["type"] == "done" and frames[-1]["status"] == "complete"
        text = "".join(f.get("content", "") for f in frames if f["type"] == "delta")
        assert "demo upstream" in text and "> hi" in text
        assert any(f.get("reasoning") for f in frames)
        reply = await Message.objects.aget(pk=frames[0]["message"])
        assert reply.content == text and reply.status == "complete"
        assert not (await Usage.objects.aget(message=reply)).estimated
        demo = await Provider.objects.aget(name="demo")
        assert demo.base_url == f"{server.url}/_demo/i14/v1"
        assert "built-in demo upstream" in server.output()
        # In the server's own process the demo's directives are capped (DEMO_CAPS): 5000 chunks, not 15 million.
        big = {"type": "send", "conversation": None, "content": "[[chunks:15000000]] [[delay:0]] [[reasoning:0]]"}
        frames = await chat_over_websocket(server.url, alice, big)
        assert frames[-1]["status"] == "complete" and frames[-1]["finish_reason"] == "stop"
        reply = await Message.objects.aget(pk=frames[0]["message"])
        assert len(reply.content.split()) == 5000
        # A provider of the team's own, added in the admin: new chats go to it, not to the canned demo.
        await Provider.objects.acreate(name="acme", base_url=demo.base_url, api_key=demo.api_key)
        frames = await chat_over_websocket(server.url, alice, {"type": "send", "conversation": None, "content": "hi"})
        assert frames[0]["type"] == "started" and frames[0]["provider"] == "acme", frames[0]
    finally:
        await sync_to_async(server.stop)()


async def test_provider_key_never_reaches_a_socket_or_a_log(server, alice, providers):
    providers["i14"].api_key = "wrong-key-but-still-secret"
    await providers["i14"].asave()
    for content in ("hello", "[[status:500]] hi", "[[status:400]] [[echoauth]] an upstream echoing the key"):
        frames = await chat_over_websocket(
            server.url, alice, {"type": "send", "conversation": None, "content": content, "model": "claude-sonnet-5"}
        )
        assert frames[-1]["type"] == "done"
    frames = await chat_over_websocket(
        server.url,
        alice,
        {"type": "send", "conversation": None, "content": "hi", "model": "i14-sugarglider-nemotron3-super-120B-v1"},
    )
    assert frames[-1]["status"] == "failed" and "401" in frames[-1]["error"]
    for secret in (FAKE_KEY, "wrong-key-but-still-secret"):
        assert secret not in orjson.dumps(frames).decode()
        assert secret not in server.output()


async def test_foreign_origin_is_refused_by_the_real_server(server, alice):
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await chat_over_websocket(server.url, alice, {"type": "attach", "conversation": 1}, "https://evil.example")
    assert refused.value.status == 403


async def test_stopping_the_server_mid_stream_ends_the_stream_as_interrupted(alice, providers):
    server = LiveServer({"DATABASE_URL": database_url(connection.settings_dict), "SHUTDOWN_GRACE_SECONDS": "1"})
    await sync_to_async(server.start)()
    cookie = await sync_to_async(session_cookie)(alice)
    headers = {"Origin": server.url, "Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(server.url.replace("http", "ws") + "/ws/chat/", headers=headers) as ws:
                frame = {"type": "send", "conversation": None, "content": "[[delay:20]] [[chunks:2000]]",
                         "model": "claude-sonnet-5"}  # fmt: skip
                await ws.send_str(orjson.dumps(frame).decode())
                seen = []
                while len([f for f in seen if f["type"] == "delta"]) < 5:
                    seen.append(orjson.loads((await ws.receive(timeout=10)).data))
                server.process.terminate()  # SIGTERM: a graceful stop, as systemd or a deploy does
                while seen[-1]["type"] != "done":
                    message = await ws.receive(timeout=10)
                    if message.type != aiohttp.WSMsgType.TEXT:
                        break
                    seen.append(orjson.loads(message.data))
        await sync_to_async(server.process.wait)(10)
        reply = await Message.objects.aget(pk=seen[0]["message"])
        assert reply.status == "interrupted" and "server stopped" in reply.error
        assert reply.content.startswith("".join(f.get("content", "") for f in seen if f["type"] == "delta"))
        usage = await Usage.objects.aget(message=reply)
        assert usage.status == "interrupted" and usage.estimated and usage.ended is not None
        assert "Unclosed client session" not in server.output()
    finally:
        await sync_to_async(server.stop)()
