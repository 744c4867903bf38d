"""The upstream client on every dialect and fault, over a real socket, with both transports."""

import asyncio
from decimal import Decimal

import httpx
import orjson
import pytest
import pytest_asyncio

from chat.streaming import upstream
from chat.streaming.sse import SSEDecoder
from chat.streaming.upstream import StreamState, Timeouts, UpstreamError
from tests.conftest import FAKE_KEY, MODELS
from tests.seeds import API14_STREAM, I14_STREAM


@pytest_asyncio.fixture(params=["aiohttp", "httpx"])
async def client(request):
    client = upstream.make_client(50, request.param)
    yield client
    await client.aclose()


async def run(client, fake, dialect, content, *, model=None, timeouts=Timeouts(), key=FAKE_KEY, **params):
    """Stream one request; return (state, events, error raised or None)."""
    loop = asyncio.get_running_loop()
    payload = upstream.build_payload(model or MODELS[dialect], [{"role": "user", "content": content}], params)
    state, events, error = StreamState(started_at=loop.time()), [], None
    try:
        async with upstream.open_stream(client, fake.base_url(dialect), key, payload, timeouts) as stream:
            state.request_id = stream.request_id or ""
            await stream.read(state, forward=lambda event, chunk: events.append(event))
    except UpstreamError as exc:
        error = exc
    return state, events, error


def sent_text(record, field):
    """What the fake put in `field` of its deltas, read from the bytes it wrote."""
    parts = []
    for event in record.sent:
        data = event.removeprefix(b"data: ").strip()
        if data == b"[DONE]" or not data.startswith(b"{"):
            continue
        for choice in orjson.loads(data).get("choices") or []:
            parts.append((choice.get("delta") or {}).get(field) or "")
    return "".join(parts)


# --- pure parts on the documents' own examples ----------------------------------------


def feed_all(stream: bytes) -> StreamState:
    state = StreamState(started_at=0.0)
    decoder = SSEDecoder()
    for i, event in enumerate(decoder.feed(stream) + decoder.close()):
        state.feed(event.data, 1.0 + i)
    return state


def test_i14_example_state_and_metering():
    state = feed_all(I14_STREAM)
    assert (state.reasoning_text, state.text) == ("Okay, t", "\n\n**Ode")
    assert state.done and state.finish_reason == "stop" and state.outcome() == "complete"
    assert state.upstream_id == "req_5037a8cd7b5c48db8defd10bef0adb77"
    assert state.perf == {"tokens_per_second": 36.328, "generation_time_s": 23.9208, "time_to_first_token_s": 0.0957}
    usage = state.metering(prompt_chars=1000, now=11.0)
    assert usage["prompt_tokens"] == 45 and usage["completion_tokens"] == 869
    assert usage["reasoning_tokens"] == 753 and usage["total_tokens"] == 914
    assert usage["cost"] is None and usage["estimated"] is False
    assert usage["ttft_ms"] == 1000 and usage["duration_ms"] == 11000
    assert usage["tokens_per_second"] == round(869 / 10, 2)


