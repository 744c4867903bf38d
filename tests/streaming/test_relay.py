"""The relay's pure parts: what it forwards, drops and adds, on scripted upstream events."""

import asyncio
import math

import httpx
import orjson
import pytest

from chat.streaming.relay import (
    DONE_EVENT,
    KEEP_ALIVE,
    OPENING,
    Relay,
    RequestError,
    Running,
    parse_request,
    prompt_chars,
    upstream_body,
)
from chat.streaming.sse import SSEDecoder
from chat.streaming.upstream import StreamState, UpstreamStream
from tests.seeds import API14_STREAM, I14_STREAM, INFYRENCE_ERROR_STREAM


class ScriptedResponse:
    """Stands in for the upstream's httpx response: its body is `data`, an event a network read,
    optionally pausing before the read `hold_after` or cut off after the last one."""

    stream = None
    headers = httpx.Headers()

    def __init__(self, data: bytes, *, hold_after: int | None = None, cut: bool = False) -> None:
        decoder = SSEDecoder()
        self.pieces = [event.raw for event in decoder.feed(data)] + ([decoder.pending] if decoder.pending else [])
        self.hold_after = hold_after
        self.release = asyncio.Event()
        self.cut = cut
        self.closed = False

    async def aiter_bytes(self):
        try:
            for i, piece in enumerate(self.pieces):
                if i == self.hold_after:
                    await self.release.wait()
                yield piece
            if self.cut:
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        finally:
            self.closed = True


class ScriptedStream(UpstreamStream):
    """An upstream stream read with the real loop, over a ScriptedResponse."""

    def __init__(self, data: bytes, **script) -> None:
        super().__init__(ScriptedResponse(data, **script), deadline_at=math.inf)

    @property
    def release(self) -> asyncio.Event:
        return self.response.release

    @property
    def closed(self) -> bool:
        return self.response.closed


async def collect(stream, *, forward_usage=True, heartbeat=5.0, on_keep_alive=None):
    relay = Relay(stream, StreamState(started_at=0.0), forward_usage=forward_usage, heartbeat=heartbeat)
    out = []
    async for data in relay:
        out += data_events(data)  # one write may carry several events (those already waiting)
        if data == KEEP_ALIVE and on_keep_alive:
            on_keep_alive()
    return relay, out


def data_events(stream: bytes) -> list[bytes]:
    return [e.raw for e in SSEDecoder().feed(stream)]


async def test_events_pass_through_byte_for_byte_after_the_opening_comment():
    relay, out = await collect(ScriptedStream(I14_STREAM))
    assert out[0] == OPENING and out[1:] == data_events(I14_STREAM)
    assert relay.status == "complete" and relay.error == "" and relay.state.usage["prompt_tokens"] == 45


async def test_usage_only_chunk_is_dropped_unless_the_client_asked():
    _, out = await collect(ScriptedStream(I14_STREAM), forward_usage=False)
    expected = [e for e in data_events(I14_STREAM) if b'"choices": []' not in e]
    assert out[1:] == expected and len(expected) == len(data_events(I14_STREAM)) - 1
    # api14 carries usage on its finish chunk: nothing to drop there
    _, out = await collect(ScriptedStream(API14_STREAM), forward_usage=False)
    assert out[1:] == data_events(API14_STREAM)


async def test_a_silent_upstream_gets_keep_alive_comments():
    stream = ScriptedStream(API14_STREAM, hold_after=1)
    _, out = await collect(stream, heartbeat=0.05, on_keep_alive=stream.release.set)
    assert out[:3] == [OPENING, data_events(API14_STREAM)[0], KEEP_ALIVE]
    assert out[3:] == data_events(API14_STREAM)[1:]


async def test_a_long_silence_gets_a_keep_alive_every_period_and_none_once_data_flows():
    stream = ScriptedStream(API14_STREAM, hold_after=1)
    beats = 0

    def on_keep_alive():
        nonlocal beats
        beats += 1
        if beats == 3:
            stream.release.set()

    relay, out = await collect(stream, heartbeat=0.02, on_keep_alive=on_keep_alive)
    assert out[:5] == [OPENING, data_events(API14_STREAM)[0], KEEP_ALIVE, KEEP_ALIVE, KEEP_ALIVE]
    assert out[5:] == data_events(API14_STREAM)[1:] and relay.status == "complete"
    assert relay._timer.cancelled()  # the heartbeat timer ends with the stream


