"""The chat websocket through the real consumer stack, against the fake upstream on a socket."""

import asyncio
import logging

import orjson
import pytest
from asgiref.sync import sync_to_async
from django.test import Client, override_settings

from chat.models import Conversation, Message, Usage
from chat.runtime import process_loops, stopping
from chat.streaming import generation
from chat.streaming.frames import MAX_FRAME_CHARS, send_done, snapshot_frames
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
SLOW = "[[delay:20]] [[chunks:400]]"


def joined(frames, field, message=None):
    return "".join(f.get(field, "") for f in frames if f["type"] == "delta" and message in (None, f["message"]))


async def first_delta(ws):
    frames = await ws.until("delta")
    return frames[-1], frames


# --- a whole stream -------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
async def test_send_streams_deltas_and_stores_everything(connect, alice, providers, fake, dialect):
    accepted, _, ws = await connect(alice)
    assert accepted
    model = {"api14": "deepseek/deepseek-r1"}.get(dialect, MODELS[dialect])
    await ws.send(type="send", conversation=None, content="What is SSE?\nTell me.", model=model)
    frames = await ws.until("done")
    started, done = frames[0], frames[-1]
    assert started["type"] == "started" and started["model"] == model and started["provider"] == dialect
    assert done == {
        "type": "done",
        "message": started["message"],
        "conversation": started["conversation"],
        "status": "complete",
        "finish_reason": "stop",
        "usage": done["usage"],
        "error": None,
        "thinking_ms": done["thinking_ms"],
        "tool_calls": None,
    }
    deltas = [f for f in frames if f["type"] == "delta"]
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    assert all(d.get("content", "x") and d.get("reasoning", "x") for d in deltas)  # present only when non-empty

    record = fake.app.last()
    assert record.body["max_tokens"] == 8192 and record.body["stream_options"] == {"include_usage": True}
    assert record.body["messages"] == [{"role": "user", "content": "What is SSE?\nTell me."}]

    conversation = await Conversation.objects.aget(pk=started["conversation"])
    assert conversation.title == "What is SSE?" and conversation.owner_id == alice.pk
    assert conversation.model == f"{dialect}/{model}"
    reply = await Message.objects.aget(pk=started["message"])
    assert reply.status == "complete" and reply.finish_reason == "stop" and reply.model == model
    assert reply.content == joined(frames, "content") and "You wrote" in reply.content
    assert reply.reasoning == joined(frames, "reasoning")
    assert (dialect == "infyrence") == (reply.reasoning == "")  # i14 and deepseek-r1 think first
    # How long it thought: measured, stored and sent when it reasoned; nothing when it did not.
    assert reply.thinking_ms == done["thinking_ms"] and (done["thinking_ms"] is None) == (reply.reasoning == "")
    user_message = await Message.objects.aget(pk=started["user_message"])
    assert user_message.role == "user" and user_message.content == "What is SSE?\nTell me."

    usage = await Usage.objects.select_related("provider").aget(message=reply)
    sent = record.text().decode()
    assert usage.provider.name == dialect and usage.source == "chat" and usage.user_id == alice.pk
    assert not usage.estimated and usage.status == "complete"
    assert usage.completion_tokens == done["usage"]["completion_tokens"] > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.upstream_id and usage.upstream_id in sent
    assert usage.ttft_ms is not None and usage.duration_ms >= usage.ttft_ms
    assert usage.tokens_per_second and usage.ended
    if dialect == "i14":
        assert usage.upstream_perf.keys() == {"tokens_per_second", "generation_time_s", "time_to_first_token_s"}
        assert usage.reasoning_tokens == done["usage"]["reasoning_tokens"] == 8
    if dialect == "api14":
        assert usage.cost is not None and usage.cost > 0 and done["usage"]["cost"] == float(usage.cost)
        assert usage.reasoning_tokens == 8
    if dialect == "infyrence":
        assert usage.request_id and usage.request_id == record.id
        assert usage.cost is None and done["usage"]["cost"] is None


async def test_deltas_are_coalesced_not_one_frame_per_token(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[chunks:2000]] [[reasoning:0]]", model=I14)
    frames = await ws.until("done")
    deltas = [f for f in frames if f["type"] == "delta"]
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.content == joined(frames, "content") and len(reply.content) > 2000
    # 2000 chunks arrive in well under a second; 30 ms windows give a few dozen frames (more on a loaded
    # machine, where the chunks come slower), asserted ten times looser; one frame a token would be 2000.
    assert len(deltas) < 1000, len(deltas)


async def test_a_second_message_sends_the_history_and_keeps_params(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] first", model=I14, params={"temperature": 0.2})
    first = await ws.until("done")
    conversation = first[0]["conversation"]
    await ws.send(type="send", conversation=conversation, content="[[echo]] second")
    second = await ws.until("done")
    assert second[0]["conversation"] == conversation and second[0]["model"] == I14
    body = fake.app.last().body
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"] == "first" and body["temperature"] == 0.2


