"""POST /v1/responses with the real OpenAI SDK for Python against the real server, on each dialect of the fake."""

import asyncio
import json
import time
from decimal import Decimal

import httpx
import openai
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.actions.streams import REVOKED
from chat.models import ApiToken, Budget, StoredResponse, Usage
from chat.models.responses import BrokenChain
from tests.conftest import DIALECTS, FAKE_KEY

pytestmark = pytest.mark.django_db(transaction=True)

# A reasoning model per dialect; [[reasoning:3]] makes the fake think on every one of them.
REASONING = {
    "i14": "i14-sugarglider-nemotron3-super-120B-v1",
    "api14": "deepseek/deepseek-r1",
    "infyrence": "claude-sonnet-5",
}
THINK = "[[reasoning:3]] "
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}},
}


@pytest.fixture
def token(alice):
    return ApiToken.issue(alice, "tests")[1]


@pytest.fixture
def sdk(server, token, providers):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0, timeout=30)


def post(server, token, body):
    return httpx.post(server.url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def sent_messages(fake, n=-1):
    """The messages the upstream received in its n-th request."""
    return fake.app.streams[n].body["messages"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_create_two_turns_with_reasoning_and_previous_response_id(sdk, fake, dialect):
    model = REASONING[dialect]
    first = sdk.responses.create(model=model, input=THINK + "[[echo]] Hello there", instructions="Be brief.")
    assert first.status == "completed" and first.output_text == "Hello there"
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "message"]
    assert first.output[0].summary[0].text  # the upstream's reasoning, as a summary
    assert first.usage.output_tokens_details.reasoning_tokens == 3 or dialect == "infyrence"
    assert first.usage.input_tokens > 0 and first.usage.total_tokens >= first.usage.output_tokens
    assert sent_messages(fake) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": THINK + "[[echo]] Hello there"},
    ]

    second = sdk.responses.create(model=model, input=THINK + "[[echo]] Again", previous_response_id=first.id)
    assert second.output_text == "Again" and second.previous_response_id == first.id
    # Only the new input was sent; the history came from the stored response, reasoning left out.
    assert sent_messages(fake) == [
        {"role": "user", "content": THINK + "[[echo]] Hello there"},
        {"role": "assistant", "content": "Hello there"},
        {"role": "user", "content": THINK + "[[echo]] Again"},
    ]
    rows = Usage.objects.order_by("pk")
    assert [row.status for row in rows] == ["complete", "complete"]  # one usage row per upstream request
    assert StoredResponse.objects.get(pk=second.id).owner.username == "alice"


def test_a_chain_of_follow_ups_stores_each_turn_once_and_sends_them_all(sdk, fake, alice):
    """Each stored response held its whole history, so a conversation took space growing with the square of its
    turns; each now holds its own input and output, and a follow-up is sent the whole chain."""
    previous, texts = None, ["one", "two", "three", "four"]
    for text in texts:
        previous = sdk.responses.create(model="claude-sonnet-5", input=f"[[echo]] {text}",
                                        previous_response_id=previous.id if previous else None)  # fmt: skip
    assert [m["content"] for m in sent_messages(fake)] == [
        "[[echo]] one", "one", "[[echo]] two", "two", "[[echo]] three", "three", "[[echo]] four",
    ]  # fmt: skip
    rows = StoredResponse.objects.order_by("created")
    assert [len(row.input) for row in rows] == [1, 1, 1, 1] and rows.last().previous == rows[2].pk
    # An earlier turn gone (deleted, past retention): a follow-up says so, rather than answering without it.
    rows.first().delete()
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="claude-sonnet-5", input="more", previous_response_id=previous.id)
    assert caught.value.code == "previous_response_unusable" and "has been deleted" in caught.value.message
    with pytest.raises(BrokenChain, match="over 100 bytes"):
        StoredResponse.objects.owned_by(alice).conversation(previous.id, max_bytes=100)


