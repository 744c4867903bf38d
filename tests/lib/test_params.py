"""The field rules every path shares: /v1 forwards only supported fields, and the same ranges everywhere."""

from __future__ import annotations

import openai
import pytest

from chat.lib import model_params
from chat.models import Conversation, Usage
from tests.conftest import MODELS
from tests.live import Tab

pytestmark = pytest.mark.django_db(transaction=True)

I14 = MODELS["i14"]
HI = [{"role": "user", "content": "[[echo]] hi"}]
# Fields the SDK takes as arguments; the others go in extra_body, as a caller would send them.
SDK_ARGUMENTS = {*model_params.SUPPORTED_FIELDS, "logit_bias"}


@pytest.fixture
def sdk(server, alice, providers):
    from chat.models import ApiToken

    token = ApiToken.issue(alice, "tests")[1]
    return openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0, timeout=30)


# --- /v1: refused fields, with the param named, and nothing sent upstream ---------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 10**12}, "max_tokens"),
        ({"max_completion_tokens": 32769}, "max_completion_tokens"),
        ({"n": 128}, "n"),
        ({"n": 2}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"stop": "x" * 1_000_000}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": 2**63}, "seed"),
        ({"stream_options": {"include_usage": True, "chunk_size": 1}}, "stream_options.chunk_size"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"models": ["a", "b"]}, "models"),
        ({"provider": {"order": ["x"]}}, "provider"),
        ({"route": "fallback"}, "route"),
        ({"base_url": "http://attacker.example/v1"}, "base_url"),
        ({"api_key": "sk-other"}, "api_key"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": "hi", "base_url": "x"}]}, "messages[0].base_url"),
        ({"messages": [{"role": "root", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "tool", "content": "42"}]}, "messages[0].tool_call_id"),
        ({"logprobs": True}, "logprobs"),  # accepted as false only: no upstream here returns them
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"store": "yes"}, "store"),
        ({"metadata": ["a"]}, "metadata"),
        ({"stream_options": {"include_obfuscation": 1}}, "stream_options.include_obfuscation"),
    ],
)
def test_unsupported_or_out_of_range_fields_are_refused_naming_the_param(sdk, fake, extra, param):
    request = {"model": I14, "messages": HI}
    known = {k: v for k, v in extra.items() if k in SDK_ARGUMENTS}
    request.update(known)
    others = {k: v for k, v in extra.items() if k not in known}
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(**request, extra_body=others or None)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    assert caught.value.message and "{" not in caught.value.message.split(":", 1)[0]
    assert not fake.app.streams and Usage.objects.count() == 0


def test_only_the_supported_fields_reach_the_upstream(sdk, fake):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    sdk.chat.completions.create(
        model=f"i14/{I14}",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}], "name": "ann"},
            {"role": "assistant", "content": None, "refusal": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "user", "content": "[[echo]] thanks"},
        ],
        max_tokens=32768, temperature=0.5, top_p=0.9, stop=["\n\n"], presence_penalty=0.1, frequency_penalty=-0.1,
        seed=7, n=1, user="ann", tools=tools, tool_choice="auto", parallel_tool_calls=False,
        response_format={"type": "text"}, stream=True, stream_options={"include_usage": False},
    ).close()  # fmt: skip
    sent = fake.app.last().body
    assert sent["model"] == I14 and sent["max_tokens"] == 32768 and sent["tools"] == tools
    assert sent["messages"][2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}],
    }  # the SDK's echoed `refusal` is accepted and not forwarded
    assert set(sent) <= set(model_params.FORWARDED_FIELDS)


def test_what_openais_clients_add_is_taken_and_only_what_an_upstream_acts_on_is_forwarded(sdk, fake):
    """developer messages, reasoning effort and verbosity go on; storage, tracing and caching hints stay here."""
    sdk.chat.completions.create(
        model=I14,
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "[[echo]] hi"}],
        stream=True,
        extra_body={
            "reasoning_effort": "low", "verbosity": "high", "store": False, "metadata": {"run": "7"},
            "prompt_cache_key": "k", "safety_identifier": "u1", "service_tier": "auto", "logprobs": False,
            "stream_options": {"include_usage": True, "include_obfuscation": False},
        },
    ).close()  # fmt: skip
    sent = fake.app.last().body
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (sent["reasoning_effort"], sent["verbosity"]) == ("low", "high")
    assert not set(sent) & set(model_params.DROPPED_FIELDS) and "include_obfuscation" not in sent["stream_options"]


def test_the_check_keeps_only_known_fields_and_drops_nulls():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": None, "stop": "END"}
    assert model_params.check_request(body, max_tokens=100, max_n=1) == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stop": "END",
    }
    assert model_params.check_request({**body, "n": 3}, max_tokens=100, max_n=4)["n"] == 3
    with pytest.raises(model_params.ParamError) as caught:
        model_params.check_request({**body, "max_tokens": 101}, max_tokens=100, max_n=1)
    assert caught.value.param == "max_tokens" and "1 to 100" in caught.value.message
    with pytest.raises(model_params.ParamError) as caught:
        model_params.check_request(
            {**body, "messages": [{"role": "assistant", "content": None}]}, max_tokens=100, max_n=1
        )
    assert caught.value.param == "messages[0].content"


# --- the websocket and the PATCH: the same limits --------------------------------------------


@pytest.mark.parametrize(
    ("fields", "code", "detail"),
    [
        ({"system_prompt": "x" * 1_000_000}, "bad_field", "at most 20000 characters"),
        ({"params": {"stop": "x" * 1_000_000}}, "bad_param", "each of 1 to 200 characters"),
        ({"params": {"max_tokens": 100_000}}, "bad_param", "from 1 to 32768"),
    ],
)
async def test_websocket_send_has_the_same_limits_as_every_path(server, alice, providers, fake, fields, code, detail):
    async with Tab(server, alice) as tab:
        await tab.send(type="send", conversation=None, content="hello", **fields)
        error = await tab.receive()
    assert error["type"] == "error" and error["code"] == code and detail in error["detail"]
    assert await Conversation.objects.acount() == 0 and not fake.app.streams


def test_patch_caps_stop_strings_like_the_websocket(client, alice):
    client.force_login(alice)
    conversation = Conversation.objects.create(owner=alice, title="t")
    url = f"/api/conversations/{conversation.pk}"
    response = client.patch(url, {"params": {"stop": ["ok", "x" * 201]}}, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_param"
    response = client.patch(url, {"system_prompt": "x" * 20_001}, content_type="application/json")
    assert response.status_code == 400 and "20000" in response.json()["error"]["detail"]
    conversation.refresh_from_db()
    assert conversation.params == {} and conversation.system_prompt == ""