async def test_tool_calls_are_joined_by_index(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[tools]]", model="claude-sonnet-5")
    frames = await ws.until("done")
    assert frames[-1]["finish_reason"] == "tool_calls" and frames[-1]["status"] == "complete"
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert [call["function"]["name"] for call in reply.tool_calls] == ["get_weather", "get_weather"]
    assert all(call["function"]["arguments"].startswith("{") for call in reply.tool_calls)


async def test_length_finish_is_kept_as_given(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[length]]", model=I14, params={"max_tokens": 30})
    frames = await ws.until("done")
    assert (frames[-1]["status"], frames[-1]["finish_reason"]) == ("complete", "length")
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.finish_reason == "length" and reply.reasoning


async def test_nul_in_a_message_or_an_answer_is_stored_as_u_fffd(connect, alice, providers):
    """PostgreSQL's text cannot hold U+0000: a NUL the person types or the model emits is kept as U+FFFD."""
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] a\x00b", model=I14)
    frames = await ws.until("done")
    assert frames[-1]["status"] == "complete"
    reply = await Message.objects.select_related("parent").aget(pk=frames[-1]["message"])
    assert reply.parent.content == "[[echo]] a\ufffdb" and reply.content.endswith("a\ufffdb")
    await ws.send(type="send", conversation=frames[-1]["conversation"], content="[[nul]]", model=I14)
    frames = await ws.until("done")
    assert frames[-1]["status"] == "complete"
    assert "".join(f.get("content", "") for f in frames if f["type"] == "delta").endswith("before\ufffd after")
    assert (await Message.objects.aget(pk=frames[-1]["message"])).content.endswith("before\ufffd after")


async def test_changes_made_over_the_json_api_reach_the_persons_sockets(connect, alice, bob):
    _, _, ws = await connect(alice)
    _, _, bobs = await connect(bob)
    client = Client()
    await sync_to_async(client.force_login)(alice)
    post = sync_to_async(client.post)
    await post("/api/folders", {"name": "Work"}, content_type="application/json", headers={"X-Chat-Tab": "t1"})
    assert await ws.receive() == {"type": "conversations", "tab": "t1"}  # the sidebars read the list again
    conversation = await Conversation.objects.acreate(owner=alice, title="Plans")
    patch = sync_to_async(client.patch)
    await patch(f"/api/conversations/{conversation.pk}", {"archived": True}, content_type="application/json")
    changed = {"id": conversation.pk, "title": "Plans", "archived": True}
    assert await ws.receive() == {"type": "conversations", "tab": "", "changed": changed}
    await sync_to_async(client.delete)(f"/api/conversations/{conversation.pk}")
    assert await ws.receive() == {"type": "conversations", "tab": "", "deleted": [conversation.pk]}
    assert await bobs.nothing_more()  # nobody else's


async def test_a_stopping_process_starts_no_turn_and_sends_the_tab_elsewhere(connect, alice, providers, monkeypatch):
    """Its stream would be cut when the grace ends: nothing is stored, the page sends it again after reconnecting."""
    _, _, ws = await connect(alice)
    monkeypatch.setattr(stopping, "_draining", True)
    await ws.send(type="send", conversation=None, content="hello", model=I14)
    error = await ws.receive()
    assert (error["type"], error["code"]) == ("error", "server_restarting")
    assert (await ws.communicator.receive_output(5)) == {"type": "websocket.close", "code": 1012}
    assert not await Conversation.objects.filter(owner=alice).aexists()


# --- ending paths ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "model", "fault", "status", "error"),
    [
        ("api14", "openai/gpt-5-mini", "midstream", "failed", "Provider disconnected"),
        ("infyrence", "claude-sonnet-5", "midstream", "failed", "Upstream provider unavailable"),
        ("i14", I14, "cut", "interrupted", "broke off"),
        ("infyrence", "claude-sonnet-5", "eof", "interrupted", "closed the stream"),
    ],
)
async def test_upstream_faults_mid_stream_keep_the_partial_text(
    connect, alice, providers, dialect, model, fault, status, error
):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=f"[[fault:{fault}]] [[chunks:40]]", model=model)
    frames = await ws.until("done")
    done = frames[-1]
    assert done["status"] == status and error in done["error"]
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.status == status and error in reply.error
    assert reply.content and reply.content == joined(frames, "content")
    usage = await Usage.objects.aget(message=reply)
    assert usage.status == status and usage.estimated and usage.completion_tokens > 0
    # the server keeps serving: the same socket streams again
    await ws.send(type="send", conversation=frames[0]["conversation"], content="[[echo]] again")
    assert (await ws.until("done"))[-1]["status"] == "complete"