def test_a_stored_response_is_read_and_deleted_by_its_owner_only(sdk, fake, server, bob, providers):
    first = sdk.responses.create(model="claude-sonnet-5", input="[[echo]] keep me")
    again = sdk.responses.retrieve(first.id)
    assert (again.id, again.status, again.output_text, again.model) == (first.id, "completed", "keep me", first.model)
    bobs = ApiToken.issue(bob, "bob")[1]
    for method in ("GET", "DELETE"):  # someone else's is as unknown as a made-up id
        other = httpx.request(method, f"{server.url}/v1/responses/{first.id}",
                              headers={"Authorization": f"Bearer {bobs}"})  # fmt: skip
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    deleted = sdk.responses.delete(first.id)  # the SDK returns nothing for a 200
    assert deleted is None and not StoredResponse.objects.filter(pk=first.id).exists()
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)


def test_a_nul_in_the_input_or_the_output_is_stored_as_u_fffd(sdk, fake):
    """A stored response's text cannot hold U+0000 (PostgreSQL's jsonb refuses it): it is kept as U+FFFD."""
    first = sdk.responses.create(model=REASONING["i14"], input="[[nul]] a\x00b")
    assert first.status == "completed"
    stored = StoredResponse.objects.get(pk=first.id)
    stored_input, stored_output = (json.dumps(v, ensure_ascii=False) for v in (stored.input, stored.output))
    assert "\x00" not in stored_input and "a\ufffdb" in stored_input
    assert "\x00" not in stored_output and "before\ufffd after" in stored_output
    second = sdk.responses.create(model=REASONING["i14"], input="[[echo]] more", previous_response_id=first.id)
    assert second.output_text == "more"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_events_in_order_and_the_final_response(sdk, fake, dialect):
    with sdk.responses.stream(model=REASONING[dialect], input=THINK + "[[echo]] Streamed words here") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    for kind in (
        "response.output_item.added",
        "response.reasoning_summary_text.delta",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_item.done",
    ):
        assert kind in kinds, kind
    # Reasoning comes before the text, each item closed before the next opens.
    assert kinds.index("response.reasoning_summary_text.delta") < kinds.index("response.output_text.delta")
    assert final.output_text == "Streamed words here" and final.status == "completed"
    assert final.usage.output_tokens > 0
    usage = Usage.objects.get()
    assert usage.status == "complete" and usage.completion_tokens == final.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_loop_with_function_call_output(sdk, fake, dialect, stream):
    model = REASONING[dialect]
    prompt = THINK + "[[tools]] What is the weather in Paris and Tokyo?"
    if stream:
        with sdk.responses.stream(model=model, input=prompt, tools=[WEATHER]) as events:
            kinds = [event.type for event in events]
            first = events.get_final_response()
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    else:
        first = sdk.responses.create(model=model, input=prompt, tools=[WEATHER])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [orjson.loads(call.arguments)["city"] for call in calls] == ["Paris", "Tokyo"]
    assert all(call.name == "get_weather" and call.call_id for call in calls)
    assert sent_messages(fake)[-1]["content"] == prompt and fake.app.last().body["tools"][0]["function"]["name"]

    outputs = [{"type": "function_call_output", "call_id": call.call_id, "output": f"sunny in {n}"} for n, call in
               enumerate(calls)]  # fmt: skip
    second = sdk.responses.create(model=model, input=outputs, tools=[WEATHER], previous_response_id=first.id)
    assert second.output_text == "Tool results: sunny in 0; sunny in 1"
    messages = sent_messages(fake)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == [call.call_id for call in calls]
    assert "reasoning" not in messages[1] and "reasoning_content" not in messages[1]
    assert Usage.objects.count() == 2


