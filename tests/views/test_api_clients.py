"""Real clients against the real server on every dialect: what they send back, the paths they call, the status lines.

openai-py appends `choices[0].message` as it received it (reasoning and all) and calls
models.retrieve, embeddings and paths the server does not serve. The message litellm appends
(its `model_dump()`, nulls and all) is also sent here with httpx, to check each field; the real
litellm client runs in tests/views/test_litellm_client.py.
"""

import base64
import json
import socket
import struct
from decimal import Decimal

import httpx
import openai
import pytest

from chat.models import ApiToken, Budget, Price, Usage
from fakeupstream.dialects import MODELS as FAKE_MODELS
from fakeupstream.embeddings import vector
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)

# A reasoning model per dialect, and the directive that makes it think (infyrence's models think when told).
REASONING = {
    "i14": (MODELS["i14"], ""),
    "api14": ("deepseek/deepseek-r1", ""),
    "infyrence": ("claude-sonnet-5", " [[reasoning:4]]"),
}
# Where each dialect puts an answer's reasoning (the seed documents; infyrence's as api14's).
REASONING_FIELD = {"i14": "reasoning_content", "api14": "reasoning", "infyrence": "reasoning"}
# Anything a client appends back about reasoning, which no dialect documents taking (none is forwarded).
REASONING_KEYS = {"reasoning_content", "reasoning", "reasoning_details", "thinking_blocks", "provider_specific_fields"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def token(alice):
    return ApiToken.issue(alice, "clients")[1]


@pytest.fixture
def sdk(server, token, providers):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0, timeout=30)


def ask(sdk, model: str, messages: list, stream: bool, **extra):
    """One completion through openai-py; the assistant message as the client has it to append."""
    if not stream:
        return sdk.chat.completions.create(model=model, messages=messages, **extra).choices[0].message
    with sdk.chat.completions.stream(model=model, messages=messages, **extra) as events:
        return events.get_final_completion().choices[0].message


def sent_upstream(fake) -> list[dict]:
    record = fake.app.last()
    assert record.completed.wait(30)
    return record.body["messages"]


# --- a reply sent back --------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
def test_a_two_turn_conversation_appends_the_reasoning_reply_as_received(sdk, fake, dialect, stream):
    model, think = REASONING[dialect]
    messages = [{"role": "user", "content": "Name a colour." + think}]
    reply = ask(sdk, model, messages, stream)
    assert reply.content and (reply.model_extra or {}).get(REASONING_FIELD[dialect])  # the reasoning came back
    messages += [reply, {"role": "user", "content": "And another?" + think}]

    second = ask(sdk, model, messages, stream)

    assert second.content and "You wrote" in second.content
    history = sent_upstream(fake)
    assert history[1] == {"role": "assistant", "content": reply.content}  # reasoning dropped: no dialect takes it
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    assert list(Usage.objects.order_by("started").values_list("status", flat=True)) == ["complete", "complete"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
def test_a_two_step_tool_loop_appends_the_tool_calling_reply_as_received(sdk, fake, dialect, stream):
    model, think = REASONING[dialect]
    messages = [{"role": "user", "content": "What is the weather in Paris and Oslo? [[tools]]" + think}]
    reply = ask(sdk, model, messages, stream, tools=[WEATHER])
    assert len(reply.tool_calls) == 2 and (reply.model_extra or {}).get(REASONING_FIELD[dialect])
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "clear"})})

    answer = ask(sdk, model, messages, stream, tools=[WEATHER])

    assert answer.content and not answer.tool_calls  # the loop's second step ends it
    history = sent_upstream(fake)
    assert not REASONING_KEYS & set(history[1])
    assert [call["id"] for call in history[1]["tool_calls"]] == [call.id for call in reply.tool_calls]
    assert history[1]["tool_calls"][0] == {
        "id": reply.tool_calls[0].id, "type": "function",
        "function": {"name": "get_weather", "arguments": reply.tool_calls[0].function.arguments},
    }  # fmt: skip
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "tool"]