@pytest.mark.parametrize(
    ("dialect", "model", "code", "text"),
    [
        ("i14", I14, 401, "(401 invalid_api_key)"),
        ("i14", "i14-other-model", 403, "model_not_allowed"),
        ("api14", "openai/gpt-5-mini", 429, "retry after 7 seconds."),
        ("infyrence", "claude-sonnet-5", 500, "(500"),
        ("api14", "openai/gpt-5-mini", 503, "(503"),
    ],
)
async def test_errors_before_the_first_byte_fail_the_message(connect, alice, providers, dialect, model, code, text):
    if model == "i14-other-model":
        providers["i14"].model_list = f"{I14}\ni14-other-model"
        await providers["i14"].asave()
    _, _, ws = await connect(alice)
    content = "hi" if code in (401, 403) else f"[[status:{code}]] hi"
    if code == 401:
        providers["i14"].api_key = "wrong"
        await providers["i14"].asave()
    await ws.send(type="send", conversation=None, content=content, model=model)
    frames = await ws.until("done")
    done = frames[-1]
    assert done["status"] == "failed" and text in done["error"]
    assert done["error"].lower().count("retry after") == (code == 429)  # the upstream's hint, not repeated
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.status == "failed" and text in reply.error and reply.content == ""
    assert (await Usage.objects.aget(message=reply)).status == "failed"


async def test_unreachable_upstream_fails_cleanly(connect, alice, providers):
    providers["infyrence"].base_url = "http://127.0.0.1:9/v1"
    providers["infyrence"].model_list = "claude-sonnet-5"
    await providers["infyrence"].asave()
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="hi", model="claude-sonnet-5")
    done = (await ws.until("done"))[-1]
    assert done["status"] == "failed" and "Cannot reach the upstream" in done["error"]
    # The OS's reason, not the connector's words naming the upstream's address, which the person has no use for.
    assert "Connection refused" in done["error"] and "127.0.0.1" not in done["error"] and ":9" not in done["error"]


async def test_a_stream_ending_on_a_broken_frame_is_interrupted_with_partial_text(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[fault:malformed]] [[chunks:20]]", model="claude-sonnet-5")
    frames = await ws.until("done")
    # one unreadable event is skipped; then the upstream ended without finishing
    assert frames[-1]["status"] == "interrupted"
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.status == "interrupted" and reply.content == joined(frames, "content") != ""


FILLER = "Streaming tokens from the demo upstream keeps the relay busy while the benchmark measures".split()


async def test_unreadable_events_are_skipped_and_the_answer_completes(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[malformed:2]] [[chunks:12]]", model="claude-sonnet-5")
    frames = await ws.until("done")
    assert frames[-1]["status"] == "complete" and frames[-1]["error"] is None
    reply = await Message.objects.aget(pk=frames[0]["message"])
    # the valid chunks after the bad lines are all there
    assert reply.content == joined(frames, "content") == " ".join(FILLER[:12]) + " "


async def test_too_many_unreadable_events_fail_with_a_sentence(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[malformed:5]] [[chunks:12]]", model="claude-sonnet-5")
    frames = await ws.until("done")
    expected = (
        "The upstream sent something unreadable (the upstream sent 3 events that are not valid JSON); "
        "the text so far was kept."
    )
    assert frames[-1]["status"] == "failed" and frames[-1]["error"] == expected
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.status == "failed" and reply.error == expected and reply.content == " ".join(FILLER[:3]) + " "


async def test_a_reply_past_the_cap_is_stopped_failed_with_its_text_kept(connect, alice, providers):
    _, _, ws = await connect(alice)
    with override_settings(CHAT_MAX_REPLY_BYTES=5000):
        await ws.send(type="send", conversation=None, content="[[chunks:50]] [[size:1000]] [[reasoning:0]]", model=I14)
        frames = await ws.until("done")
    done = frames[-1]
    assert done["status"] == "failed" and "limit of 5000 bytes" in done["error"]
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.status == "failed" and len(reply.content.encode()) == 5000 == len(joined(frames, "content"))
    assert (await Usage.objects.aget(message=reply)).status == "failed"


async def test_a_line_past_the_cap_fails_the_stream_clearly(connect, alice, providers):
    _, _, ws = await connect(alice)
    with override_settings(UPSTREAM_MAX_LINE_BYTES=100_000):
        await ws.send(type="send", conversation=None, content="[[chunks:3]] [[size:200000]]", model="claude-sonnet-5")
        frames = await ws.until("done")
    assert frames[-1]["status"] == "failed"
    assert "an event longer than 100000 bytes" in frames[-1]["error"] and "b'" not in frames[-1]["error"]