def test_whole_history_as_items_without_previous_response_id(sdk, fake):
    """A client that keeps its own history sends items back: messages, function calls and their outputs."""
    items = [
        {"role": "developer", "content": "Answer with the tool."},
        {"role": "user", "content": [{"type": "input_text", "text": "[[tools]] weather?"}]},
        {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
    ]
    answer = sdk.responses.create(model=REASONING["api14"], input=items, tools=[WEATHER])
    assert answer.output_text == "Tool results: rain"
    assert sent_messages(fake) == [
        {"role": "system", "content": "Answer with the tool."},
        {"role": "user", "content": [{"type": "text", "text": "[[tools]] weather?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ]  # fmt: skip


def test_item_references_resolve_to_the_persons_stored_items(sdk, fake, server, bob, providers):
    first = sdk.responses.create(model=REASONING["i14"], input=THINK + "[[echo]] one")
    references = [{"type": "item_reference", "id": item.id} for item in first.output]
    items = [{"role": "user", "content": "zero"}, *references, {"role": "user", "content": "[[echo]] two"}]
    sdk.responses.create(model=REASONING["i14"], input=items)
    assert sent_messages(fake) == [
        {"role": "user", "content": "zero"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "[[echo]] two"},
    ]
    # Someone else's response is unknown to bob, as a made-up one is.
    bobs = openai.OpenAI(base_url=server.url + "/v1", api_key=ApiToken.issue(bob, "t")[1], max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        bobs.responses.create(model=REASONING["i14"], input="hi", previous_response_id=first.id)
    assert caught.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        bobs.responses.create(model=REASONING["i14"], input=references)
    assert Usage.objects.count() == 2  # refused before any upstream request


def test_store_false_keeps_nothing(sdk, fake):
    answer = sdk.responses.create(model=REASONING["api14"], input="[[echo]] x", store=False)
    assert answer.output_text == "x" and answer.store is False
    assert not StoredResponse.objects.exists()
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model=REASONING["api14"], input="y", previous_response_id=answer.id)


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_makes_an_incomplete_response(sdk, fake, stream):
    if stream:
        with sdk.responses.stream(model="claude-sonnet-5", input="[[chunks:30]]", max_output_tokens=5) as events:
            seen = list(events)
        assert seen[-1].type == "response.incomplete"  # as OpenAI ends it (get_final_response() wants completed)
        answer = seen[-1].response
    else:
        answer = sdk.responses.create(model="claude-sonnet-5", input="[[chunks:30]]", max_output_tokens=5)
    assert fake.app.last().body["max_tokens"] == 5
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.output_text


def test_a_failed_stream_ends_with_response_failed_and_is_metered(sdk, fake):
    with sdk.responses.stream(model="openai/gpt-5-mini", input="[[fault:midstream]] [[chunks:20]]") as events:
        seen = list(events)
    assert seen[-1].type == "response.failed"
    assert seen[-1].response.status == "failed" and "Provider disconnected" in seen[-1].response.error.message
    assert any(event.type == "response.output_text.delta" for event in seen)  # the text before the failure
    # The message was never finished: "incomplete", in its own event as in the failed response.
    done = [event.item for event in seen if event.type == "response.output_item.done" and event.item.type == "message"]
    assert [item.status for item in done] == ["incomplete"] == [seen[-1].response.output[-1].status]
    usage = Usage.objects.get()
    assert usage.status == "failed" and "Provider disconnected" in usage.error


def test_upstream_errors_keep_their_status(sdk, fake):
    with pytest.raises(openai.RateLimitError):
        sdk.responses.create(model="claude-sonnet-5", input="[[status:429]] hi")
    assert Usage.objects.get().status == "failed"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "claude-sonnet-5", "input": "hi", "background": True}, "background"),
        ({"model": "claude-sonnet-5", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"model": "claude-sonnet-5", "input": "hi", "truncation": "middle"}, "truncation"),
        ({"model": "claude-sonnet-5", "input": [{"type": "file_search_call", "id": "x"}]}, "input[0].type"),
        ({"model": "claude-sonnet-5", "input": ""}, "input"),
        ({"model": "claude-sonnet-5", "input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"model": "claude-sonnet-5", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_unsupported_fields_get_a_clear_400(server, token, providers, body, param):
    response = post(server, token, body)
    assert response.status_code == 400, response.text
    assert "no-store" in response.headers["cache-control"]
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert not Usage.objects.exists()


def test_a_bad_token_is_401_before_a_bad_body(server, providers):
    response = post(server, "sk-chat-wrong", {"background": True})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_over_budget_is_a_429_and_nothing_goes_upstream(sdk, alice, fake):
    Budget.objects.create(user=alice, usd=Decimal("0.50"))
    Usage.objects.create(user=alice, model="claude-sonnet-5", status="complete", cost=Decimal("0.50"))
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.responses.create(model="claude-sonnet-5", input="hi")
    assert caught.value.body["type"] == "insufficient_quota" and caught.value.code == "budget_exceeded"
    assert not fake.app.streams
    assert Usage.objects.get(status="refused").source == "api"


def test_a_client_that_leaves_closes_the_upstream_and_is_metered(server, token, providers, fake):
    body = {"model": "claude-sonnet-5", "input": "[[chunks:200]] [[delay:100]]", "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-accel-buffering"] == "no" and "no-store" in response.headers["cache-control"]
        for line in response.iter_lines():
            if line.startswith("data:") and "response.output_text.delta" in line:
                break
    record = fake.app.last()
    assert record.disconnected.wait(30), "the upstream connection was left open"
    deadline = time.monotonic() + 30
    while (usage := Usage.objects.first()).status == "streaming" and time.monotonic() < deadline:
        time.sleep(0.02)  # settled as the cancelled stream unwinds, just after the disconnect
    assert usage.status == "stopped" and usage.error == "the client disconnected" and usage.completion_tokens > 0


def test_a_stream_left_early_is_estimated_at_most_max_output_tokens(server, token, providers, fake):
    """Its text, 200 characters a token here, would be estimated far past the request's cap: the cap is
    the request's max_output_tokens (it was the server's default max_tokens, 8192)."""
    prompt = "[[chunks:1000]] [[size:200]] [[delay:50]]"
    body = {"model": "claude-sonnet-5", "input": prompt, "stream": True, "max_output_tokens": 20}
    with httpx.stream(
        "POST", server.url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as response:
        deltas = 0
        for line in response.iter_lines():
            deltas += line.startswith("data:") and "response.output_text.delta" in line
            if deltas == 10:
                break
    assert fake.app.last().disconnected.wait(30)
    deadline = time.monotonic() + 30
    while (usage := Usage.objects.first()).status == "streaming" and time.monotonic() < deadline:
        time.sleep(0.02)  # settled as the cancelled stream unwinds, just after the disconnect
    assert (usage.status, usage.estimated, usage.completion_tokens) == ("stopped", True, 20)


@pytest.mark.parametrize("stream", [False, True])
def test_the_providers_key_echoed_in_an_answer_is_redacted(server, token, providers, fake, stream):
    body = {"model": "claude-sonnet-5", "input": f"[[echo]] {FAKE_KEY}", "stream": stream}
    response = post(server, token, body)
    # The fake answers with the words of the input: the key, as an upstream that echoes it would.
    assert response.status_code == 200 and FAKE_KEY not in response.text and "[redacted]" in response.text
    assert FAKE_KEY not in orjson.dumps(StoredResponse.objects.get().output).decode()


async def test_revoking_the_token_ends_its_running_response_stream(server, alice, providers, fake):
    token, secret = await sync_to_async(ApiToken.issue)(alice, "script")
    body = {"model": "claude-sonnet-5", "input": "[[delay:200]] [[chunks:100000]]", "stream": True}
    received = b""
    async with httpx.AsyncClient(timeout=60) as client:
        headers = {"Authorization": f"Bearer {secret}"}
        async with client.stream("POST", server.url + "/v1/responses", json=body, headers=headers) as answer:
            async with asyncio.timeout(60):  # an endless stream that is never stopped fails here
                async for piece in answer.aiter_raw():
                    received += piece
                    if b"response.output_text.delta" in received and not token.revoked:
                        token.revoked = timezone.now()
                        await ApiToken.objects.filter(pk=token.pk).aupdate(revoked=token.revoked)
    assert b"event: response.failed" in received and REVOKED.encode() in received
    usage = await Usage.objects.aget()
    assert usage.status == "interrupted" and usage.error == REVOKED
