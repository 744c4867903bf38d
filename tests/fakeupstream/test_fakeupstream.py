"""Tests for fakeupstream.app over a real socket (uvicorn in a thread, httpx client)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fakeupstream.app import I14_MODEL, FakeUpstream
from tests.fakeserver import FakeServer

KEY = "test-key"
DONE = b"data: [DONE]\n\n"
WAIT = 5.0


@pytest.fixture(scope="module")
def fake() -> FakeUpstream:
    return FakeUpstream(api_key=KEY)


@pytest.fixture(scope="module")
def server(fake: FakeUpstream) -> Iterator[FakeServer]:
    with FakeServer(fake) as srv:
        yield srv


@pytest.fixture
def client(server: FakeServer, fake: FakeUpstream) -> Iterator[httpx.Client]:
    fake.reset()
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=10) as c:
        yield c


def body(model: str, text: str, *, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
        ],
        "stream": stream,
        **extra,
    }


def split_events(raw: bytes) -> list[bytes]:
    """Every SSE block, each with its trailing blank line, comments included."""
    assert raw.endswith(b"\n\n") or raw == b"", raw[-50:]
    return [block + b"\n\n" for block in raw.split(b"\n\n")[:-1]]


def data_events(raw: bytes) -> list[bytes]:
    return [e for e in split_events(raw) if e.startswith(b"data: ")]


def payloads(raw: bytes) -> list[Any]:
    return [json.loads(e[6:]) for e in data_events(raw) if e != DONE]


def post(client: httpx.Client, dialect: str, payload: dict[str, Any], **kw: Any) -> httpx.Response:
    return client.post(f"/{dialect}/v1/chat/completions", json=payload, **kw)


def content_of(chunks: list[Any], key: str = "content") -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c.get("choices"))


# --------------------------------------------------------------------------- i14


def test_i14_stream_bytes_match_the_doc(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "i14", body(I14_MODEL, "Write a poem [[reasoning:3]]", max_tokens=8192))
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert "x-request-id" not in r.headers
    events = split_events(r.content)
    assert events == data_events(r.content)  # no comment lines in i14
    assert events[-1] == DONE
    chunks = payloads(r.content)
    cid, created = chunks[0]["id"], chunks[0]["created"]
    assert re.fullmatch(r"req_[0-9a-f]{32}", cid)
    assert all(c["id"] == cid and c["created"] == created for c in chunks)
    head = (
        f'data: {{"id": "{cid}", "object": "chat.completion.chunk", "created": {created}, '
        f'"model": "{I14_MODEL}", "choices": '
    ).encode()
    assert all(e.startswith(head) for e in events[:-1])
    # Byte form of the doc sample: default separators, key order, role on the first chunk.
    assert events[0] == head + (
        b'[{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Ok"}, "finish_reason": null}]}\n\n'
    )
    assert events[1] == head + b'[{"index": 0, "delta": {"reasoning_content": "ay, t"}, "finish_reason": null}]}\n\n'
    assert events[3].startswith(head + b'[{"index": 0, "delta": {"content": "\\n\\n"}, "finish_reason": null}]}')
    # Finish chunk with "usage": null, then the usage-only chunk with choices [] and x_i14_perf.
    assert events[-3] == head + b'[{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": null}\n\n'
    assert events[-2].startswith(head + b'[], "usage": {"prompt_tokens": ')
    usage_chunk = chunks[-1]
    assert list(usage_chunk) == ["id", "object", "created", "model", "choices", "usage", "x_i14_perf"]
    n_content = sum(1 for c in chunks if c["choices"] and "content" in c["choices"][0]["delta"])
    usage = usage_chunk["usage"]
    assert list(usage) == ["prompt_tokens", "completion_tokens", "total_tokens", "completion_tokens_details"]
    assert usage["completion_tokens"] == 3 + n_content
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 3}
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert list(usage_chunk["x_i14_perf"]) == ["tokens_per_second", "generation_time_s", "time_to_first_token_s"]
    text = content_of(chunks)
    assert "demo upstream" in text and "> Write a poem" in text and "```python" in text and "| --- |" in text
    assert "[[" not in text
    assert all(1 <= len(c["choices"][0]["delta"].get("content", "x")) <= 8 for c in chunks if c["choices"])
    rec = fake.last()
    assert rec.completed.wait(WAIT)
    assert rec.dialect == "i14" and rec.finish_reason == "stop"
    assert rec.sent == events and len(rec.sent_at) == len(events)
    assert rec.sent_at == sorted(rec.sent_at) and rec.sent_at[0] >= rec.started_at
    assert not rec.disconnected.is_set()
    assert rec.headers["authorization"] == f"Bearer {KEY}"
    assert rec.body["max_tokens"] == 8192


def test_i14_default_max_tokens_is_100(client: httpx.Client) -> None:
    r = post(client, "i14", body(I14_MODEL, "hello [[chunks:300]]"))
    chunks = payloads(r.content)
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None]
    assert len(tokens) == 100
    reasoning = [c for c in tokens if "reasoning_content" in c["choices"][0]["delta"]]
    assert len(reasoning) == 8  # thinking counts towards the limit
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 100
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 8


def test_i14_thinking_can_use_the_whole_budget(client: httpx.Client) -> None:
    r = post(client, "i14", body(I14_MODEL, "hi [[reasoning:50]]", stream=False, max_tokens=20))
    data = r.json()
    message = data["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning_content"]
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 20


def test_i14_model_not_allowed(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "i14", body("gpt-4o", "hi"))
    assert r.status_code == 403
    assert r.headers["content-type"] == "application/json"
    assert r.content.startswith(b'{"error": {"message": ')
    err = r.json()["error"]
    assert list(err) == ["message", "type", "code"]
    assert err["code"] == "model_not_allowed" and err["type"] == "permission_error"
    assert fake.last().completed.wait(WAIT) and fake.last().status == 403


def test_i14_non_stream_matches_example_shape(client: httpx.Client) -> None:
    r = post(client, "i14", body(I14_MODEL, "Explain [[echo]] transformers", stream=False, max_tokens=2048))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.content.startswith(b'{"id": "req_')
    data = r.json()
    assert list(data) == ["id", "object", "created", "model", "choices", "usage", "x_i14_perf"]
    assert data["object"] == "chat.completion" and data["model"] == I14_MODEL
    choice = data["choices"][0]
    assert list(choice) == ["index", "message", "finish_reason"]
    assert list(choice["message"]) == ["role", "content", "reasoning_content"]
    assert choice["message"]["content"] == "Explain  transformers"
    assert choice["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 8


def test_stream_and_non_stream_agree(client: httpx.Client) -> None:
    for dialect, model in (("i14", I14_MODEL), ("api14", "deepseek/deepseek-r1"), ("infyrence", "gpt-4.1-mini")):
        payload = body(model, "Same text", max_tokens=1000)
        streamed = payloads(post(client, dialect, payload).content)
        single = post(client, dialect, {**payload, "stream": False}).json()
        message = single["choices"][0]["message"]
        assert content_of(streamed) == message["content"]
        key = {"i14": "reasoning_content", "api14": "reasoning"}.get(dialect)
        if key:
            assert content_of(streamed, key) == message[key]


# --------------------------------------------------------------------------- api14


def test_api14_stream_bytes_match_the_doc(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "api14", body("openai/gpt-5-mini", "Explain vector databases [[echo]]"))
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    events = split_events(r.content)
    assert events[0] == b": api14 PROCESSING\n\n"
    data = data_events(r.content)
    assert data[-1] == DONE
    chunks = payloads(r.content)
    cid = chunks[0]["id"]
    assert re.fullmatch(r"gen-\d{10}-[A-Za-z0-9]+", cid)
    head = f'data: {{"id":"{cid}","object":"chat.completion.chunk","model":"openai/gpt-5-mini","choices":'.encode()
    assert data[0] == head + b'[{"index":0,"delta":{"role":"assistant","content":"Expl"}}]}\n\n'
    assert data[1] == head + b'[{"index":0,"delta":{"content":"ain "}}]}\n\n'
    assert all("created" not in c and "finish_reason" not in c["choices"][0] for c in chunks[:-1])
    assert content_of(chunks) == "Explain vector databases"
    final = data[-2]
    m = re.fullmatch(
        rb'data: \{.*"choices":\[\{"index":0,"delta":\{\},"finish_reason":"stop"\}\],'
        rb'"usage":\{"prompt_tokens":(\d+),"completion_tokens":(\d+),"total_tokens":(\d+),"cost":([0-9.]+)\}\}\n\n',
        final,
    )
    assert m, final
    prompt, completion, total = (int(x) for x in m.groups()[:3])
    assert completion == len(chunks) - 1 and total == prompt + completion
    assert b"e-" not in m.group(4)  # plain decimals as in the doc ("cost":0.0000085)
    assert fake.last().comments[0] == b": api14 PROCESSING\n\n"


def test_api14_cost_matches_the_doc_sample(client: httpx.Client) -> None:
    # The doc: 10 prompt + 3 completion tokens on openai/gpt-5-mini cost 0.0000085.
    payload = {"model": "openai/gpt-5-mini", "messages": [{"role": "user", "content": "a b c d e [[chunks:3]]"}]}
    r = post(client, "api14", {**payload, "stream": True})
    assert b'"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"cost":0.0000085}}' in r.content
    single = post(client, "api14", payload)
    assert single.content.endswith(
        b'"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"cost":0.0000085}}'
    )
    assert "created" not in single.json()


def test_api14_reasoning_model(client: httpx.Client) -> None:
    r = post(client, "api14", body("deepseek/deepseek-r1", "think [[echo]]"))
    chunks = payloads(r.content)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "reasoning": "Ok"}
    kinds = ["reasoning" if "reasoning" in c["choices"][0]["delta"] else "content" for c in chunks[:-1]]
    assert kinds == ["reasoning"] * 8 + ["content"] * 2
    assert content_of(chunks) == "think"
    usage = chunks[-1]["usage"]
    assert list(usage) == ["prompt_tokens", "completion_tokens", "total_tokens", "cost", "completion_tokens_details"]
    assert usage["completion_tokens"] == 10 and usage["completion_tokens_details"] == {"reasoning_tokens": 8}


def test_api14_comments_midway_and_keepalive(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "api14", body("openai/gpt-5-mini", "[[chunks:10]] [[comment]]"))
    events = split_events(r.content)
    comments = [e for e in events if e.startswith(b":")]
    assert events[0] == b": api14 PROCESSING\n\n"
    assert comments.count(b": api14 PROCESSING\n\n") == 2
    assert b": keep-alive\n\n" in comments
    assert events[-1] == DONE
    # comments sit between data events, never before the first or after [DONE]
    assert events[1].startswith(b"data: ") and events[2] == b": keep-alive\n\n"
    assert fake.last().comments == comments


def test_api14_unknown_model(client: httpx.Client) -> None:
    r = post(client, "api14", body("nope/model", "hi"))
    assert r.status_code == 404
    assert re.fullmatch(rb'\{"error":\{"code":404,"message":"[^"]+"\}\}', r.content)


# --------------------------------------------------------------------------- infyrence


def test_infyrence_stream_bytes_and_headers(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "Write a haiku [[echo]]"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["connection"] == "keep-alive"
    rid = r.headers["x-request-id"]
    events = split_events(r.content)
    assert events == data_events(r.content)
    chunks = payloads(r.content)
    cid, created = chunks[0]["id"], chunks[0]["created"]
    assert cid == rid and cid.startswith("chatcmpl_")
    head = (
        f'data: {{"id":"{cid}","object":"chat.completion.chunk","created":{created},'
        f'"model":"claude-sonnet-5","choices":'
    ).encode()
    assert events[0] == head + b'[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    assert events[1] == head + b'[{"index":0,"delta":{"content":"Writ"},"finish_reason":null}]}\n\n'
    assert events[-2] == head + b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    assert events[-1] == DONE
    assert all("usage" not in c for c in chunks)  # no include_usage, no usage
    assert content_of(chunks) == "Write a haiku"
    assert fake.last().id == rid


def test_infyrence_include_usage(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("gpt-4.1-mini", "x [[chunks:5]]", stream_options={"include_usage": True}))
    events = data_events(r.content)
    chunks = payloads(r.content)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert list(chunks[-1]) == ["id", "object", "created", "model", "choices", "usage"]
    assert list(chunks[-1]["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens"]
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert events[-2].endswith(
        b'"choices":[],"usage":{"prompt_tokens":15,"completion_tokens":5,"total_tokens":20}}\n\n'
    )


def test_infyrence_non_stream(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "hello [[echo]]", stream=False))
    assert r.status_code == 200
    assert r.headers["x-request-id"]
    data = r.json()
    assert r.headers["x-request-id"] == data["id"]
    assert r.content.startswith(b'{"id":"chatcmpl_')
    assert list(data) == ["id", "object", "created", "model", "choices", "usage"]
    assert data["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "hello"},
        "finish_reason": "stop",
    }
    assert list(data["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens"]


def test_infyrence_unknown_model_has_request_id(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("nope", "hi"))
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found"
    assert err["request_id"] == r.headers["x-request-id"]
    assert r.content.startswith(b'{"error":{"message":')


# --------------------------------------------------------------------------- errors before the first byte


@pytest.mark.parametrize(
    ("dialect", "model"), [("i14", I14_MODEL), ("api14", "openai/gpt-5-mini"), ("infyrence", "claude-sonnet-5")]
)
def test_bad_key_is_401_in_the_dialect_form(client: httpx.Client, dialect: str, model: str) -> None:
    r = post(client, dialect, body(model, "hi"), headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    err = r.json()["error"]
    if dialect == "i14":
        assert r.content.startswith(b'{"error": {"message": "')
        assert err["type"] == "authentication_error" and isinstance(err["code"], str)
    elif dialect == "api14":
        assert r.content.startswith(b'{"error":{"code":401,"message":"')
        assert list(err) == ["code", "message"]
    else:
        assert r.content.startswith(b'{"error":{"message":"')
        assert err["type"] == "authentication_error"
        assert err["request_id"] == r.headers["x-request-id"]
    # the models endpoint needs the key too
    assert client.get(f"/{dialect}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(f"/{dialect}/v1/models", headers={"Authorization": ""}).status_code == 401


@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
def test_status_directive_and_retry_after(client: httpx.Client, dialect: str) -> None:
    model = {"i14": I14_MODEL, "api14": "openai/gpt-5-mini", "infyrence": "claude-sonnet-5"}[dialect]
    for code in (401, 403, 404, 429, 500, 502, 503):
        r = post(client, dialect, body(model, f"hi [[status:{code}]]"))
        assert r.status_code == code
        assert r.headers["content-type"] == "application/json"
        err = r.json()["error"]
        assert err["message"]
        if dialect == "api14":
            assert err["code"] == code
        else:
            assert err["type"] and err["code"]
        if code == 429:
            assert r.headers["retry-after"] == "7"
            if dialect == "i14":
                assert err["type"] == "rate_limit_error"
        else:
            assert "retry-after" not in r.headers
        assert ("x-request-id" in r.headers) == (dialect == "infyrence")


def test_bad_requests(client: httpx.Client) -> None:
    r = client.post("/i14/v1/chat/completions", content=b"not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = post(client, "api14", {"model": "openai/gpt-5-mini"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = post(client, "infyrence", {"model": "claude-sonnet-5", "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["request_id"] == r.headers["x-request-id"]
    assert client.get("/i14/v1/chat/completions").status_code == 405
    assert client.post("/i14/v1/models").status_code == 405
    r = client.get("/i14/v2/models")
    assert r.status_code == 404 and r.json()["error"]
    assert client.get("/nothing/here").status_code == 404


# --------------------------------------------------------------------------- models and routing


def test_models_and_prefix_routing(client: httpx.Client) -> None:
    r = client.get("/_demo/i14/v1/models")
    assert r.status_code == 200
    assert r.json() == {
        "object": "list",
        "data": [{"id": I14_MODEL, "object": "model", "created": r.json()["data"][0]["created"], "owned_by": "i14"}],
    }
    ids = [m["id"] for m in client.get("/x/y/api14/v1/models").json()["data"]]
    assert ids == ["openai/gpt-5-mini", "deepseek/deepseek-r1", "openai/text-embedding-3-small"]
    r = client.get("/infyrence/v1/models")
    assert [m["id"] for m in r.json()["data"]] == ["claude-sonnet-5", "gpt-4.1-mini", "text-embedding-3-small"]
    assert [m.get("type") for m in r.json()["data"]] == [None, None, "embedding"]
    assert r.headers["x-request-id"]
    r = post(client, "_demo/i14", body(I14_MODEL, "hi [[echo]]", max_tokens=50))
    assert r.status_code == 200 and data_events(r.content)[-1] == DONE


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("dialect", "model"), [("i14", I14_MODEL), ("api14", "openai/gpt-5-mini"), ("infyrence", "claude-sonnet-5")]
)
def test_fault_cut_leaves_an_incomplete_body(
    client: httpx.Client, fake: FakeUpstream, dialect: str, model: str
) -> None:
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream(
            "POST", f"/{dialect}/v1/chat/completions", json=body(model, "[[chunks:20]] [[fault:cut]]")
        ) as r:
            assert r.status_code == 200
            for part in r.iter_raw():
                received += part
    rec = fake.last()
    assert rec.completed.wait(WAIT)
    assert DONE not in received and b'"finish_reason":"stop"' not in received
    assert bytes(received) == b"".join([*rec.comments, *rec.sent])  # only api14 has a (leading) comment
    n_content = sum(1 for e in rec.sent if b'"content":"' in e.replace(b": ", b":") and b'"content":""' not in e)
    assert n_content == 10
    assert rec.finish_reason is None and not rec.disconnected.is_set()


def test_fault_midstream_on_i14_is_a_cut(client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, "i14", body(I14_MODEL, "[[chunks:4]] [[fault:midstream]]"))


def test_fault_eof_ends_cleanly_without_finish(client: httpx.Client, fake: FakeUpstream) -> None:
    for dialect, model in (("i14", I14_MODEL), ("api14", "openai/gpt-5-mini"), ("infyrence", "claude-sonnet-5")):
        r = post(client, dialect, body(model, "[[chunks:10]] [[fault:eof]]", stream_options={"include_usage": True}))
        assert r.status_code == 200
        events = data_events(r.content)
        assert DONE not in events
        chunks = payloads(r.content)
        assert all(c["choices"] and c["choices"][0].get("finish_reason") is None for c in chunks)
        assert all("usage" not in c for c in chunks)
        assert content_of(chunks) == "".join(["Streaming ", "tokens ", "from ", "the ", "demo "])
        assert fake.last().sent == events


def test_fault_midstream_api14(client: httpx.Client) -> None:
    r = post(client, "api14", body("openai/gpt-5-mini", "[[chunks:10]] [[fault:midstream]]"))
    assert r.status_code == 200
    events = data_events(r.content)
    assert events[-1] == (
        b'data: { "error": { "code": 502, "message": "Provider disconnected" }, '
        b'"choices": [{ "delta": { "content": "" }, "finish_reason": "error" }] }\n\n'
    )
    assert DONE not in events
    assert len(events) == 6 and b"usage" not in r.content


def test_fault_midstream_infyrence(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "[[chunks:10]] [[fault:midstream]]"))
    assert r.status_code == 200
    events = data_events(r.content)
    assert events[-2:] == [
        b'data: {"error":{"message":"Upstream provider unavailable","type":"upstream_error",'
        b'"code":"upstream_unavailable"}}\n\n',
        DONE,
    ]
    assert len(events) == 1 + 5 + 2


def test_non_stream_faults(client: httpx.Client) -> None:
    r = post(client, "api14", body("openai/gpt-5-mini", "[[fault:midstream]]", stream=False))
    assert r.status_code == 502 and r.json() == {"error": {"code": 502, "message": "Provider disconnected"}}
    r = post(client, "infyrence", body("claude-sonnet-5", "[[fault:midstream]]", stream=False))
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable"
    r = post(client, "infyrence", body("claude-sonnet-5", "[[fault:eof]]", stream=False))
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        r.json()
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, "infyrence", body("claude-sonnet-5", "[[fault:cut]]", stream=False))


# --------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize(
    ("dialect", "model"), [("i14", I14_MODEL), ("api14", "openai/gpt-5-mini"), ("infyrence", "claude-sonnet-5")]
)
def test_tools(client: httpx.Client, dialect: str, model: str) -> None:
    r = post(client, dialect, body(model, "weather? [[tools]] [[reasoning:0]]", max_tokens=500))
    chunks = payloads(r.content)
    tool_chunks = [c for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]
    first = tool_chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    indexes = [c["choices"][0]["delta"]["tool_calls"][0]["index"] for c in tool_chunks]
    assert indexes[:4] == [0, 1, 0, 1]  # interleaved
    args: dict[int, str] = {}
    for c in tool_chunks:
        frag = c["choices"][0]["delta"]["tool_calls"][0]
        args[frag["index"]] = args.get(frag["index"], "") + frag["function"]["arguments"]
    assert [json.loads(a)["city"] for _, a in sorted(args.items())] == ["Paris", "Tokyo"]
    finish = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    assert finish[-1]["choices"][0]["finish_reason"] == "tool_calls"
    single = post(client, dialect, body(model, "weather? [[tools]]", stream=False, max_tokens=500)).json()
    calls = single["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"city": "Paris", "unit": "celsius"},
        {"city": "Tokyo", "unit": "celsius"},
    ]
    assert single["choices"][0]["finish_reason"] == "tool_calls"


def test_tools_answered_get_a_text_answer_quoting_the_results(client: httpx.Client) -> None:
    """The second step of a tool loop: the conversation ends with tool results, so the fake answers in text."""
    payload = body("openai/gpt-5-mini", "weather? [[tools]]", stream=False, max_tokens=500)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    payload["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]
    answer = post(client, "api14", payload).json()["choices"][0]
    assert answer["message"]["content"] == "Tool results: sunny; rain" and answer["finish_reason"] == "stop"
    assert "tool_calls" not in answer["message"]


def test_tools_answer_in_text_once_a_tool_result_follows(client: httpx.Client) -> None:
    asked = body("claude-sonnet-5", "weather? [[tools]]", stream=False)
    calls = post(client, "infyrence", asked).json()["choices"][0]["message"]["tool_calls"]
    asked["messages"] += [{"role": "assistant", "content": None, "tool_calls": calls}] + [
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"} for call in calls
    ]
    message = post(client, "infyrence", asked).json()["choices"][0]
    assert message["finish_reason"] == "stop" and message["message"]["content"] and "tool_calls" not in message


# --------------------------------------------------------------------------- embeddings


def embed(client: httpx.Client, dialect: str, payload: dict[str, Any]) -> httpx.Response:
    return client.post(f"/{dialect}/v1/embeddings", json=payload)


def test_embeddings_are_deterministic_in_openai_form(client: httpx.Client, fake: FakeUpstream) -> None:
    from fakeupstream.embeddings import vector

    payload = {"model": "text-embedding-3-small", "input": ["a b", "c"], "encoding_format": "float"}
    first, again = embed(client, "infyrence", payload), embed(client, "infyrence", payload)
    assert first.content == again.content and first.headers["x-request-id"]
    answer = first.json()
    assert answer["object"] == "list" and answer["model"] == "text-embedding-3-small"
    assert [item["embedding"] for item in answer["data"]] == [vector("a b", 16), vector("c", 16)]
    assert [item["index"] for item in answer["data"]] == [0, 1] and answer["data"][0]["embedding"] != vector("c", 16)
    assert answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert abs(sum(v * v for v in vector("a b", 16)) - 1) < 1e-5
    assert fake.embedding_requests[-1] == payload
    priced = embed(client, "api14", {"model": "openai/text-embedding-3-small", "input": [[1, 2, 3]], "dimensions": 3})
    assert b'"cost":0.00000006}' in priced.content and len(priced.json()["data"][0]["embedding"]) == 3


def test_embeddings_refusals_are_the_dialects_errors(client: httpx.Client) -> None:
    assert embed(client, "i14", {"model": "text-embedding-3-small", "input": "x"}).status_code == 403
    chat_model = embed(client, "api14", {"model": "openai/gpt-5-mini", "input": "x"})
    assert chat_model.status_code == 400 and chat_model.json()["error"]["code"] == 400  # api14's error shape
    assert embed(client, "infyrence", {"model": "text-embedding-3-small", "input": []}).status_code == 400
    assert embed(client, "infyrence", {"model": "text-embedding-3-small", "input": "[[status:503]]"}).status_code == 503
    assert client.get("/infyrence/v1/embeddings").status_code == 405
    assert client.post("/infyrence/v1/embeddings", json={}, headers={"Authorization": "Bearer no"}).status_code == 401
    as_chat = post(client, "infyrence", body("text-embedding-3-small", "hi", stream=False))
    assert as_chat.status_code == 400


def test_length_directive(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "[[chunks:30]] [[length]]"))
    chunks = payloads(r.content)
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) == 10
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    r = post(client, "api14", body("openai/gpt-5-mini", "[[chunks:30]]", max_tokens=7))
    chunks = payloads(r.content)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 7


def test_comment_directive_on_infyrence(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "[[chunks:3]] [[comment]]"))
    events = split_events(r.content)
    assert events[1] == b": keep-alive\n\n"
    assert sum(1 for e in events if e == b": keep-alive\n\n") == len(data_events(r.content)) - 1


def test_list_content_and_directive_removal(client: httpx.Client, fake: FakeUpstream) -> None:
    payload = {
        "model": "gpt-4.1-mini",
        "messages": [
            {"role": "user", "content": "old [[status:500]]"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "  héllo [[echo]] wörld 👋 "}]},
        ],
    }
    r = post(client, "infyrence", payload)
    assert r.json()["choices"][0]["message"]["content"] == "héllo  wörld 👋"
    assert "héllo".encode() in r.content  # UTF-8, not \u escapes
    assert fake.last().directives == {"echo": ""}


def test_default_answer_is_deterministic(client: httpx.Client) -> None:
    a = post(client, "infyrence", body("claude-sonnet-5", "Hello there", stream=False)).json()
    b = post(client, "infyrence", body("claude-sonnet-5", "Hello there", stream=False)).json()
    text = a["choices"][0]["message"]["content"]
    assert text == b["choices"][0]["message"]["content"]
    assert "demo upstream" in text and "> Hello there" in text
    assert "| --- | --- |" in text and "\n- " in text and "```python\n" in text


def test_delay_directive_spaces_events(client: httpx.Client, fake: FakeUpstream) -> None:
    post(client, "infyrence", body("claude-sonnet-5", "[[chunks:3]] [[delay:30]]"))
    rec = fake.last()
    gaps = [b - a for a, b in zip(rec.sent_at, rec.sent_at[1:], strict=False)]
    assert len(gaps) == 5 and min(gaps) >= 0.025


def test_disconnect_is_detected(client: httpx.Client, fake: FakeUpstream) -> None:
    with client.stream(
        "POST", "/api14/v1/chat/completions", json=body("openai/gpt-5-mini", "[[chunks:200]] [[delay:50]]")
    ) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                break
        rec = fake.last()
    # leaving the block closes the connection mid-stream
    assert rec.disconnected.wait(WAIT), "the fake did not notice the client leaving"
    assert rec.completed.wait(WAIT)
    assert rec.disconnected_at is not None and rec.disconnected_at >= rec.started_at
    assert len(rec.sent) < 20 and DONE not in rec.sent
    assert rec.finish_reason is None


def test_completed_and_not_disconnected_after_a_full_stream(client: httpx.Client, fake: FakeUpstream) -> None:
    post(client, "api14", body("openai/gpt-5-mini", "[[chunks:3]]"))
    rec = fake.last()
    assert rec.completed.wait(WAIT)
    assert not rec.disconnected.is_set() and rec.disconnected_at is None
    assert rec.sent[-1] == DONE and rec.finish_reason == "stop"


def test_fault_malformed_sends_an_unreadable_frame(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "[[chunks:10]] [[fault:malformed]]"))
    assert r.status_code == 200
    events = data_events(r.content)
    assert DONE not in events and len(events) == 1 + 5 + 1
    for event in events[:-1]:
        json.loads(event[6:])
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[-1][6:])
    assert events[-1].startswith(b'data: {"id":"chatcmpl_') and fake.last().sent == events


def test_reasoning_directive_on_infyrence_uses_delta_reasoning(client: httpx.Client) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "[[reasoning:3]] [[echo]] hi"))
    chunks = payloads(r.content)
    assert [c["choices"][0]["delta"] for c in chunks[:5]] == [
        {"role": "assistant", "content": ""},
        {"reasoning": "Ok"},
        {"reasoning": "ay, t"},
        {"reasoning": "he "},
        {"content": "hi"},
    ]
    single = post(client, "infyrence", body("claude-sonnet-5", "[[reasoning:3]] [[echo]] hi", stream=False)).json()
    assert single["choices"][0]["message"] == {"role": "assistant", "content": "hi", "reasoning": "Okay, the "}
    none = post(client, "api14", body("deepseek/deepseek-r1", "[[reasoning:0]] [[echo]] hi")).content
    assert b'"reasoning"' not in none and b"reasoning_tokens" not in none


def test_new_directives_size_malformed_html_echoauth(client: httpx.Client, fake: FakeUpstream) -> None:
    r = post(client, "infyrence", body("claude-sonnet-5", "[[chunks:2]] [[size:5000]] [[malformed:1]]"))
    lines = [line for line in r.content.split(b"\n\n") if line]
    assert b"data: {unreadable" in lines and max(map(len, lines)) > 5000
    r = post(client, "i14", body(I14_MODEL, "[[status:502]] [[html]]"))
    assert r.status_code == 502 and r.headers["content-type"] == "text/html"
    assert b"<title>502 Bad Gateway</title>" in r.content
    r = post(client, "infyrence", body("claude-sonnet-5", "[[status:401]] [[echoauth]]"))
    assert r.status_code == 401 and f"Bearer {fake.api_key}" in r.json()["error"]["message"]


def test_caps_bound_the_directives_and_the_log_is_bounded() -> None:
    from fakeupstream import directives

    capped = directives.capped({"chunks": "15000000", "delay": "1e9", "size": "nan", "echo": ""}, directives.DEMO_CAPS)
    assert capped == {"chunks": "5000", "delay": "2000", "size": "2000", "echo": ""}
    app = FakeUpstream(max_records=3)
    for n in range(5):
        app.streams.append(n)
    assert list(app.streams) == [2, 3, 4]


@pytest.mark.parametrize(
    ("dialect", "model"), [("i14", I14_MODEL), ("api14", "openai/gpt-5-mini"), ("infyrence", "claude-sonnet-5")]
)
def test_named_calls_for_n_rounds_then_text(client: httpx.Client, dialect: str, model: str) -> None:
    """[[call:server.tool {json}]] with [[rounds:2]]: the named calls, two rounds, then text quoting the results."""
    text = '[[call:srv.echo {"text": "a"}]] [[call:srv.add {"a": 1}]] [[rounds:2]] [[reasoning:0]]'
    payload = body(model, text, max_tokens=500)
    chunks = payloads(post(client, dialect, payload).content)
    args: dict[int, list[str]] = {}
    for c in chunks:
        for frag in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
            entry = args.setdefault(frag["index"], ["", ""])
            entry[0] += frag.get("function", {}).get("name", "")
            entry[1] += frag.get("function", {}).get("arguments", "")
    assert [(name, json.loads(a)) for name, a in (args[0], args[1])] == [("srv__echo", {"text": "a"}),
                                                                         ("srv__add", {"a": 1})]  # fmt: skip
    call = {"id": "c", "type": "function", "function": {"name": "srv__echo", "arguments": "{}"}}
    one_round = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "r1"}]
    again = post(client, dialect, {**payload, "stream": False, "messages": payload["messages"] + one_round}).json()
    assert again["choices"][0]["finish_reason"] == "tool_calls"  # the second round
    two_rounds = [*one_round, {"role": "assistant", "content": None, "tool_calls": [call]}]
    two_rounds.append({"role": "tool", "content": "r2"})
    done = post(client, dialect, {**payload, "stream": False, "messages": payload["messages"] + two_rounds}).json()
    assert done["choices"][0]["message"]["content"] == "Tool results: r2"


def test_hold_sends_nothing_more_until_the_test_releases_the_stream(client: httpx.Client, fake: FakeUpstream) -> None:
    request = body(I14_MODEL, "[[chunks:5]] [[hold:3]]")
    with client.stream("POST", "/i14/v1/chat/completions", json=request) as response:
        lines = response.iter_lines()
        events = []
        while len(events) < 3:
            line = next(lines)
            if line.startswith("data: "):
                events.append(line)
        record = fake.last()
        # Five chunks come in microseconds unheld: a third of a second is plenty to see that nothing does.
        assert not record.completed.wait(0.3) and len(record.sent) == 3
        record.released.set()
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and len(events) + len(rest) == len(record.sent) > 5