def test_an_answer_that_came_whole_has_no_speed():
    """A non-streamed answer (or one event of text) was not timed as it was made: no tokens per second."""
    state = StreamState(started_at=0.0)
    whole = {"id": "x", "choices": [{"message": {"content": "Hello there"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 155, "total_tokens": 160}}  # fmt: skip
    state.feed_chunk(whole, 0.276)
    state.ended_at = 0.27601
    usage = state.metering(prompt_chars=10, now=0.3)
    assert usage["tokens_per_second"] is None and usage["completion_tokens"] == 155
    assert usage["ttft_ms"] == 276 == usage["duration_ms"]  # the whole answer is its first token


def test_api14_example_cost_is_kept_exactly():
    state = feed_all(API14_STREAM)
    assert state.text == "Hello!" and state.upstream_id == "gen-1760000000-abc"
    usage = state.metering(prompt_chars=40, now=5.0)
    assert usage["cost"] == Decimal("0.0000085") and usage["total_tokens"] == 13 and not usage["estimated"]


def test_without_usage_the_counts_are_estimated():
    state = StreamState(started_at=0.0)
    state.feed(b'{"choices":[{"delta":{"content":"abcdefgh"}}]}', 0.5)
    state.feed(b'{"choices":[{"delta":{"reasoning":"abcd"}}]}', 0.6)
    usage = state.metering(prompt_chars=41, now=2.5)
    assert usage["estimated"] and usage["prompt_tokens"] == 11
    assert usage["completion_tokens"] == 3 and usage["reasoning_tokens"] == 1 and usage["total_tokens"] == 14
    assert state.outcome() == "interrupted"


def test_malformed_payloads_are_skipped_counted_and_fail_at_the_limit():
    for data in (b"{oops", b"[1]", b'"text"'):
        with pytest.raises(UpstreamError) as caught:
            upstream.parse_chunk(data)
        assert caught.value.kind == "protocol" and "b'" not in str(caught.value)
    state = StreamState(started_at=0, max_malformed=3)
    assert state.feed(b"{oops", 0) == ("", "") and state.feed(b"[1]", 0) == ("", "")
    assert state.feed(b'{"choices": [{"delta": {"content": "still here"}}]}', 0) == ("still here", "")
    with pytest.raises(UpstreamError) as caught:
        state.feed(b'"text"', 0)
    assert caught.value.kind == "protocol" and state.malformed == 3 and state.text == "still here"
    assert str(caught.value) == "upstream protocol: the upstream sent 3 events that are not valid JSON"


def test_the_reply_cap_cuts_on_a_character_boundary():
    state = StreamState(started_at=0, max_reply=10)
    state.feed_chunk({"choices": [{"delta": {"reasoning_content": "think"}}]}, 0)
    assert not state.full
    state.feed_chunk({"choices": [{"delta": {"content": "ééé"}}]}, 0)  # 5 + 6 bytes: one too many
    assert state.full and state.text == "éé" and state.reasoning_text == "think"
    assert state.too_large().kind == "too_large" and "10 bytes" in str(state.too_large())


def test_scrub_removes_keys_bearer_tokens_and_sk_secrets():
    key = "prov-key-0123456789abcdef"
    text = f"bad key {key}; header was 'Authorization: Bearer {key}', also sk-live_ABCDEF123456 and Bearer abc.def"
    clean = upstream.scrub(text, [key])
    assert key not in clean and "sk-live" not in clean and "abc.def" not in clean
    assert clean.count("[redacted]") == 4 and clean.startswith("bad key [redacted];")
    assert upstream.scrub("a short key x stays", ["x"]) == "a short key x stays"
    # The sentence around a token stays: not "(send Bearer [redacted]" with the rest swallowed.
    assert upstream.scrub("Refused (send Bearer eyJ.a.b).") == "Refused (send Bearer [redacted])."


def test_error_text_is_one_line_never_html_or_a_repr():
    page = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>" + "x" * 9000 + "</body></html>"
    assert upstream.describe_error_body(page, "Bad Gateway") == ("502 Bad Gateway", None)
    assert upstream.describe_error_body("<html><body><h1>Oops</h1></body></html>", "e")[0] == "Oops"
    assert upstream.describe_error({"message": {"detail": "nested"}})[0] == '{"detail":"nested"}'
    state = StreamState(started_at=0, secrets=("prov-key-0123456789",))
    state.error = {"message": "<html><title>Upstream down</title></html>"}
    assert state.error_message() == "Upstream down"
    state.error = {"message": "echo: Bearer prov-key-0123456789"}
    assert state.error_message() == "echo: Bearer [redacted]"


def test_build_payload_always_sets_max_tokens_and_usage():
    payload = upstream.build_payload("m", [], {"temperature": 0.5}, max_tokens=8192)
    assert payload == {
        "model": "m",
        "messages": [],
        "temperature": 0.5,
        "max_tokens": 8192,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert upstream.build_payload("m", [], {"max_tokens": 10})["max_tokens"] == 10


# --- each dialect over the wire ---------------------------------------------------------


@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
async def test_each_dialect_streams_reasoning_content_and_usage(client, fake_server, dialect):
    fake = fake_server
    model = "deepseek/deepseek-r1" if dialect == "api14" else None
    state, events, error = await run(client, fake, dialect, "hello", model=model)
    record = fake.app.last()
    assert error is None and state.outcome() == "complete" and state.done
    # The reader stops at [DONE]; the fake records an event once its send returns, in its own thread.
    assert await asyncio.to_thread(record.completed.wait, 30)
    # every byte the fake wrote arrives as the raw bytes of an event
    assert [e.raw for e in events if e.data is not None] == record.sent
    assert state.text == sent_text(record, "content") != ""
    reasoning_field = {"i14": "reasoning_content", "api14": "reasoning", "infyrence": "reasoning"}[dialect]
    assert state.reasoning_text == sent_text(record, reasoning_field)
    assert (state.reasoning_text != "") == (dialect != "infyrence")
    assert state.usage["completion_tokens"] > 0
    if dialect == "api14":
        assert events[0].data is None and events[0].raw == b": api14 PROCESSING\n\n"
        assert state.usage["cost"] > 0
    if dialect == "i14":
        assert state.perf and state.usage["completion_tokens_details"]["reasoning_tokens"] == 8
    if dialect == "infyrence":
        assert state.request_id == record.id


async def test_i14_without_max_tokens_stops_at_100(client, fake_server):
    loop = asyncio.get_running_loop()
    payload = {"model": MODELS["i14"], "messages": [{"role": "user", "content": "[[chunks:300]]"}], "stream": True}
    state = StreamState(started_at=loop.time())
    async with upstream.open_stream(client, fake_server.base_url("i14"), FAKE_KEY, payload) as stream:
        await stream.read(state)
    assert state.finish_reason == "length" and state.usage["completion_tokens"] == 100


async def test_tool_calls_and_length(client, fake_server):
    state, _, _ = await run(client, fake_server, "infyrence", "[[tools]]")
    assert state.finish_reason == "tool_calls"
    calls = state.tool_call_list
    assert [c["id"].startswith("call_") for c in calls] == [True, True]
    assert [orjson.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris", "Tokyo"]
    state, _, _ = await run(client, fake_server, "api14", "[[length]]")
    assert state.finish_reason == "length" and state.outcome() == "complete"


async def test_comment_lines_between_chunks_are_skipped(client, fake_server):
    state, events, _ = await run(client, fake_server, "infyrence", "[[comment]] [[echo]] a b c d e f")
    assert any(e.data is None for e in events) and state.text == "a b c d e f"


# --- faults -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dialect", "model", "status", "code", "retry_after"),
    [
        ("i14", None, 401, "invalid_api_key", None),
        ("api14", None, 401, "401", None),
        ("infyrence", None, 401, None, None),
        ("i14", "gpt-4o", 403, "model_not_allowed", None),
        ("infyrence", "no-such-model", 404, "model_not_found", None),
        ("api14", None, 429, "429", "7"),
        ("infyrence", None, 429, None, "7"),
        ("i14", None, 500, None, None),
        ("infyrence", None, 503, None, None),
    ],
)
async def test_errors_before_the_first_byte(client, fake_server, dialect, model, status, code, retry_after):
    key = "wrong-key" if status == 401 else FAKE_KEY
    content = "hi" if status in (401, 403, 404) else f"[[status:{status}]] hi"
    _, events, error = await run(client, fake_server, dialect, content, model=model, key=key)
    assert events == [] and error is not None and error.kind == "http"
    assert error.status == status and error.message and error.retry_after == retry_after
    if code:
        assert error.code == code
    if dialect == "infyrence":
        assert error.request_id and error.request_id.encode() in error.body


async def test_cut_connection_raises_cut_and_keeps_the_text(client, fake_server):
    state, _, error = await run(client, fake_server, "i14", "[[fault:cut]] [[chunks:40]]")
    assert error is not None and error.kind == "cut"
    assert state.text == sent_text(fake_server.app.last(), "content") != "" and not state.finished


async def test_clean_end_without_finish_is_interrupted(client, fake_server):
    state, _, error = await run(client, fake_server, "infyrence", "[[fault:eof]] [[chunks:40]]")
    assert error is None and state.outcome() == "interrupted" and state.text


@pytest.mark.parametrize(("dialect", "message"), [("api14", "Provider disconnected"), ("infyrence", "unavailable")])
async def test_mid_stream_errors(client, fake_server, dialect, message):
    state, _, error = await run(client, fake_server, dialect, "[[fault:midstream]] [[chunks:40]]")
    assert error is None and state.outcome() == "failed" and message in state.error_message() and state.text
    assert state.done == (dialect == "infyrence")  # infyrence sends [DONE] after its error


async def test_cancelling_a_reader_closes_the_upstream_connection(client, fake_server):
    first = asyncio.Event()

    async def read():
        await run_until_first(client, fake_server, first)

    task = asyncio.create_task(read())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(fake_server.app.last().disconnected.wait, 1.0)


async def run_until_first(client, fake, first: asyncio.Event):
    payload = upstream.build_payload(MODELS["i14"], [{"role": "user", "content": "[[delay:50]] [[chunks:200]]"}])
    async with upstream.open_stream(client, fake.base_url("i14"), FAKE_KEY, payload) as stream:
        await stream.read(StreamState(started_at=0.0), on_text=first.set)


async def test_read_timeout_and_overall_deadline(client, fake_server):
    _, _, error = await run(client, fake_server, "infyrence", "[[delay:2000]] hi", timeouts=Timeouts(read=0.2))
    assert error.kind == "timeout"
    _, _, error = await run(
        client, fake_server, "infyrence", "[[delay:20]] [[chunks:500]]", timeouts=Timeouts(deadline=0.2)
    )
    assert error.kind == "timeout" and "deadline" in error.message


async def test_the_read_timeout_counts_only_time_spent_waiting_for_the_upstream(client, fake_server):
    loop = asyncio.get_running_loop()
    payload = upstream.build_payload(MODELS["infyrence"], [{"role": "user", "content": "[[delay:20]] [[chunks:20]]"}])
    chunks, started = 0, loop.time()

    def forward(event, chunk):
        nonlocal chunks
        if chunk is not None:
            chunks += 1
            if chunks == 2:
                # A consumer busy for longer than the timeout (say, a slow client's writes) while
                # the upstream keeps sending: not the upstream's silence.
                return asyncio.sleep(0.8)
        return None

    async with upstream.open_stream(client, fake_server.base_url("infyrence"), FAKE_KEY, payload,
                                    Timeouts(read=0.3)) as stream:  # fmt: skip
        await stream.read(StreamState(started_at=loop.time()), forward=forward)
    assert chunks > 20 and loop.time() - started >= 0.8
    # An upstream that goes silent mid-stream, its connection open: timed out once waited for
    # that long, with what came before it kept.
    started = loop.time()
    content = "[[delay:100]] [[chunks:10]] [[fault:stall]]"
    state, _, error = await run(client, fake_server, "infyrence", content, timeouts=Timeouts(read=0.3))
    assert error.kind == "timeout" and "no data" in error.message, error
    # After the ten chunks (1 s: a lower bound, which load only lengthens), and well before the test's own
    # timeout: a stalled stream without a read timeout would wait for ever (measured: about 1 s in all).
    assert state.content and 0.6 < loop.time() - started < 13


@pytest.mark.parametrize("stream", [True, False])
async def test_an_upstreams_cookie_is_not_kept_for_later_requests(client, fake_server, stream):
    # The client is shared by every person's requests: a cookie one answer set would go out with all of them.
    payload = upstream.build_payload(MODELS["infyrence"], [{"role": "user", "content": "[[cookie]] hi"}])
    payload["stream"] = stream
    # By name: aiohttp's own jar keeps no cookie from an IP address.
    base = fake_server.base_url("infyrence").replace("127.0.0.1", "localhost")
    if stream:
        async with upstream.open_stream(client, base, FAKE_KEY, payload) as opened:
            assert "__cf_bm=" in opened.response.headers["set-cookie"]
            await opened.read(StreamState(started_at=0.0))
    else:
        answer = await upstream.post_json(client, base, FAKE_KEY, payload)
        assert "__cf_bm=" in answer.headers["set-cookie"]
    assert not client.cookies
    again = upstream.build_payload(MODELS["infyrence"], [{"role": "user", "content": "again"}])
    async with upstream.open_stream(client, base, FAKE_KEY, again) as opened:
        await opened.read(StreamState(started_at=0.0))
    assert "cookie" not in fake_server.app.streams[-1].headers


async def test_a_silent_upstream_fails_at_the_first_byte_timeout(client, fake_server):
    # The first-byte timeout is far above a first byte's time even on a busy machine (milliseconds).
    timeouts = Timeouts(first_byte=2.5, read=30)
    # The upstream answers after 10 s: a timeout at all is the first-byte one's (the read timeout is 30 s).
    _, events, error = await run(client, fake_server, "infyrence", "[[wait:10000]] hi", timeouts=timeouts)
    assert events == [] and error.kind == "timeout"
    # once the first byte is there, only the between-bytes timeout applies: gaps longer than the first-byte one
    _, _, error = await run(client, fake_server, "infyrence", "[[delay:3000]] [[chunks:2]]", timeouts=timeouts)
    assert error is None


async def test_a_line_past_the_event_cap_is_a_protocol_error(client, fake_server):
    loop = asyncio.get_running_loop()
    payload = upstream.build_payload(MODELS["api14"], [{"role": "user", "content": "[[chunks:3]] [[size:200000]]"}])
    state, error = StreamState(started_at=loop.time()), None
    try:
        async with upstream.open_stream(
            client, fake_server.base_url("api14"), FAKE_KEY, payload, max_event=100_000
        ) as stream:
            await stream.read(state)
    except UpstreamError as exc:
        error = exc
    assert error.kind == "protocol" and "longer than 100000 bytes" in error.message and state.text == ""


async def test_a_non_stream_answer_past_its_cap_is_refused(client, fake_server):
    payload = {"model": MODELS["infyrence"], "messages": [{"role": "user", "content": "[[chunks:50]] [[size:1000]]"}]}
    answer = await upstream.post_json(client, fake_server.base_url("infyrence"), FAKE_KEY, payload, max_bytes=100_000)
    assert answer.status_code == 200 and len(answer.content) > 50_000
    with pytest.raises(UpstreamError) as caught:
        await upstream.post_json(client, fake_server.base_url("infyrence"), FAKE_KEY, payload, max_bytes=20_000)
    assert caught.value.kind == "too_large" and "20000 bytes" in caught.value.message


async def test_an_echoed_key_and_an_html_page_never_reach_the_error(client, fake_server):
    _, _, error = await run(client, fake_server, "infyrence", "[[status:401]] [[echoauth]]")
    assert error.status == 401 and FAKE_KEY not in error.message and FAKE_KEY.encode() not in error.body
    assert "Authorization: Bearer [redacted]" in error.message
    _, _, error = await run(client, fake_server, "i14", "[[status:502]] [[html]]")
    assert str(error) == "upstream 502: 502 Bad Gateway"


async def test_unreachable_upstream(client):
    payload = upstream.build_payload("m", [])
    with pytest.raises(UpstreamError) as caught:
        async with upstream.open_stream(client, "http://127.0.0.1:9/v1", "k", payload):
            pass
    assert caught.value.kind == "connect"


@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
async def test_list_models(client, fake_server, dialect):
    ids = await upstream.list_models(client, fake_server.base_url(dialect), FAKE_KEY)
    assert MODELS[dialect] in ids
    with pytest.raises(UpstreamError) as caught:
        await upstream.list_models(client, fake_server.base_url(dialect), "bad")
    assert caught.value.status == 401


async def test_shared_client_is_one_per_loop():
    first = upstream.shared_client()
    assert upstream.shared_client() is first
    await upstream.close_shared_client()
    assert upstream.shared_client() is not first
    await upstream.close_shared_client()


async def test_a_connection_closed_before_any_answer_is_tried_once_more(client):
    """As when an upstream closes an idle keep-alive connection just as a request goes out."""
    connections = []
    body = b'data: {"choices":[{"delta":{"content":"again"},"finish_reason":"stop"}]}\n\n'
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)

    async def handle(reader, writer):
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        if len(connections) == 1:
            writer.close()  # read the request, answer nothing
            return
        writer.write(answer)
        await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    base_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        payload = upstream.build_payload("m", [{"role": "user", "content": "hi"}])
        loop = asyncio.get_running_loop()
        state = StreamState(started_at=loop.time())
        async with upstream.open_stream(client, base_url, "k", payload) as stream:
            await stream.read(state)
        assert state.text == "again" and len(connections) == 2
    finally:
        for writer in connections:
            writer.close()
        server.close()


# --- link-local and metadata addresses ------------------------------------------------

# fe80::1 scoped to the loopback interface: link-local, yet a packet to it can never leave this machine.
LOOPBACK_LINK_LOCAL = "http://[fe80::1%lo]:9/v1"


@pytest.mark.parametrize(
    "url, address",
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://2852039166/v1", "169.254.169.254"),  # the same address as one number
        ("http://0xa9.0xfe.0xa9.0xfe/v1", "169.254.169.254"),
        ("http://[::ffff:169.254.169.254]/v1", "169.254.169.254"),
        ("http://[fd00:ec2::254]/v1", "fd00:ec2::254"),
        ("http://[fe80::1%25eth0]:8080/v1", "fe80::1"),
        ("http://169.254.0.1:8000/v1", "169.254.0.1"),
    ],
)
async def test_guard_refuses_link_local_and_metadata_addresses(url, address):
    with pytest.raises(UpstreamError) as caught:
        await upstream.DestinationGuard()(httpx.Request("GET", url))
    assert caught.value.kind == "connect" and address in str(caught.value) and "link-local" in str(caught.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/v1", "http://localhost:9/v1", "https://[::1]/v1", "http://10.1.2.3/v1"]
)
async def test_guard_lets_other_addresses_through(url):
    await upstream.DestinationGuard()(httpx.Request("GET", url))


async def test_guard_refuses_a_name_that_resolves_to_a_metadata_address(monkeypatch):
    # No name on this machine resolves to a link-local address, and /etc/hosts is shared: DNS's answer is given here.
    async def resolve(host, port):
        return ["93.184.215.14", "169.254.169.254"] if host == "metadata.example" else []

    monkeypatch.setattr(upstream.DestinationGuard, "_resolve", staticmethod(resolve))
    guard = upstream.DestinationGuard()
    with pytest.raises(UpstreamError, match=r"169\.254\.169\.254"):
        await guard(httpx.Request("GET", "https://metadata.example/v1/models"))
    await guard(httpx.Request("GET", "https://api.example/v1/models"))


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_client_refuses_before_connecting_unless_allowed(transport):
    payload = upstream.build_payload("m", [{"role": "user", "content": "hi"}])
    guarded = upstream.make_client(10, transport)
    try:
        with pytest.raises(UpstreamError, match="fe80::1 is link-local"):
            await upstream.list_models(guarded, LOOPBACK_LINK_LOCAL, "sk-secret")
        with pytest.raises(UpstreamError, match="fe80::1 is link-local"):
            async with upstream.open_stream(guarded, LOOPBACK_LINK_LOCAL, "sk-secret", payload):
                pass
        with pytest.raises(UpstreamError, match="fe80::1 is link-local"):
            await upstream.post_json(guarded, LOOPBACK_LINK_LOCAL, "sk-secret", payload)
    finally:
        await guarded.aclose()
    allowed = upstream.make_client(10, transport, allow_link_local=True)
    try:
        with pytest.raises(UpstreamError) as caught:  # tried, and nothing listens there
            await upstream.list_models(allowed, LOOPBACK_LINK_LOCAL, "sk-secret", Timeouts(connect=2))
        assert "link-local" not in str(caught.value)
    finally:
        await allowed.aclose()


def test_origin_is_scheme_host_and_port():
    assert upstream.origin("https://API.i14.ai/v1") == upstream.origin("https://api.i14.ai:443/v2/")
    assert upstream.origin("https://api.i14.ai/v1") != upstream.origin("http://api.i14.ai/v1")
    assert upstream.origin("https://api.i14.ai/v1") != upstream.origin("https://api.i14.ai:8443/v1")
    assert upstream.origin("https://api.i14.ai/v1") != upstream.origin("https://api.i14.ai.evil.example/v1")
    assert upstream.origin("http://[::1]:8000/v1") == ("http", "::1", 8000)