async def test_upstream_comments_are_forwarded():
    _, out = await collect(ScriptedStream(b": api14 PROCESSING\n\n" + API14_STREAM))
    assert out[1] == b": api14 PROCESSING\n\n"


async def test_events_already_waiting_go_out_in_one_write():
    events = data_events(I14_STREAM)
    relay = Relay(ScriptedStream(I14_STREAM), StreamState(started_at=0.0), forward_usage=True, heartbeat=5.0)
    writes = [data async for data in relay]
    # The scripted upstream queues every event at once: fewer writes than events, the same bytes.
    assert writes[0] == OPENING and 1 < len(writes) < len(events) + 1
    assert b"".join(writes[1:]) == b"".join(events)


async def test_error_chunk_without_done_gets_done():
    body = API14_STREAM.split(b"data: [DONE]")[0].rsplit(b"data:", 1)[0]
    error_chunk = b'data: { "error": { "code": 502, "message": "Provider disconnected" }, "choices": [{ "delta": { "content": "" }, "finish_reason": "error" }] }\n\n'  # noqa: E501
    relay, out = await collect(ScriptedStream(body + error_chunk))
    assert out[-2:] == [error_chunk, DONE_EVENT]
    assert relay.status == "failed" and "Provider disconnected" in relay.error


async def test_infyrence_error_event_and_its_done_pass_as_they_are():
    relay, out = await collect(ScriptedStream(INFYRENCE_ERROR_STREAM))
    assert out[1:] == data_events(INFYRENCE_ERROR_STREAM) and relay.status == "failed"


async def test_an_upstream_cut_ends_with_an_error_event_and_done():
    body = I14_STREAM.split(b"\n\n")[0] + b"\n\n"
    stream = ScriptedStream(body, cut=True)
    relay, out = await collect(stream)
    error_event, done = out[-2:]
    assert orjson.loads(error_event.removeprefix(b"data: "))["error"]["code"] == "upstream_interrupted"
    assert done == DONE_EVENT
    assert relay.status == "interrupted" and stream.closed


async def test_a_clean_end_mid_answer_is_interrupted():
    body = b"".join(data_events(I14_STREAM)[:3])
    relay, out = await collect(ScriptedStream(body))
    assert b"upstream_interrupted" in out[-2] and out[-1] == DONE_EVENT and relay.status == "interrupted"


async def test_a_finished_stream_without_done_just_gets_done():
    body = b"".join(data_events(I14_STREAM)[:-1])
    relay, out = await collect(ScriptedStream(body))
    assert out[-1] == DONE_EVENT and b"upstream_interrupted" not in out[-2] and relay.status == "complete"


async def test_an_unreadable_event_is_skipped_and_the_stream_goes_on():
    # The same rule as the chat: skipped (an SDK would raise on it), counted, not fatal alone.
    relay, out = await collect(ScriptedStream(b"data: {oops\n\n" + API14_STREAM))
    assert out[1:] == data_events(API14_STREAM)
    assert relay.malformed == 1 and relay.status == "complete" and relay.state.text == "Hello!"