async def test_an_echoed_key_or_an_html_page_never_reaches_the_user(connect, alice, providers):
    from tests.conftest import FAKE_KEY

    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[status:400]] [[echoauth]]", model="claude-sonnet-5")
    frames = await ws.until("done")
    error = frames[-1]["error"]
    assert FAKE_KEY not in error and "Authorization: Bearer [redacted]" in error
    reply = await Message.objects.aget(pk=frames[0]["message"])
    usage = await Usage.objects.aget(message=reply)
    assert FAKE_KEY not in reply.error and FAKE_KEY not in usage.error
    assert (usage.prompt_tokens, usage.completion_tokens, usage.estimated) == (0, 0, False)  # a refusal: not billed
    await ws.send(type="send", conversation=None, content="[[status:502]] [[html]]", model=I14)
    frames = await ws.until("done")
    assert frames[-1]["error"] == "The upstream refused the request (502): 502 Bad Gateway"


async def test_upstream_strings_are_cut_to_their_columns(connect, alice, providers):
    _, _, ws = await connect(alice)
    finish = "stop_" + "x" * 35
    await ws.send(type="send", conversation=None, content=f"[[finish:{finish}]] [[longid]] hi", model="claude-sonnet-5")
    frames = await ws.until("done")
    assert frames[-1]["status"] == "complete"
    reply = await Message.objects.aget(pk=frames[0]["message"])
    usage = await Usage.objects.aget(message=reply)
    assert reply.finish_reason == usage.finish_reason == finish[:30]
    assert len(usage.upstream_id) == len(usage.request_id) == 200 and usage.upstream_id.startswith("chatcmpl_")


async def test_stop_closes_the_upstream_and_keeps_the_partial_text(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=SLOW, model=I14)
    delta, frames = await first_delta(ws)
    await ws.send(type="stop", message=delta["message"])
    frames += await ws.until("done")
    assert frames[-1]["status"] == "stopped"
    record = fake.app.last()
    assert await asyncio.to_thread(record.disconnected.wait, 1.0), "upstream connection still open after 1 s"
    reply = await Message.objects.aget(pk=delta["message"])
    assert reply.status == "stopped" and reply.reasoning + reply.content != ""
    assert reply.content == joined(frames, "content") and reply.reasoning == joined(frames, "reasoning")
    usage = await Usage.objects.aget(message=reply)
    assert usage.status == "stopped" and usage.estimated and usage.completion_tokens > 0


async def test_closing_the_tab_does_not_stop_the_stream_and_attach_resumes(connect, alice, providers):
    _, _, first = await connect(alice)
    await first.send(type="send", conversation=None, content="[[delay:10]] [[chunks:150]]", model=I14)
    delta, before = await first_delta(first)
    await first.communicator.disconnect()

    _, _, second = await connect(alice)
    await second.send(type="attach", conversation=before[0]["conversation"])
    frames = await second.until("done")
    attached, snapshot = frames[0], frames[1]
    assert attached == {"type": "attached", "conversation": before[0]["conversation"], "message": delta["message"]}
    assert snapshot["type"] == "snapshot" and snapshot["status"] == "streaming"
    assert snapshot["content"].startswith(joined(before, "content"))
    later = [f for f in frames[2:] if f["type"] == "delta"]
    assert all(f["seq"] > snapshot["seq"] for f in later)
    reply = await Message.objects.aget(pk=delta["message"])
    assert reply.status == "complete"
    assert snapshot["reasoning"] + joined(later, "reasoning") == reply.reasoning
    assert snapshot["content"] + joined(later, "content") == reply.content


async def test_attach_to_a_finished_conversation_says_nothing_streams(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] hi", model=I14)
    conversation = (await ws.until("done"))[0]["conversation"]
    _, _, other = await connect(alice)
    await other.send(type="attach", conversation=conversation)
    assert await other.receive() == {"type": "attached", "conversation": conversation, "message": None}


async def test_a_second_tab_watching_the_conversation_sees_the_stream(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] one", model=I14)
    conversation = (await ws.until("done"))[0]["conversation"]
    _, _, watcher = await connect(alice)
    await watcher.send(type="attach", conversation=conversation)
    await watcher.until("attached")
    await ws.send(type="send", conversation=conversation, content="[[echo]] two")
    mine, theirs = await ws.until("done"), await watcher.until("done")
    assert theirs[0]["type"] == "started" and joined(theirs, "content") == joined(mine, "content") == "two"


async def test_one_stream_per_conversation(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=SLOW, model=I14)
    delta, _ = await first_delta(ws)
    conversation = (await Message.objects.aget(pk=delta["message"])).conversation_id
    await ws.send(type="send", conversation=conversation, content="again")
    frames = await ws.until("error")
    assert frames[-1]["code"] == "busy"
    assert await Message.objects.filter(conversation_id=conversation).acount() == 2
    await ws.send(type="stop", message=delta["message"])
    await ws.until("done")


