"""The SSE decoder on the providers' own examples and on the edge cases of the format."""

import orjson
import pytest

from chat.streaming.sse import SSEDecoder
from tests.seeds import API14_ERROR_CHUNK, API14_STREAM, I14_STREAM, INFYRENCE_ERROR_STREAM


def decode(data: bytes, piece: int | None = None):
    decoder = SSEDecoder()
    pieces = [data] if piece is None else [data[i : i + piece] for i in range(0, len(data), piece)]
    events = [event for chunk in pieces for event in decoder.feed(chunk)]
    return events + decoder.close()


def test_i14_example_decodes_to_its_chunks_and_done():
    events = decode(I14_STREAM)
    assert [e.data for e in events][-1] == b"[DONE]"
    chunks = [orjson.loads(e.data) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "reasoning_content": "Ok"}
    assert chunks[2]["choices"][0]["delta"]["content"] == "\n\n*"
    assert chunks[4]["usage"] is None
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 753
    assert chunks[5]["x_i14_perf"]["time_to_first_token_s"] == 0.0957


def test_raw_bytes_of_every_event_add_up_to_the_stream():
    for stream in (I14_STREAM, API14_STREAM, INFYRENCE_ERROR_STREAM):
        assert b"".join(e.raw for e in decode(stream)) == stream


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64])
def test_any_split_of_the_network_reads_gives_the_same_events(piece):
    assert decode(I14_STREAM, piece) == decode(I14_STREAM)
    assert decode(API14_STREAM, piece) == decode(API14_STREAM)


def test_comment_lines_are_kept_as_data_less_events():
    stream = b": api14 PROCESSING\n\n" + API14_STREAM
    events = decode(stream)
    assert events[0].data is None and events[0].raw == b": api14 PROCESSING\n\n"
    assert [e.data for e in events[1:]][-1] == b"[DONE]"
    assert orjson.loads(events[3].data)["usage"]["cost"] == 0.0000085


def test_a_comment_inside_an_event_does_not_split_it():
    events = decode(b"data: a\n: keep-alive\ndata: b\n\n")
    assert [e.data for e in events] == [b"a\nb"]


def test_api14_error_chunk_and_infyrence_error_event():
    events = decode(b"data: " + API14_ERROR_CHUNK + b"\n\n")
    assert orjson.loads(events[0].data)["choices"][0]["finish_reason"] == "error"
    events = decode(INFYRENCE_ERROR_STREAM)
    assert orjson.loads(events[0].data)["error"]["code"] == "upstream_unavailable"
    assert events[1].data == b"[DONE]"


@pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"\n"])
def test_every_line_ending(newline):
    stream = b"data: one" + newline + b"data: two" + newline + newline + b"data: [DONE]" + newline + newline
    for piece in (None, 1):
        assert [e.data for e in decode(stream, piece)] == [b"one\ntwo", b"[DONE]"]


def test_fields_event_id_retry_and_no_space_after_colon():
    events = decode(b"event: ping\nid: 7\nretry: 1500\ndata:{}\n\nid\ndata\n\n")
    assert (events[0].event, events[0].id, events[0].retry, events[0].data) == ("ping", "7", 1500, b"{}")
    # a bare "id" resets the id; a bare "data" is an empty data line
    assert (events[1].id, events[1].data, events[1].event) == ("", b"", "message")


def test_multibyte_text_split_between_reads():
    text = "नमस्ते, état ✓".encode()
    stream = b'data: {"c":"' + text + b'"}\n\n'
    assert orjson.loads(decode(stream, 1)[0].data)["c"] == "नमस्ते, état ✓"


def test_end_of_stream_keeps_complete_lines_and_drops_a_cut_fragment():
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n') == []
    assert [e.data for e in decoder.close()] == [b'{"a": 1}']

    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a": 1}\n\ndata: {"b"') != []
    assert decoder.close() == []
    assert decoder.pending == b'data: {"b"'


def test_blank_lines_alone_dispatch_nothing():
    assert decode(b"\n\n\r\n") == []


def _feed_one_long_line(size: int, piece: int = 16 * 1024) -> float:
    """Seconds of CPU to decode one `data:` line of `size` bytes arriving in `piece`-byte reads."""
    import time

    decoder = SSEDecoder(max_event=size + 1024)
    block = b"x" * piece
    started = time.process_time()
    decoder.feed(b"data: ")
    for _ in range(size // piece):
        assert decoder.feed(block) == []
    events = decoder.feed(b"\n\n")
    elapsed = time.process_time() - started
    assert len(events) == 1 and len(events[0].data) == size // piece * piece
    return elapsed


def test_a_long_line_costs_linear_time():
    # Per byte, a 200 MB line costs about what a 10 MB one does (1-2 times, measured; both well past the
    # CPU's caches); quadratic would be 20 times. CPU times, their ratio asserted ten times looser.
    _feed_one_long_line(1_000_000)  # warm up
    small = min(_feed_one_long_line(10_000_000) for _ in range(3)) / 10
    large = _feed_one_long_line(200_000_000) / 200
    assert large < 10 * small + 0.002, (small, large)


def test_a_line_past_the_cap_is_refused_before_it_ends():
    from chat.streaming.sse import LineTooLong

    decoder = SSEDecoder(max_event=1000)
    decoder.feed(b"data: " + b"x" * 500)
    with pytest.raises(LineTooLong, match="longer than 1000 bytes"):
        decoder.feed(b"x" * 600)  # no line end yet: the decoder stops buffering here
    # a whole line in one read, and an event of many short lines, are capped the same way
    with pytest.raises(LineTooLong):
        SSEDecoder(max_event=1000).feed(b"data: " + b"y" * 1000 + b"\n\n")
    with pytest.raises(LineTooLong):
        SSEDecoder(max_event=1000).feed(b"data: z\n" * 200)
    # under the cap nothing changes
    assert [e.data for e in SSEDecoder(max_event=1000).feed(b"data: " + b"w" * 900 + b"\n\n")] == [b"w" * 900]


@pytest.mark.parametrize("piece", [1, 2, 5])
def test_lines_split_across_many_reads_keep_their_raw_bytes(piece):
    stream = b"data: one\r\ndata: two\r\r\ndata: " + b"long" * 50 + b"\r\n\r\n: c\n\n"
    events = decode(stream, piece)
    assert b"".join(e.raw for e in events) == stream
    assert [e.data for e in events] == [b"one\ntwo", b"long" * 50, None]
