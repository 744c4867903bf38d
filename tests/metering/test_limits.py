"""Limits per person, per token, per socket and per provider, against the running server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import timedelta

import aiohttp
import httpx
import openai
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from chat.metering.limits import FrameLimiter, LimitExceeded, enforce
from chat.models import ApiToken, Conversation, Message, Usage
from tests.conftest import MODELS
from tests.live import LiveServer, Tab, database_url, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
ENDLESS = "[[delay:500]] [[chunks:100000]]"  # streams for ~14 hours: until stopped


@pytest.fixture(scope="module")
def limited(django_db_setup, django_db_blocker):
    """Two server processes on the test database with small limits and a 3-connection upstream pool each."""
    from django.db import connection

    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "API_MAX_STREAMS": "3",
        "API_TOKEN_MAX_STREAMS": "2",
        "RATE_LIMIT_PER_MINUTE": "4",
        "API_TOKEN_RATE_LIMIT_PER_MINUTE": "2",
        "UPSTREAM_MAX_CONNECTIONS": "3",
        "UPSTREAM_PROVIDER_MAX_CONNECTIONS": "3",  # the default would be half the pool
        "UPSTREAM_PROVIDER_WAIT": "1",
    }
    with LiveServer(env) as first, LiveServer(env) as second:
        yield first, second


def body(content: str, model: str = I14, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


@contextlib.contextmanager
def open_streams(url: str, *requests: tuple[str, dict]):
    """Open one streaming request per (token, body) and hold them open; yields their responses."""
    with contextlib.ExitStack() as stack:
        responses = []
        for token, payload in requests:
            response = stack.enter_context(
                httpx.stream(
                    "POST",
                    url + "/v1/chat/completions",
                    json=payload,
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=30,
                )
            )
            responses.append(response)
        yield responses


def streaming_rows() -> int:
    return Usage.objects.filter(status="streaming").count()


# --- /v1: streams at once, per user and per token, across processes -------------------------


@pytest.mark.cluster
def test_api_streams_are_capped_per_token_and_per_user_across_processes(limited, alice, providers, fake):
    first, second = limited
    laptop, ci = ApiToken.issue(alice, "laptop")[1], ApiToken.issue(alice, "ci")[1]
    with open_streams(first.url, (laptop, body(ENDLESS, stream=True))) as held:
        with open_streams(second.url, (laptop, body(ENDLESS, stream=True))) as more:
            assert [r.status_code for r in held + more] == [200, 200]
            sent = len(fake.app.streams)
            # The token's third stream, on either process, is refused before anything goes upstream.
            client = openai.OpenAI(base_url=first.url + "/v1", api_key=laptop, max_retries=0)
            with pytest.raises(openai.RateLimitError) as caught:
                client.chat.completions.create(**body("one more", stream=True))
            assert caught.value.status_code == 429 and caught.value.code == "too_many_streams"
            assert "2 running" in caught.value.message and "this token" in caught.value.message
            assert len(fake.app.streams) == sent
            # Another token of the same user gets the user's third place, and no fourth.
            with open_streams(second.url, (ci, body(ENDLESS, stream=True))) as third:
                assert third[0].status_code == 200
                refused = httpx.post(
                    first.url + "/v1/chat/completions",
                    json=body("fourth"),
                    headers={"Authorization": f"Bearer {ci}"},
                )
                assert refused.status_code == 429
                error = refused.json()["error"]
                assert error["code"] == "too_many_streams" and error["type"] == "rate_limit_error"
                assert refused.headers["retry-after"] == "2"  # a short wait the SDKs' retries honour
                assert "you have 3 running" in error["message"]
                assert len(fake.app.streams) == sent + 1
                assert streaming_rows() == 3
    # Streams that end free their places.
    assert wait_until(lambda: streaming_rows() == 0)
    assert set(Usage.objects.values_list("status", flat=True)) == {"stopped"}


def test_api_usage_row_is_written_when_the_request_starts(server, alice, providers, fake):
    token = ApiToken.issue(alice, "t")[1]
    with open_streams(server.url, (token, body(ENDLESS, stream=True))):
        row = Usage.objects.get()
        assert row.status == "streaming" and row.source == "api" and row.message is None
        assert row.token.name == "t" and row.prompt_tokens > 0
    assert wait_until(lambda: Usage.objects.get().status == "stopped")


# --- rate per user and per token -----------------------------------------------------------


@pytest.mark.cluster
async def test_rate_limit_per_token_then_per_user_covers_the_page_too(limited, alice, providers, fake):
    first, _ = limited
    tokens = [(await sync_to_async(ApiToken.issue)(alice, name))[1] for name in ("a", "b")]
    clients = [openai.AsyncOpenAI(base_url=first.url + "/v1", api_key=t, max_retries=0) for t in tokens]
    for _ in range(2):
        await clients[0].chat.completions.create(**body("[[echo]] hi"))
    with pytest.raises(openai.RateLimitError) as caught:
        await clients[0].chat.completions.create(**body("[[echo]] again"))
    assert caught.value.code == "rate_limited" and "this token started 2" in caught.value.message
    retry_after = int(caught.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    for _ in range(2):
        await clients[1].chat.completions.create(**body("[[echo]] hi"))
    sent = len(fake.app.streams)
    with pytest.raises(openai.RateLimitError) as caught:
        await clients[1].chat.completions.create(**body("[[echo]] over"))
    assert caught.value.code == "rate_limited"
    # The user's 4 a minute are spent: the chat page is refused too, and nothing is stored.
    async with Tab(first, alice) as tab:
        await tab.send(type="send", conversation=None, content="hello")
        error = await tab.receive()
    assert error["type"] == "error" and error["code"] == "rate_limited" and "Try again in" in error["detail"]
    assert len(fake.app.streams) == sent
    assert await Conversation.objects.acount() == 0 and await Usage.objects.acount() == 4


@pytest.mark.cluster
def test_embeddings_count_towards_the_same_rate_limit_as_chat(limited, alice, providers, fake):
    first, _ = limited
    client = openai.OpenAI(base_url=first.url + "/v1", api_key=ApiToken.issue(alice, "embed")[1], max_retries=0)
    client.embeddings.create(model="text-embedding-3-small", input="a")
    client.chat.completions.create(**body("[[echo]] hi"))
    with pytest.raises(openai.RateLimitError) as caught:  # the token's 2 a minute: one of each
        client.embeddings.create(model="text-embedding-3-small", input="b")
    assert caught.value.code == "rate_limited"
    assert len(fake.app.embedding_requests) == 1


# --- the chat page: streams at once ----------------------------------------------------------


async def test_page_streams_are_capped_per_user(server, alice, bob, providers, fake):
    async with Tab(server, alice) as tab, Tab(server, bob) as other:
        started = []
        for _ in range(4):
            await tab.send(type="send", conversation=None, content=ENDLESS)
            frames = await tab.until("started")
            started.append(frames[-1])
            while frames[-1].get("message") != started[-1]["message"] or frames[-1]["type"] != "delta":
                frames.append(await tab.receive())  # streaming: its request has reached the upstream
        sent = len(fake.app.streams)
        await tab.send(type="send", conversation=None, content="a fifth")
        error = await tab.until("error")
        assert error[-1]["code"] == "too_many_streams" and "4 running" in error[-1]["detail"]
        assert len(fake.app.streams) == sent and await Conversation.objects.acount() == 4
        # Another user is not affected.
        await other.send(type="send", conversation=None, content="[[echo]] mine")
        assert (await other.until("done"))[-1]["status"] == "complete"
        # A stopped stream frees its place.
        await tab.send(type="stop", message=started[0]["message"])
        assert await streaming_replies_become(3)
        await tab.send(type="send", conversation=None, content="[[echo]] now")
        assert (await tab.until("started"))[-1]["type"] == "started"
        for frame in started[1:]:
            await tab.send(type="stop", message=frame["message"])
        assert await streaming_replies_become(0)


async def streaming_replies_become(count: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while await Message.objects.filter(status="streaming").acount() != count:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


# --- frames per socket ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_flood_of_attach_frames_is_refused_then_closed_cheaply(server, alice, bob, providers, fake):
    conversation = await Conversation.objects.acreate(owner=alice, title="x")
    before = cpu_seconds(server.process.pid)
    async with Tab(server, alice) as tab:
        frame = orjson.dumps({"type": "attach", "conversation": conversation.pk}).decode()
        for _ in range(5000):
            with contextlib.suppress(ConnectionResetError):
                await tab.ws.send_str(frame)
        codes, closed = [], None
        async with asyncio.timeout(30):
            while closed is None:
                message = await tab.ws.receive()
                if message.type == aiohttp.WSMsgType.TEXT:
                    codes.append(orjson.loads(message.data).get("code"))
                else:
                    closed = tab.ws.close_code
    spent = cpu_seconds(server.process.pid) - before
    assert closed == 4429
    # One error on the first refusal, one on closing (a few more if it refilled meanwhile); not one per
    # refused frame: most of the 5,000 were refused.
    assert 2 <= codes.count("rate_limited") <= 50 and codes[-1] == "rate_limited"
    # The burst (60) and its refills were served (about 60), not one answer per frame.
    assert len([c for c in codes if c is None]) <= 1000
    # Before the limit, 5,000 attach frames cost about 45 s of CPU, now about 0.15 s: CPU time, not wall-clock.
    assert spent < 5, f"{spent:.1f} s of CPU"
    async with Tab(server, bob) as other:
        await other.send(type="send", conversation=None, content="[[echo]] still served")
        assert (await other.until("done"))[-1]["status"] == "complete"


async def test_a_persons_tabs_share_one_frame_budget_and_no_tab_is_closed_for_it(server, alice, providers):
    """Each socket within its own rate, hundreds of a person's sockets kept a core busy: together they get twice
    one socket's (a burst of 120 here), and past it a frame is refused, never a socket closed."""
    conversation = await Conversation.objects.acreate(owner=alice, title="x")
    frame = orjson.dumps({"type": "attach", "conversation": conversation.pk}).decode()
    async with contextlib.AsyncExitStack() as stack:
        tabs = [await stack.enter_async_context(Tab(server, alice)) for _ in range(4)]
        for tab in tabs:
            for _ in range(55):  # within one socket's burst of 60: no socket is refused by its own bucket
                await tab.ws.send_str(frame)
        errors = [asyncio.ensure_future(tab.until("error", timeout=30)) for tab in tabs]
        done, pending = await asyncio.wait(errors, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        refused = next(iter(done)).result()[-1]
        assert refused["code"] == "rate_limited" and "your tabs together" in refused["detail"]
        assert not any(tab.ws.closed for tab in tabs)


async def test_a_person_may_have_so_many_sockets_open_and_one_more_is_told_to_try_later(server, alice, bob):
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(20):  # CHAT_MAX_SOCKETS_PER_PERSON
            await stack.enter_async_context(Tab(server, alice))
        async with Tab(server, alice) as one_more:
            assert await one_more.closed() == 4013
        async with Tab(server, bob) as someone_else:
            assert await someone_else.still_open()
        await stack.pop_all().aclose()  # the tabs closed, there is room again
    for _ in range(100):  # once the server has seen them close (no event tells the client when)
        async with Tab(server, alice) as again:
            with contextlib.suppress(ConnectionResetError):  # closed at once with 4013: no room yet
                await again.send(type="attach", conversation=999_999_999)
            reply = await again.ws.receive(timeout=20)
            if reply.type == aiohttp.WSMsgType.TEXT:
                assert orjson.loads(reply.data)["code"] == "not_found"
                break
    else:
        raise AssertionError("no room again after the tabs closed")


def test_frame_limiter_refuses_over_the_rate_and_closes_a_flood_that_goes_on():
    limiter = FrameLimiter(rate=10, burst=5, now=0.0)
    assert [limiter.take(0.0) for _ in range(5)] == ["ok"] * 5
    assert limiter.take(0.0) == "refuse" and limiter.first_refusal
    assert limiter.take(0.0) == "refuse" and not limiter.first_refusal
    assert limiter.take(0.1) == "ok"  # refilled at 10 a second
    # Three times the rate for long enough closes it.
    verdicts = [limiter.take(0.1 + k / 30) for k in range(1, 200)]
    assert "close" in verdicts and verdicts.index("close") >= 5  # not at the first excess frame
    calm = FrameLimiter(rate=10, burst=5, now=0.0)
    assert all(calm.take(k / 10) == "ok" for k in range(1, 1000))  # at the rate, never refused


# --- connections per provider ---------------------------------------------------------------


@pytest.mark.cluster
def test_a_provider_limited_to_two_connections_does_not_starve_another(limited, alice, providers, fake):
    first, _ = limited
    providers["i14"].max_connections = 2
    providers["i14"].save()
    tokens = [ApiToken.issue(alice, name)[1] for name in ("a", "b")]
    requests = [(tokens[0], body(ENDLESS, stream=True)), (tokens[1], body(ENDLESS, stream=True))]
    with open_streams(first.url, *requests) as held:
        assert [r.status_code for r in held] == [200, 200]
        # A third never-ending request to the same provider waits a bounded time (UPSTREAM_PROVIDER_WAIT, 1 s),
        # then fails clearly: the two held never end, so only that bound answers it before the client's 30 s.
        with open_streams(first.url, (tokens[1], body(ENDLESS, stream=True))) as (busy,):
            assert busy.status_code == 503
            error = orjson.loads(busy.read())["error"]
        assert error["code"] == "provider_busy" and "all 2 connections" in error["message"]
        # The shared pool (3 connections) still has room for another provider.
        other = openai.OpenAI(base_url=first.url + "/v1", api_key=tokens[0], max_retries=0, timeout=8)
        reply = other.chat.completions.create(**body("[[echo]] served", "claude-sonnet-5"))
        assert reply.choices[0].message.content == "served"
    assert Usage.objects.filter(status="failed", error__contains="all 2 connections").count() == 1


def test_a_streaming_row_older_than_the_deadline_holds_no_place(alice, providers):
    token = ApiToken.issue(alice, "t")[0]
    long_ago = timezone.now() - timedelta(hours=1)  # UPSTREAM_DEADLINE is 30 minutes
    for _ in range(8):
        Usage.objects.create(user=alice, token=token, source="api", model="m", status="streaming", started=long_ago)
    with transaction.atomic():
        enforce(alice, source="api", token=token)  # the dead process's rows do not count
    Usage.objects.filter(started=long_ago).update(started=timezone.now())
    with pytest.raises(LimitExceeded) as caught, transaction.atomic():
        enforce(alice, source="api", token=token)
    assert caught.value.code == "too_many_streams"


def test_a_start_counts_only_running_rows_and_the_last_minute(alice, providers, settings):
    """The count reads the partial index of `streaming` rows, not every row of the half hour a stream may run.

    One count over the whole half hour read every row the person started in it: a script at
    10 requests a second had each start count 18,000 rows, in the write transaction.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    token = ApiToken.issue(alice, "t")[0]
    Usage.objects.create(user=alice, token=token, source="api", model="m", status="streaming")
    settings.RATE_LIMIT_PER_MINUTE = settings.API_TOKEN_RATE_LIMIT_PER_MINUTE = 0
    with CaptureQueriesContext(connection) as off, transaction.atomic():
        enforce(alice, source="api", token=token)
    settings.RATE_LIMIT_PER_MINUTE = 60
    with CaptureQueriesContext(connection) as on, transaction.atomic():
        enforce(alice, source="api", token=token)

    def plan(captured) -> str:
        (sql,) = [q["sql"] for q in captured.captured_queries if "chat_usage" in q["sql"]]
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            return "\n".join(row[-1] for row in cursor.fetchall())

    assert connection.vendor == "sqlite"  # the suite's database; test_scaleout covers PostgreSQL's behaviour
    assert "USING INDEX usage_streaming (user_id=? AND started>?)" in plan(off)
    assert plan(off).count("chat_usage") == 1  # no rate range read while no rate cap is set
    assert "USING INDEX usage_streaming" in plan(on)
    assert "USING INDEX chat_usage_user_id_600413_idx (user_id=? AND started>?)" in plan(on)
