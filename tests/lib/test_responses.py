"""The Responses API's pure parts: the request checked and turned into chat messages, chunks turned into events."""

import orjson
import pytest

from chat.lib.model_params import ParamError
from chat.lib.responses_events import ResponsesTranslator, encode
from chat.lib.responses_request import ITEM_ID, parse_responses_request

RESPONSE_ID = "resp_" + "ab" * 12


def translator():
    return ResponsesTranslator(RESPONSE_ID, 1_800_000_000, {"model": "m"})


def chunk(**delta):
    finish = delta.pop("finish", None)
    return {"id": "x", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_text_input_instructions_and_fields_become_a_chat_request():
    request = parse_responses_request(
        {"model": "m", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.5,
         "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": None}],
         "tool_choice": {"type": "function", "name": "f"}, "text": {"format": {"type": "json_object"}}},
        max_tokens=100,
    )  # fmt: skip
    assert request.chat_body(request.items) == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_tokens": 50,
        "temperature": 0.5,
        "response_format": {"type": "json_object"},
    }


def test_what_codex_style_clients_add_is_taken_and_only_effort_and_verbosity_go_on():
    request = parse_responses_request(
        {"model": "m", "input": "hi", "reasoning": {"effort": "low", "summary": "auto"}, "truncation": "auto",
         "text": {"format": {"type": "text"}, "verbosity": "low"}, "prompt_cache_key": "thread-1",
         "safety_identifier": "u1", "service_tier": "auto"},
        max_tokens=100,
    )  # fmt: skip
    assert request.chat_body(request.items) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "reasoning_effort": "low",
        "verbosity": "low",
    }
    refused = [
        ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
        ({"text": {"verbosity": 1}}, "text.verbosity"),
        ({"truncation": "middle"}, "truncation"),
        ({"prompt_cache_key": 7}, "prompt_cache_key"),
    ]
    for bad, param in refused:
        with pytest.raises(ParamError) as caught:
            parse_responses_request({"model": "m", "input": "hi", **bad}, max_tokens=100)
        assert caught.value.param == param


def test_items_become_messages_calls_joining_the_assistant_turn_and_reasoning_dropped():
    request = parse_responses_request(
        {"model": "m", "input": [
            {"role": "developer", "content": "rules"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                           {"type": "input_image", "image_url": "https://x/i.png"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        ]},
        max_tokens=100,
    )  # fmt: skip
    messages = request.chat_body(request.items)["messages"]
    assert messages == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "image_url", "image_url": {"url": "https://x/i.png"}}]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "m", "input": "x", "background": True}, "background", "unsupported_parameter"),
        ({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "invalid_value"),
        ({"model": "m", "input": [{"type": "computer_call"}]}, "input[0].type", "invalid_value"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_other"}]}, "input[0].id", "invalid_value"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
        ({"model": "m", "input": "x", "include": ["file_search_call.results"]}, "include", "invalid_value"),
        ({"model": "m", "input": "x", "max_output_tokens": 101}, "max_output_tokens", "invalid_value"),
        ({"input": "x"}, "model", "missing_model"),
    ],
)
def test_what_is_not_supported_is_named(body, param, code):
    with pytest.raises(ParamError) as caught:
        parse_responses_request(body, max_tokens=100)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_a_stream_of_reasoning_text_and_calls_becomes_events_in_order():
    t = translator()
    events = t.start()
    events += t.feed(chunk(role="assistant", reasoning_content="Thin"))
    events += t.feed(chunk(reasoning="king"))  # either dialect's name
    events += t.feed(chunk(content="Hel"))
    events += t.feed(chunk(content="lo"))
    events += t.feed(chunk(tool_calls=[{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": ""}}]))
    events += t.feed(chunk(tool_calls=[{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": '{"x"'}}]))
    events += t.feed(chunk(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}]))  # interleaved by index
    events += t.feed(chunk(tool_calls=[{"index": 1, "function": {"arguments": ":1}"}}], finish="tool_calls"))
    usage = {"input_tokens": 3, "output_tokens": 9, "total_tokens": 12}
    events += t.finish("complete", "", usage)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.reasoning_summary_part.added", 0),
        ("response.reasoning_summary_text.delta", 0),
        ("response.reasoning_summary_text.delta", 0),
        ("response.reasoning_summary_text.done", 0),
        ("response.reasoning_summary_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.content_part.added", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.delta", 1),
        ("response.output_text.done", 1),
        ("response.content_part.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.output_item.added", 3),
        ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 3),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.function_call_arguments.done", 3),
        ("response.output_item.done", 3),
        ("response.completed", None),
    ]
    # An added item is shown as it was then, not as it ended.
    assert events[9]["item"]["content"] == [] and events[2]["item"]["summary"] == []
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"] == usage and final["model"] == "m"
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final["output"][0]["summary"] == [{"type": "summary_text", "text": "Thinking"}]
    assert final["output"][1]["content"][0]["text"] == "Hello" and t.output_text == "Hello"
    assert [(i["call_id"], i["name"], i["arguments"]) for i in final["output"][2:]] == [
        ("call_a", "f", "{}"),
        ("call_b", "g", '{"x":1}'),
    ]
    # Item ids name their response, for item_reference.
    assert all(ITEM_ID.match(item["id"]).group(1) == RESPONSE_ID[5:] for item in final["output"])
    assert encode(events[-1]).startswith(b"event: response.completed\ndata: {")
    assert orjson.loads(encode(events[-1]).split(b"data: ", 1)[1]) == events[-1]


def test_a_whole_answer_builds_the_same_response():
    t = translator()
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [call]}
    t.feed({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
    final = t.finish("complete", "", None)[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "function_call"]
    assert final["output"][1]["call_id"] == "c" and final["output"][1]["status"] == "completed"


def test_length_is_incomplete_and_a_failure_is_failed_with_its_message():
    t = translator()
    t.feed(chunk(content="abc", finish="length"))
    ending = t.finish("complete", "", None)
    assert ending[-1]["type"] == "response.incomplete"
    assert ending[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    t = translator()
    t.feed(chunk(content="abc"))
    ending = t.finish("failed", "Provider disconnected", None)
    assert [e["type"] for e in ending][-2:] == ["response.output_item.done", "response.failed"]
    assert ending[-1]["response"]["error"] == {"code": "server_error", "message": "Provider disconnected"}
    assert t.status == "failed"