def litellm_message(content: str, reasoning: str, tool_calls=None) -> dict:
    """An assistant message as litellm's Message.model_dump() writes it (litellm/types/utils.py)."""
    return {
        "content": content, "role": "assistant", "tool_calls": tool_calls, "function_call": None, "audio": None,
        "images": None, "reasoning_content": reasoning, "thinking_blocks": None, "provider_specific_fields": None,
        "annotations": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "appended",
    [
        litellm_message("Blue.", "The user wants a colour."),
        litellm_message(None, "Two cities.", [{"id": "call_1", "type": "function", "index": 0,
                        "function": {"name": "get_weather", "arguments": "{}"}, "provider_specific_fields": None}]),
        {"role": "assistant", "content": "Blue.", "reasoning": "Hm.", "reasoning_details": [{"type": "reasoning.text",
         "text": "Hm."}], "refusal": None},  # api14, as openai-node hands it back
        {"role": "assistant", "content": "Blue.", "reasoning": None, "reasoning_content": None, "name": None,
         "tool_calls": None, "parsed": None},
    ],
    ids=["litellm", "litellm-tools", "api14", "nulls"],
)  # fmt: skip
def test_reasoning_fields_and_nulls_in_an_assistant_message_are_accepted_and_not_forwarded(
    server, token, providers, fake, appended
):
    messages = [{"role": "user", "content": "Name a colour."}, appended]
    if appended.get("tool_calls"):
        messages.append({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
    messages.append({"role": "user", "content": "Another?", "name": None})
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": MODELS["api14"], "messages": messages},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    forwarded = sent_upstream(fake)[1]
    assert forwarded["role"] == "assistant" and not REASONING_KEYS & set(forwarded)
    assert not [key for key, value in forwarded.items() if value is None and key != "content"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"reasoning": {"effort": "high"}}, "reasoning", "Unrecognized request argument supplied: reasoning"),
        ({"top_k": 40}, "top_k", "Unrecognized request argument supplied: top_k"),
        ({"messages": [{"role": "assistant", "content": "x", "thoughts": "y"}]}, "messages[0].thoughts",
         "Unrecognized field `thoughts` in an assistant message."),
        ({"messages": [{"role": "user", "content": "x", "reasoning": "y"}]}, "messages[0].reasoning",
         "Unrecognized field `reasoning` in a user message."),
    ],
)  # fmt: skip
def test_unknown_parameters_are_still_refused(server, token, providers, fake, body, param, message):
    request = {"model": MODELS["i14"], "messages": [{"role": "user", "content": "hi"}], **body}
    response = httpx.post(
        server.url + "/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": message, "type": "invalid_request_error", "param": param, "code": "unknown_parameter"
    }  # fmt: skip
    assert not fake.app.streams  # nothing went upstream


# --- models -------------------------------------------------------------------------------------


def test_models_retrieve_and_the_lists_created_are_the_upstreams(sdk):
    listed = {model.id: model for model in sdk.models.list()}
    for dialect, model_id in (("api14", "openai/gpt-5-mini"), ("infyrence", "claude-sonnet-5")):
        assert listed[model_id].created == FAKE_MODELS[dialect][model_id].created
        retrieved = sdk.models.retrieve(model_id)
        assert (retrieved.id, retrieved.object, retrieved.created) == (model_id, "model", listed[model_id].created)
        assert retrieved.owned_by == dialect
    assert sdk.models.retrieve("infyrence/claude-sonnet-5").id == "infyrence/claude-sonnet-5"
    # The embedding models are marked as the upstream marks them; the others are not.
    assert listed["text-embedding-3-small"].model_extra["type"] == "embedding"
    assert "type" not in listed["claude-sonnet-5"].model_extra
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.models.retrieve("no-such-model")
    assert "no-such-model" in caught.value.message and caught.value.code == "model_not_found"


def test_a_model_another_group_may_use_is_not_retrieved(sdk, alice, providers):
    from django.contrib.auth.models import Group

    from chat.models import ModelAccess

    ModelAccess.objects.create(provider=providers["infyrence"]).groups.add(Group.objects.create(name="research"))
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.models.retrieve("claude-sonnet-5")
    assert caught.value.code == "model_not_found"
    assert sdk.models.retrieve("openai/gpt-5-mini").owned_by == "api14"


# --- embeddings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings_through_openai_py_are_the_providers_and_metered(sdk, fake, providers, encoding):
    Price.objects.create(model="text-embedding-3-small", prompt=Decimal("0.02"), completion=Decimal("0"))
    extra = {} if encoding == "base64" else {"encoding_format": "float"}  # openai-py asks for base64 by default
    result = sdk.embeddings.create(model="text-embedding-3-small", input=["red sky", "blue sea at night"], **extra)
    assert [item.embedding for item in result.data] == [vector("red sky", 16), vector("blue sea at night", 16)]
    assert result.usage.prompt_tokens == 2 + 4
    assert fake.app.embedding_requests[-1]["encoding_format"] == encoding
    row = Usage.objects.get()
    assert (row.status, row.source, row.model, row.provider_id) == (
        "complete", "api", "text-embedding-3-small", providers["infyrence"].pk,
    )  # fmt: skip
    assert (row.prompt_tokens, row.completion_tokens, row.total_tokens, row.estimated) == (6, 0, 6, False)
    assert row.cost == Decimal("0.02") * 6 / 1_000_000  # priced: infyrence reports no cost