async def test_text_is_saved_while_streaming(connect, alice, providers):
    with override_settings(CHAT_SAVE_INTERVAL=0.05):
        _, _, ws = await connect(alice)
        await ws.send(type="send", conversation=None, content=SLOW, model=I14)
        delta, _ = await first_delta(ws)
        async with asyncio.timeout(5):
            while not (reply := await Message.objects.aget(pk=delta["message"])).reasoning:
                await ws.receive()  # the next delta: the stream goes on meanwhile
        assert reply.status == "streaming"
        await ws.send(type="stop", message=delta["message"])
        await ws.until("done")


async def test_server_shutdown_mid_stream_marks_interrupted(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=SLOW, model=I14)
    delta, _ = await first_delta(ws)
    (task,) = generation._tasks
    task.cancel()
    frames = await ws.until("done")
    assert frames[-1]["status"] == "interrupted"
    assert await asyncio.to_thread(fake.app.last().disconnected.wait, 1.0)
    reply = await Message.objects.aget(pk=delta["message"])
    assert reply.status == "interrupted" and (reply.content or reply.reasoning)


async def test_messages_left_streaming_by_a_dead_process_become_interrupted(alice):
    conversation = await Conversation.objects.acreate(owner=alice, title="t")
    reply = await Message.objects.acreate(
        conversation=conversation, role="assistant", status="streaming", content="half an ans"
    )
    await Usage.objects.acreate(user=alice, message=reply, model="m", status="streaming", prompt_tokens=5)
    from chat.apps import prepare_to_serve

    await sync_to_async(prepare_to_serve)()
    await reply.arefresh_from_db()
    assert reply.status == "interrupted" and reply.content == "half an ans" and "server stopped" in reply.error
    usage = await Usage.objects.aget(message=reply)
    assert usage.status == "interrupted" and usage.estimated and usage.completion_tokens == 3
    assert usage.total_tokens == 8


# --- refusals -------------------------------------------------------------------


async def test_anonymous_user_is_accepted_then_closed_with_4401(connect, providers):
    accepted, _, socket = await connect(None)
    # Accepted first: a refused handshake reaches a browser as 1006, and the page would keep reconnecting.
    assert accepted
    assert await socket.communicator.receive_output(5) == {"type": "websocket.close", "code": 4401}


async def test_foreign_origin_is_refused(connect, alice):
    accepted, _, _ = await connect(alice, origin=b"https://evil.example")
    assert not accepted


BAD_FRAMES = [
    ("not json", "bad_json"),
    ("[1, 2]", "bad_frame"),
    ('"send"', "bad_frame"),
    ('{"type": {"a": 1}}', "bad_frame"),
    ('{"type": ["send"]}', "bad_frame"),
    ('{"content": "hi"}', "unknown_type"),
    ('{"type": "dance"}', "unknown_type"),
    ('{"type": "send"}', "bad_field"),
    ('{"type": "send", "content": 5}', "bad_field"),
    ('{"type": "send", "content": ""}', "empty_content"),
    ('{"type": "send", "content": " \\n "}', "empty_content"),
    ('{"type": "send", "content": "hi", "conversation": "1"}', "bad_field"),
    ('{"type": "send", "content": "hi", "conversation": true}', "bad_field"),
    ('{"type": "send", "content": "hi", "conversation": 999999}', "not_found"),
    ('{"type": "send", "content": "hi", "model": 7}', "bad_field"),
    ('{"type": "send", "content": "hi", "model": "no-such-model"}', "unknown_model"),
    ('{"type": "send", "content": "hi", "params": []}', "bad_field"),
    ('{"type": "send", "content": "hi", "params": {"temperature": 3}}', "bad_param"),
    ('{"type": "send", "content": "hi", "params": {"temperature": true}}', "bad_param"),
    ('{"type": "send", "content": "hi", "params": {"max_tokens": 1.5}}', "bad_param"),
    ('{"type": "send", "content": "hi", "params": {"stop": ["a", "b", "c", "d", "e"]}}', "bad_param"),
    ('{"type": "send", "content": "hi", "params": {"logit_bias": {}}}', "bad_param"),
    ('{"type": "stop"}', "bad_field"),
    ('{"type": "stop", "message": 424242}', "not_found"),
    ('{"type": "attach", "conversation": null}', "bad_field"),
    ('{"type": "attach", "conversation": 424242}', "not_found"),
]


