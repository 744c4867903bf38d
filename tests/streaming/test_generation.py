"""Generation failure paths: database errors while saving, a locked SQLite, streams of dead processes."""

import asyncio
import sqlite3
import threading
import time
from datetime import timedelta
from decimal import Decimal

import aiohttp
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import OperationalError, connection
from django.utils import timezone

from chat.actions.orphans import CALL_ENDED, recover_orphans
from chat.models import INTERRUPTED_ERROR, Conversation, Message, Price, ToolCall, Usage, Worker
from chat.streaming import answer_saves, generation
from tests.conftest import MODELS, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]


def text(frames) -> str:
    return "".join(f.get("content", "") for f in frames if f["type"] == "delta")


def failing(original, times: int, calls: list):
    """`original`, except that its first `times` calls raise a database error."""

    def wrapper(self, *args):
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise OperationalError("database is locked")
        return original(self, *args)

    return wrapper


async def test_a_final_save_that_fails_twice_is_retried_and_done_follows_it(
    connect, alice, providers, monkeypatch, caplog
):
    calls: list[float] = []
    monkeypatch.setattr(generation.Generation, "_save_final", failing(generation.Generation._save_final, 2, calls))
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[chunks:20]]", model=I14)
    frames = await ws.until("done")
    # `done` left only after the row was stored: it is final when the socket hears of it.
    reply = await Message.objects.aget(pk=frames[-1]["message"])
    assert frames[-1]["status"] == "complete" and len(calls) == 3
    assert (reply.status, reply.content) == ("complete", text(frames))
    usage = await Usage.objects.aget(message=reply)
    assert usage.status == "complete" and usage.ended is not None
    assert "final save failed (attempt 1" in caplog.text and "final save landed after 3 attempts" in caplog.text


async def test_a_final_save_whose_transaction_fails_keeps_the_computed_cost_on_the_next_try(
    connect, alice, providers, monkeypatch
):
    await Price.objects.acreate(model=I14, prompt=Decimal("1000"), completion=Decimal("1000"))
    sent = answer_saves.commit_with
    calls: list[int] = []

    def failing_once(writes):
        calls.append(len(writes))
        if len(calls) == 1:
            raise OperationalError("the connection broke at the commit")
        return sent(writes)

    monkeypatch.setattr(answer_saves, "commit_with", failing_once)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[chunks:5]]", model=I14)
    done = (await ws.until("done"))[-1]
    usage = await Usage.objects.aget(message_id=done["message"])
    # Priced again on the second try, not taken for a cost the upstream reported.
    assert calls == [3, 3] and usage.status == "complete" and usage.cost_source == "computed" and usage.cost > 0
    assert done["usage"]["cost"] == float(usage.cost)


async def test_a_final_save_that_never_lands_is_not_reported_complete(connect, alice, providers, monkeypatch, caplog):
    monkeypatch.setattr(settings, "CHAT_FINAL_SAVE_SECONDS", 1.0)
    calls: list[float] = []
    monkeypatch.setattr(generation.Generation, "_save_final", failing(generation.Generation._save_final, 100, calls))
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[chunks:5]]", model=I14)
    done = (await ws.until("done"))[-1]
    assert done["status"] == "interrupted" and done["error"] == generation.UNSAVED_ERROR
    assert len(calls) >= 2 and "giving up" in caplog.text


async def test_the_partial_save_loop_survives_database_errors(connect, alice, providers, monkeypatch, caplog):
    calls: list[float] = []
    monkeypatch.setattr(settings, "CHAT_SAVE_INTERVAL", 0.2)
    monkeypatch.setattr(generation.Generation, "_save_partial", failing(generation.Generation._save_partial, 3, calls))
    _, _, ws = await connect(alice)
    # 10 s of streaming: the three failed saves and their backoff (0.4 + 0.8 + 1.6 s) end well before it does.
    await ws.send(type="send", conversation=None, content="[[delay:20]] [[chunks:500]]", model=I14)
    frames = await ws.until("delta")
    message_id = frames[0]["message"]
    while len(calls) < 5:  # three failures, then saves again
        frames += await ws.until("delta")
    frames += await ws.until("delta")
    saved = await Message.objects.aget(pk=message_id)
    assert saved.status == "streaming" and saved.content and text(frames).startswith(saved.content)
    frames += await ws.until("done")
    assert frames[-1]["status"] == "complete"
    assert caplog.text.count("cannot save the partial answer") == 1  # once per streak, not per attempt
    assert "partial answer saved again after 3 failure(s)" in caplog.text


# --- streams whose process is gone ---------------------------------------------


def dead_worker() -> Worker:
    long_ago = timezone.now() - timedelta(minutes=5)
    return Worker.objects.create(host="gone", pid=1, channel="specific.gone!x", heartbeat=long_ago)