def test_embeddings_take_a_reported_cost_the_provider_prefix_and_dimensions(sdk, fake):
    result = sdk.embeddings.create(
        model="api14/openai/text-embedding-3-small", input="one two three", dimensions=4, encoding_format="float"
    )
    assert result.data[0].embedding == vector("one two three", 4)
    assert fake.app.embedding_requests[-1]["model"] == "openai/text-embedding-3-small"  # the prefix stays here
    row = Usage.objects.get()
    assert row.cost == Decimal("0.00000006") and row.prompt_tokens == 3  # api14's own cost: 3 x 20 nano-dollars


def test_embeddings_are_budgeted_and_refused_in_openai_shape(sdk, alice, fake):
    Budget.objects.create(user=alice, tokens=2)
    sdk.embeddings.create(model="text-embedding-3-small", input="a b", encoding_format="float")
    with pytest.raises(openai.RateLimitError) as caught:
        sdk.embeddings.create(model="text-embedding-3-small", input="c d", encoding_format="float")
    assert (caught.value.code, caught.value.type) == ("budget_exceeded", "insufficient_quota")
    assert len(fake.app.embedding_requests) == 1  # the refused one never went upstream
    assert sorted(Usage.objects.values_list("status", flat=True)) == ["complete", "refused"]


def test_embeddings_errors_are_the_sdks_and_metered_as_failed(sdk, fake):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(model="text-embedding-3-small", input="x", encoding_format="hex")
    assert caught.value.body["param"] == "encoding_format"
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="no-such-model", input="x")
    with pytest.raises(openai.InternalServerError):
        sdk.embeddings.create(model="text-embedding-3-small", input="[[status:500]] x")
    with pytest.raises(openai.BadRequestError):  # the upstream's own: a chat model makes no embeddings
        sdk.embeddings.create(model="claude-sonnet-5", input="x")
    assert sorted(Usage.objects.values_list("status", flat=True)) == ["failed", "failed"]
    assert set(Usage.objects.values_list("prompt_tokens", "estimated")) == {(0, False)}  # refused: nothing billed


def test_base64_embeddings_are_the_upstreams_bytes(server, token, providers, fake):
    response = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": "text-embedding-3-small", "input": "hi", "encoding_format": "base64"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    raw = base64.b64decode(response.json()["data"][0]["embedding"])
    assert list(struct.unpack("<16f", raw)) == vector("hi", 16)


# --- every /v1 path answers in OpenAI's shape ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/completions"), ("GET", "/v1/files"), ("POST", "/v1/embeddings/x"), ("GET", "/v1"),
     ("DELETE", "/v1/models/x/y/z/w"), ("POST", "/v1/audio/speech")],
)  # fmt: skip
def test_unknown_v1_paths_answer_in_openai_error_json(server, token, providers, method, path):
    response = httpx.request(method, server.url + path, headers={"Authorization": f"Bearer {token}"}, json={})
    assert response.status_code in (404, 405) and response.headers["content-type"] == "application/json"
    assert response.json()["error"]["message"] and response.json()["error"]["type"] == "invalid_request_error"


def test_openai_py_says_what_was_not_found(sdk):
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.completions.create(model=MODELS["i14"], prompt="hi")
    assert caught.value.body["message"] == "Invalid URL (POST /v1/completions)"


# --- status lines -------------------------------------------------------------------------------


def status_line(server, request: bytes) -> bytes:
    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while b"\r\n" not in received:
            piece = sock.recv(4096)
            assert piece, "the server closed the connection before a status line"
            received += piece
    return received.split(b"\r\n", 1)[0]


def test_a_429_says_too_many_requests_on_its_status_line(server, token, providers):
    body = json.dumps({"model": MODELS["infyrence"], "messages": [{"role": "user", "content": "[[status:429]]"}]})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()
    assert status_line(server, request) == b"HTTP/1.1 429 Too Many Requests"