async def test_bad_frames_get_an_error_and_the_socket_stays_open(connect, alice, providers):
    _, _, ws = await connect(alice)
    for text, code in BAD_FRAMES:
        await ws.communicator.send_to(text_data=text)
        reply = await ws.receive()
        assert reply["type"] == "error" and reply["code"] == code and reply["detail"], (text, reply)
        assert reply["message"] is None
    await ws.communicator.send_to(bytes_data=b"\x00\x01")
    assert (await ws.receive())["code"] == "bad_frame"
    assert await Conversation.objects.acount() == 0 and await Message.objects.acount() == 0
    await ws.send(type="send", conversation=None, content="[[echo]] still here", model=I14)
    assert joined(await ws.until("done"), "content") == "still here"


async def test_content_over_the_limit_is_refused(connect, alice, providers):
    with override_settings(CHAT_MAX_CONTENT_BYTES=1000):
        _, _, ws = await connect(alice)
        await ws.send(type="send", conversation=None, content="é" * 501, model=I14)
        assert (await ws.receive())["code"] == "too_long"
        await ws.send(type="send", conversation=None, content="[[echo]]" + "é" * 496, model=I14)
        assert (await ws.until("done"))[-1]["status"] == "complete"


async def test_another_users_conversation_is_answered_like_a_missing_one(connect, alice, bob, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=SLOW, model=I14)
    delta, frames = await first_delta(ws)
    conversation = frames[0]["conversation"]

    _, _, intruder = await connect(bob)
    for frame in (
        {"type": "attach", "conversation": conversation},
        {"type": "send", "conversation": conversation, "content": "mine now"},
        {"type": "stop", "message": delta["message"]},
    ):
        await intruder.send(**frame)
        reply = await intruder.receive()
        assert reply["code"] == "not_found", frame
    assert await intruder.nothing_more()  # bob sees no delta of alice's stream
    assert await Message.objects.filter(conversation_id=conversation).acount() == 2

    await ws.send(type="stop", message=delta["message"])
    assert (await ws.until("done"))[-1]["status"] == "stopped"


async def test_stop_of_a_finished_message(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] hi", model=I14)
    frames = await ws.until("done")
    await ws.send(type="stop", message=frames[0]["message"])
    assert (await ws.receive())["code"] == "not_streaming"


# --- regenerate, edit, system prompt ----------------------------------------------


async def test_regenerate_adds_a_sibling_answer_with_the_model_asked(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] once", model=I14)
    first = await ws.until("done")
    conversation = first[0]["conversation"]
    await ws.send(type="regenerate", conversation=conversation, model="claude-sonnet-5")
    again = await ws.until("done")
    assert again[0]["user_message"] == first[0]["user_message"] and again[0]["message"] != first[0]["message"]
    assert again[0]["model"] == "claude-sonnet-5" and joined(again, "content") == "once"
    assert await Message.objects.filter(pk=first[0]["message"]).aexists()  # kept: a branch (tests/ws/test_branches.py)
    roles = [m.role async for m in Message.objects.filter(conversation_id=conversation)]
    assert roles == ["user", "assistant", "assistant"]
    assert [m["role"] for m in fake.app.last().body["messages"]] == ["user"]
    assert await Usage.objects.acount() == 2  # one row per stream


async def test_edit_the_last_user_message_makes_a_sibling(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] first", model=I14)
    first = await ws.until("done")
    await ws.send(type="send", conversation=first[0]["conversation"], content="[[echo]] second")
    second = await ws.until("done")
    await ws.send(type="edit", message=second[0]["user_message"], content="[[echo]] second, edited")
    edited = await ws.until("done")
    assert edited[0]["user_message"] != second[0]["user_message"]
    assert joined(edited, "content") == "second, edited"
    user_message = await Message.objects.aget(pk=second[0]["user_message"])
    assert user_message.content == "[[echo]] second"  # the old branch keeps its words
    contents = [m["content"] for m in fake.app.last().body["messages"]]
    assert contents == ["[[echo]] first", "first", "[[echo]] second, edited"]


async def test_edit_and_regenerate_refuse_others_and_bad_frames(connect, alice, bob, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] mine", model=I14)
    frames = await ws.until("done")
    _, _, intruder = await connect(bob)
    for frame in (
        {"type": "regenerate", "conversation": frames[0]["conversation"]},
        {"type": "edit", "message": frames[0]["user_message"], "content": "hijack"},
        {"type": "edit", "message": frames[0]["message"], "content": "an assistant message"},
    ):
        await intruder.send(**frame)
        assert (await intruder.receive())["code"] == "not_found"
    await ws.send(type="edit", message=frames[0]["user_message"], content="")
    assert (await ws.receive())["code"] == "empty_content"
    await ws.send(type="regenerate", conversation="1")
    assert (await ws.receive())["code"] == "bad_field"