async def test_several_unreadable_events_end_the_stream_with_an_error_event():
    events = data_events(API14_STREAM)
    body = events[0] + b"data: {oops\n\n" + b"data: [1, 2\n\n" + events[1] + b"data: nope\n\n" + events[2]
    relay, out = await collect(ScriptedStream(body))
    assert out[1:3] == events[:2] and out[-1] == DONE_EVENT
    error = orjson.loads(out[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_malformed" and error["message"] == (
        "upstream protocol: the upstream sent 3 events that are not valid JSON"
    )
    assert relay.status == "failed" and relay.malformed == 3 and relay.state.text == "Hello!"
    assert b"b'" not in out[-2]  # a sentence, no Python repr


async def test_a_reply_past_its_cap_is_ended_with_an_error_and_metered_failed():
    relay = Relay(ScriptedStream(API14_STREAM), StreamState(started_at=0.0, max_reply=4), forward_usage=True,
                  heartbeat=5)  # fmt: skip
    out = [event async for data in relay for event in data_events(data)]
    assert out[1:3] == data_events(API14_STREAM)[:2]  # "Hel", then "lo!" crosses the cap
    error = orjson.loads(out[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "reply_too_large" and "limit of 4 bytes" in error["message"]
    assert relay.status == "failed" and relay.state.text == "Hell" and len(out) == 5 and out[-1] == DONE_EVENT


async def test_an_upstream_error_event_has_the_key_scrubbed():
    key = "sk-provider-secret-123456"
    event = b'data: {"error":{"message":"bad auth: Bearer ' + key.encode() + b" (key " + key.encode() + b')"}}\n\n'
    state = StreamState(started_at=0.0, secrets=(key,))
    relay = Relay(ScriptedStream(event + b"data: [DONE]\n\n"), state, forward_usage=True, heartbeat=5)
    out = b"".join([data async for data in relay])
    assert key.encode() not in out and b"Bearer [redacted]" in out
    assert key not in relay.error and relay.status == "failed"


async def test_cancelling_the_relay_stops_reading_the_upstream():
    stream = ScriptedStream(I14_STREAM, hold_after=2)
    relay = Relay(stream, StreamState(started_at=0.0), forward_usage=True, heartbeat=5)
    iterator = relay.__aiter__()
    assert await anext(iterator) == OPENING
    await anext(iterator)
    await iterator.aclose()
    assert stream.closed


def test_parse_request_and_upstream_body():
    body = parse_request(b'{"model": "i14/m", "messages": [{"role": "user", "content": "hi"}], "stream": true}')
    out, wants_usage = upstream_body(body, "m", 8192)
    assert out["model"] == "m" and out["max_tokens"] == 8192 and not wants_usage
    assert out["stream_options"] == {"include_usage": True}
    out, wants_usage = upstream_body({**body, "stream_options": {"include_usage": True}, "max_tokens": 5}, "m", 8192)
    assert wants_usage and out["max_tokens"] == 5
    out, _ = upstream_body({**body, "stream": False, "max_tokens": 9}, "m", 8192)
    assert out["max_tokens"] == 9 and "stream_options" not in out
    with pytest.raises(RequestError) as caught:
        parse_request(b'{"model": "m", "messages": [], "stream": true}')
    assert caught.value.status == 400 and caught.value.param == "messages"
    with pytest.raises(RequestError):
        parse_request(b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}')


def test_prompt_chars_counts_text_parts():
    messages = [{"role": "system", "content": "abc"}, {"role": "user", "content": [{"type": "text", "text": "de"}]}]
    assert prompt_chars(messages) == 5


async def test_interrupt_ends_a_waiting_stream_with_a_shutdown_error_and_done():
    stream = ScriptedStream(I14_STREAM, hold_after=3)
    relay = Relay(stream, StreamState(started_at=0.0), forward_usage=True, heartbeat=5.0)
    out = []
    async for data in relay:
        out += data_events(data)
        if len(out) == 4:  # the opening comment and three events; the upstream now holds
            asyncio.get_running_loop().call_later(0.05, relay.interrupt, "The server stopped.")
    assert out[:4] == [OPENING, *data_events(I14_STREAM)[:3]]
    error = orjson.loads(out[-2][len(b"data: ") :])["error"]
    assert error == {"message": "The server stopped.", "type": "server_error", "code": "server_shutdown"}
    assert out[-1] == DONE_EVENT and stream.closed
    assert relay.status == "interrupted" and relay.error == "The server stopped."


class Streaming:
    """A running relay as Running sees it: only its state."""

    def __init__(self) -> None:
        self.state = StreamState(started_at=0.0)


async def test_a_checkpoint_gives_each_grown_stream_once_and_again_after_a_failed_write():
    running, one, two, unmetered = Running(), Streaming(), Streaming(), Streaming()
    running.add(one, owner=1, usage_id=11)
    running.add(two, owner=1, usage_id=12)
    running.add(unmetered, owner=1)  # no usage row to write on
    written = []

    async def write(rows):
        written.append(sorted(rows))

    async def fail(rows):
        raise OSError("database gone")

    one.state.content.append("x" * 40)
    two.state.reasoning.append("y" * 8)
    unmetered.state.content.append("z" * 40)
    assert await running.checkpoint(write, 1.0) == 2
    assert written == [[(11, 10, 0), (12, 2, 2)]]  # about four characters a token, reasoning counted in
    assert await running.checkpoint(write, 2.0) == 0  # nothing grew: nothing written
    one.state.content.append("x" * 40)
    with pytest.raises(OSError):
        await running.checkpoint(fail, 3.0)
    assert await running.checkpoint(write, 4.0) == 1  # given again: the failed write did not count
    assert written[-1] == [(11, 20, 0)]
    del one, two
    assert await running.checkpoint(write, 5.0) == 0  # an ended relay is forgotten with it