async def streaming_reply(alice, worker: Worker | None, content: str = "saved so far") -> Message:
    conversation = await Conversation.objects.acreate(owner=alice, title="t")
    reply = await Message.objects.acreate(
        conversation=conversation, role="assistant", status="streaming", content=content, model=I14, worker=worker
    )
    await Usage.objects.acreate(
        user=alice, message=reply, model=I14, status="streaming", prompt_tokens=7, worker=worker
    )
    return reply


async def test_attach_to_a_stream_whose_process_is_gone_answers_from_the_database_at_once(connect, alice, providers):
    reply = await streaming_reply(alice, await sync_to_async(dead_worker)())
    _, _, ws = await connect(alice)
    await ws.send(type="attach", conversation=reply.conversation_id)
    attached, snapshot, done = await ws.receive(1), await ws.receive(1), await ws.receive(1)
    assert attached["message"] == reply.pk
    assert snapshot["type"] == "snapshot" and snapshot["content"] == "saved so far" and snapshot["seq"] is None
    assert done["type"] == "done" and done["status"] == "interrupted" and done["usage"]["estimated"]
    assert (await Message.objects.aget(pk=reply.pk)).status == "interrupted"
    # and the conversation takes a new message at once instead of answering `busy`
    await ws.send(type="send", conversation=reply.conversation_id, content="[[chunks:3]]", model=I14)
    assert (await ws.until("done"))[-1]["status"] == "complete"


async def test_stop_of_a_stream_whose_process_is_gone_ends_it(connect, alice, providers):
    reply = await streaming_reply(alice, await sync_to_async(dead_worker)())
    _, _, ws = await connect(alice)
    await ws.send(type="attach", conversation=reply.conversation_id)
    await ws.until("done")
    second = await streaming_reply(alice, await sync_to_async(dead_worker)())
    _, _, other = await connect(alice)
    await other.send(type="stop", message=second.pk)
    assert await other.nothing_more()  # not watching that conversation: nothing to say, no error
    assert (await Message.objects.aget(pk=second.pk)).status == "interrupted"


def test_the_sweep_ends_only_streams_of_dead_processes(alice, transactional_db, monkeypatch):
    monkeypatch.setattr("chat.models.workers._current_worker", None)  # this test process serves nothing
    alive = Worker.objects.create(host="here", pid=2, channel="specific.here!x")
    dead = dead_worker()
    conversation = Conversation.objects.create(owner=alice)

    def call(name, status, **more):
        return {"id": name, "name": f"tests__{name}", "server": "tests", "tool": name, "arguments": "{}",
                "status": status, **more}  # fmt: skip

    # A round that ended (its turn recorded it), then one under way: a call done, one running, one waiting.
    rounds = [{"at": 1, "calls": [call("x", "ok")]},
              {"at": 3, "calls": [call("a", "ok", result="5", size=1, duration_ms=7),
                                  call("b", "running", arguments='{"text": "hi"}'), call("c", "waiting")]}]  # fmt: skip

    def reply(worker):
        message = Message.objects.create(conversation=conversation, role="assistant", status="streaming", content="abc",
                                         worker=worker, tool_rounds=rounds)  # fmt: skip
        Usage.objects.create(user=alice, message=message, model=I14, status="streaming", worker=worker)
        return message

    live_reply, dead_reply, unowned = reply(alive), reply(dead), reply(None)
    # The round under way took its calls' rows as it began (tool_rounds.take_slots): the sweep writes on them.
    for name in ("a", "b", "c"):
        ToolCall.objects.create(user=alice, conversation=conversation, message=dead_reply, server="tests", tool=name,
                                status="cancelled")  # fmt: skip
    api_live = Usage.objects.create(user=alice, model=I14, status="streaming", source="api", worker=alive)
    api_dead = Usage.objects.create(user=alice, model=I14, status="streaming", source="api", worker=dead)

    recovered = recover_orphans(timedelta(minutes=1))  # the live lease stays current on a slow, busy host

    assert [m.pk for m in recovered] == [dead_reply.pk]
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert statuses == {live_reply.pk: "streaming", dead_reply.pk: "interrupted", unowned.pk: "streaming"}
    usage = {u.pk: u for u in Usage.objects.all()}
    assert usage[api_live.pk].status == "streaming"
    assert usage[api_dead.pk].status == "interrupted" and usage[api_dead.pk].error == INTERRUPTED_ERROR
    assert usage[api_dead.pk].ended is not None
    dead_usage = Usage.objects.get(message=dead_reply)
    assert dead_usage.status == "interrupted" and dead_usage.estimated and dead_usage.completion_tokens > 0
    # The calls it waited on or ran ended with it (the page would show them running for ever); the done one stays.
    calls = Message.objects.get(pk=dead_reply.pk).tool_rounds[1]["calls"]
    assert [c["status"] for c in calls] == ["ok", "cancelled", "cancelled"] and calls[0]["result"] == "5"
    assert Message.objects.get(pk=live_reply.pk).tool_rounds == rounds
    # The round under way goes in the audit, which its turn would have written when the round ended.
    audit = ToolCall.objects.filter(message=dead_reply).order_by("pk")
    assert [(row.user_id, row.conversation_id, row.tool, row.status) for row in audit] == [
        (alice.pk, conversation.pk, "a", "ok"), (alice.pk, conversation.pk, "b", "cancelled"),
        (alice.pk, conversation.pk, "c", "cancelled"),
    ]  # fmt: skip
    assert audit[0].duration_ms == 7 and audit[1].arguments == {"text": "hi"} and audit[2].error == CALL_ENDED
    assert not ToolCall.objects.exclude(message=dead_reply).exists()
    # A lone process at start-up takes every stream not its own, with or without a worker.
    assert {m.pk for m in recover_orphans(None)} == {live_reply.pk, unowned.pk}