async def test_system_prompt_is_stored_and_sent_first(connect, alice, providers, fake):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] hi", model=I14, system_prompt="Be terse.")
    frames = await ws.until("done")
    assert fake.app.last().body["messages"][0] == {"role": "system", "content": "Be terse."}
    conversation = await Conversation.objects.aget(pk=frames[0]["conversation"])
    assert conversation.system_prompt == "Be terse."
    await ws.send(type="send", conversation=None, content="hi", system_prompt=5)
    assert (await ws.receive())["code"] == "bad_field"


async def test_attach_when_the_stream_ends_before_its_snapshot_sends_the_saved_text(connect, alice, providers):
    _, _, ws = await connect(alice)
    conversation = await Conversation.objects.acreate(owner=alice, title="t")
    reply = await Message.objects.acreate(  # owned by this (live) process, which has just ended it
        conversation=conversation,
        role="assistant",
        status="streaming",
        content="saved text",
        model=I14,
        worker_id=process_loops.worker_id(),
    )
    await ws.send(type="attach", conversation=conversation.pk)
    assert (await ws.receive())["message"] == reply.pk  # attached; no generation answers the snapshot request
    reply.status, reply.content = "interrupted", "saved text, final"
    await reply.asave()
    await send_done(conversation.pk, reply.pk, "interrupted", None, None, "gone")
    snapshot, done = await ws.receive(), await ws.receive()
    assert snapshot == {
        "type": "snapshot",
        "conversation": conversation.pk,
        "message": reply.pk,
        "content": "saved text, final",
        "reasoning": "",
        "status": "interrupted",
        "model": I14,
        "seq": None,
    }
    assert done["type"] == "done" and done["status"] == "interrupted" and done["error"] == "gone"


async def test_a_socket_follows_only_the_conversation_it_last_opened(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[echo]] one", model=I14)
    first = (await ws.until("done"))[0]["conversation"]
    await ws.send(type="send", conversation=None, content=SLOW, model=I14)
    delta, frames = await first_delta(ws)
    second = frames[0]["conversation"]
    await ws.send(type="attach", conversation=first)
    assert (await ws.until("attached"))[-1] == {"type": "attached", "conversation": first, "message": None}
    assert await ws.nothing_more()  # the other stream's deltas no longer come here
    await ws.send(type="stop", message=delta["message"])  # stop still reaches it
    await ws.send(type="attach", conversation=second)
    attached = (await ws.until("attached"))[-1]
    if attached["message"] is not None:  # the stop had not landed yet: follow it to its end
        assert (await ws.until("done"))[-1]["status"] == "stopped"
    assert (await Message.objects.aget(pk=delta["message"])).status == "stopped"


# --- frames under daphne's 1 MiB limit --------------------------------------------------


def test_a_long_snapshot_is_cut_into_frames_under_the_limit():
    import orjson

    content, reasoning = "\x01" * 300_000 + "✓" * 100_000, "é" * 200_000  # \x01 grows sixfold in JSON
    texts = snapshot_frames(1, 2, content, reasoning, "streaming", "m", 7)
    frames = [orjson.loads(text) for text in texts]
    assert max(len(text.encode()) for text in texts) < 1024 * 1024
    assert frames[0]["type"] == "snapshot" and frames[0]["seq"] == 7 and frames[0]["more"] is True
    assert all(f["type"] == "snapshot_part" and f["message"] == 2 for f in frames[1:])
    assert [f["more"] for f in frames] == [True] * (len(frames) - 1) + [False]
    assert "".join(f.get("content", "") for f in frames) == content
    assert "".join(f.get("reasoning", "") for f in frames) == reasoning
    # a short one stays one plain frame, without `more`
    assert [orjson.loads(t) for t in snapshot_frames(1, 2, "hi", "", "complete", "m", None)] == [
        {"type": "snapshot", "conversation": 1, "message": 2, "content": "hi", "reasoning": "", "status": "complete",
         "model": "m", "seq": None}
    ]  # fmt: skip


async def test_a_huge_upstream_chunk_becomes_several_deltas(connect, alice, providers):
    _, _, ws = await connect(alice)
    with override_settings(CHAT_MAX_REPLY_BYTES=5_000_000):
        await ws.send(type="send", conversation=None, content="[[chunks:3]] [[size:400000]]", model="claude-sonnet-5")
        frames = await ws.until("done", timeout=60)
    deltas = [f for f in frames if f["type"] == "delta"]
    assert frames[-1]["status"] == "complete" and len(deltas) > 1_200_000 // MAX_FRAME_CHARS
    assert max(len(d.get("content", "")) + len(d.get("reasoning", "")) for d in deltas) <= MAX_FRAME_CHARS
    assert [d["seq"] for d in deltas] == list(range(1, len(deltas) + 1))
    reply = await Message.objects.aget(pk=frames[0]["message"])
    assert reply.content == joined(frames, "content") and len(reply.content) == 1_200_000


async def test_a_silent_upstream_fails_after_the_first_byte_timeout(connect, alice, providers):
    _, _, ws = await connect(alice)
    with override_settings(UPSTREAM_FIRST_BYTE_TIMEOUT=1.0):
        # The upstream says nothing for 60 s: a `done` before then is the 1 s timeout's, not
        # UPSTREAM_READ_TIMEOUT's (300 s) nor the upstream's own answer.
        await ws.send(type="send", conversation=None, content="[[wait:60000]] hi", model="claude-sonnet-5")
        frames = await ws.until("done", timeout=30)
    assert frames[-1]["status"] == "failed"
    assert frames[-1]["error"] == "The upstream timed out: the upstream did not answer in time."


async def test_dispatch_all_passes_each_source_in_order_one_at_a_time_and_raises_a_reader_error():
    from chat.compat.channels import dispatch_all

    first, second = asyncio.Queue(), asyncio.Queue()
    for i in range(3):
        first.put_nowait(("a", i))
        second.put_nowait(("b", i))
    seen, busy = [], False

    async def dispatch(message):
        nonlocal busy
        assert not busy  # never two dispatches at once
        busy = True
        seen.append(message)
        await asyncio.sleep(0)
        busy = False
        if len(seen) == 6:
            second.put_nowait(RuntimeError("layer down"))

    async def from_second():
        item = await second.get()
        if isinstance(item, Exception):
            raise item
        return item

    with pytest.raises(RuntimeError, match="layer down"):
        await dispatch_all([first.get, from_second], dispatch)
    assert sorted(seen) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert [m for m in seen if m[0] == "a"] == [("a", 0), ("a", 1), ("a", 2)]
    assert [m for m in seen if m[0] == "b"] == [("b", 0), ("b", 1), ("b", 2)]


async def test_dispatch_all_leaves_no_reference_cycle_for_the_garbage_collector():
    """A closed socket's consumer (its StopConsumer raised by a reader) is freed at once, not at a collection."""
    import gc
    import weakref

    from channels.exceptions import StopConsumer

    from chat.compat.channels import dispatch_all

    class Consumer:
        async def dispatch(self, message):
            raise StopConsumer()

    consumer = Consumer()
    gone = weakref.ref(consumer)
    socket, layer = asyncio.Queue(), asyncio.Queue()
    socket.put_nowait({"type": "websocket.disconnect"})
    gc.disable()
    try:
        with pytest.raises(StopConsumer):
            await dispatch_all([socket.get, layer.get], consumer.dispatch)
        del consumer
        await asyncio.sleep(0)  # one turn of the loop: the readers' done-callbacks let go of them
        assert gone() is None
    finally:
        gc.enable()


async def test_a_frame_that_cannot_reach_redis_gets_a_sentence_and_one_log_line_a_streak(
    connect, alice, providers, monkeypatch, caplog
):
    from redis.exceptions import ConnectionError as RedisConnectionError

    from chat.ws.consumer import ChatConsumer

    async def unreachable(self, fields):
        raise RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    _, _, ws = await connect(alice)
    caplog.set_level(logging.WARNING)
    with monkeypatch.context() as patched:
        patched.setattr(ChatConsumer, "on_attach", unreachable)
        for _ in range(3):
            await ws.send(type="attach", conversation=1)
            error = await ws.receive()
            assert error["type"] == "error" and error["code"] == "server_busy", error
            assert "reconnecting" in error["detail"]
    assert caplog.text.count("websocket frames cannot reach Redis") == 1
    assert "Traceback" not in caplog.text
    await ws.send(type="attach", conversation=1)  # Redis is back: the frame is answered, the streak ends
    await ws.receive()
    assert "websocket frames reach Redis again after 3 failure(s)" in caplog.text


async def test_a_done_whose_saved_text_cannot_be_read_still_goes_and_keeps_the_socket(monkeypatch):
    """A socket waiting for a snapshot reads the saved text at `done`; with the database away it must not close
    (1011): `done` goes, marked recovered, so the page reads the answer again."""
    import types

    from django.db import OperationalError

    from chat.runtime import db_threads
    from chat.ws.consumer import ChatConsumer

    def away(function):
        async def run(*args, **kwargs):
            raise OperationalError("connection refused")

        return run

    monkeypatch.setattr(db_threads, "run", away)
    sent = []

    async def send(text_data):
        sent.append(orjson.loads(text_data))

    consumer = types.SimpleNamespace(attaching={7: None}, send=send)
    done = orjson.dumps({"type": "done", "message": 7, "conversation": 3, "status": "complete"}).decode()
    await ChatConsumer.chat_done(consumer, {"type": "chat.done", "message": 7, "text": done})
    assert sent == [{"type": "done", "message": 7, "conversation": 3, "status": "complete", "recovered": True}]
    assert consumer.attaching == {}