# --- a locked SQLite database under the real server ----------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_30_second_write_lock_loses_nothing(server, alice, providers):
    """Another writer holds SQLite's write lock for 30 s while streams run: every answer is stored whole."""
    if not connection.vendor == "sqlite":
        pytest.fail("this test is about SQLite's write lock")
    cookie = await sync_to_async(session_cookie)(alice)
    headers = {"Origin": server.url, "Cookie": f"{settings.SESSION_COOKIE_NAME}={cookie}"}
    locked, release = threading.Event(), threading.Event()
    released_at: list[float] = []

    def hold_the_lock() -> None:
        db = sqlite3.connect(connection.settings_dict["NAME"], timeout=30, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(60)
        released_at.append(time.monotonic())
        db.execute("COMMIT")
        db.close()

    url = server.url.replace("http", "ws") + "/ws/chat/"
    short, long = "[[delay:50]] [[chunks:160]]", "[[delay:50]] [[chunks:1000]]"  # ~8 s and ~50 s
    async with aiohttp.ClientSession() as session:
        sockets = [await session.ws_connect(url, headers=headers) for _ in range(4)]
        frames: list[list[dict]] = [[] for _ in sockets]
        streaming = [asyncio.Event() for _ in sockets]

        async def read(index: int, ws) -> None:
            while not frames[index] or frames[index][-1]["type"] != "done":
                received = await ws.receive(timeout=60)
                assert received.type == aiohttp.WSMsgType.TEXT, received
                frame = orjson.loads(received.data)
                frame["at"] = time.monotonic()
                frames[index].append(frame)
                if frame["type"] == "delta":
                    streaming[index].set()

        # Two streams end inside the lock, two go on well after it.
        for ws, content in zip(sockets, [short, short, long, long], strict=True):
            await ws.send_str(orjson.dumps({"type": "send", "conversation": None, "content": content}).decode())
        readers = [asyncio.create_task(read(i, ws)) for i, ws in enumerate(sockets)]
        for event in streaming:
            await asyncio.wait_for(event.wait(), 20)
        holder = threading.Thread(target=hold_the_lock)
        holder.start()
        await asyncio.to_thread(locked.wait, 10)
        await asyncio.sleep(30)  # the length of the outage itself, not a synchronisation
        release.set()
        await asyncio.to_thread(holder.join, 10)
        for stream in frames[2:]:
            # Saved again once the lock is gone, while still streaming (~15 s of it left): the row
            # catches up with what the socket had heard by the release. No event says so: polled.
            heard = text(f for f in stream if f["at"] < released_at[0])
            for _ in range(300):
                reply = await Message.objects.aget(pk=stream[0]["message"])
                if reply.content.startswith(heard):
                    break
                await asyncio.sleep(0.1)
            assert reply.status == "streaming" and reply.content.startswith(heard)
            assert text(stream).startswith(reply.content)
        await asyncio.gather(*readers)
        for ws in sockets:
            await ws.close()

    for stream in frames:
        done = stream[-1]
        assert done["status"] == "complete" and done["at"] >= released_at[0]  # told only once stored
        reply = await Message.objects.aget(pk=done["message"])
        assert (reply.status, reply.content) == ("complete", text(stream))
    assert "Traceback" not in server.output()


def test_a_refusal_with_retry_after_reads_as_two_sentences():
    """The upstream's own words end with a full stop before ours, whether or not they had one."""
    import httpx

    from chat.streaming import upstream

    refused = upstream.UpstreamError("http", "Rate limit exceeded", status=429, code="rate_limit_exceeded",
                                     headers=httpx.Headers({"retry-after": "7"}))  # fmt: skip
    assert generation._describe(refused) == (
        "The upstream refused the request (429 rate_limit_exceeded): Rate limit exceeded. Retry after 7 s."
    )
    cut = generation._describe(upstream.UpstreamError("too_large", "the reply reached the limit of 2000000 bytes"))
    assert cut == (
        "The answer was stopped because the reply reached the limit of 2000000 bytes; the text so far was kept."
    )
