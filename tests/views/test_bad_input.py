"""Hostile input is a 400 with a sentence, never a 500: JSON nested past any use, digits int() cannot read.

Issue 35."""

from __future__ import annotations

import json

import pytest
from mcp import types

from chat.lib.json_depth import MAX_STORED_DEPTH, deeper_than, loads_stored, without_nul
from chat.lib.model_params import ParamError, check_request
from chat.models import Conversation
from chat.streaming.mcp_client import result_text
from chat.streaming.relay import RequestError, parse_request
from chat.streaming.upstream.state import StreamState

pytestmark = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def export_with_tool_calls(tool_calls: str) -> bytes:
    head = '{"title": "t", "messages": [{"id": 1, "parent": null, "role": "assistant", "content": "x", "tool_calls": '
    return (head + tool_calls + "}]}").encode()


def test_depth_is_measured_without_recursion():
    assert not deeper_than(1, 0) and not deeper_than([], 1) and deeper_than([[]], 1)
    assert not deeper_than({"a": [1, {"b": 2}]}, 3) and deeper_than({"a": [1, {"b": {}}]}, 3)
    value: list = []
    for _ in range(100_000):
        value = [value]
    assert deeper_than(value, 1000)


@pytest.mark.parametrize("depth", [100_000, 500])
def test_an_import_nested_deeper_than_an_export_is_refused(client, alice, depth):
    client.force_login(alice)
    body = export_with_tool_calls("[" + nested(depth) + "]")
    response = client.post("/api/import", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "bad_import",
        "detail": f"The file nests lists or objects more than {MAX_STORED_DEPTH} levels deep: "
        "it is not an export of this chat.",
    }
    assert not Conversation.objects.exists()
    fine = client.post("/api/import", export_with_tool_calls("[]"), content_type="application/json")
    assert fine.status_code == 201


def test_a_json_body_nested_past_the_parser_is_a_400(client, alice):
    client.force_login(alice)
    conversation = Conversation.objects.create(owner=alice, title="t")
    response = client.patch(f"/api/conversations/{conversation.pk}", nested(100_000), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "bad_json", "detail": "The body nests more than 32 levels deep."}


@pytest.mark.parametrize("path", ["/usage/", "/usage/csv"])
@pytest.mark.parametrize("value", ["²", "١٢", "9" * 40])
def test_a_usage_filter_that_is_no_ascii_number_is_a_400(client, admin_user, path, value):
    client.force_login(admin_user)
    response = client.get(path, {"user": value})
    assert response.status_code == 400
    assert "The user filter must be an id number." in response.content.decode()


def test_v1_schemas_nested_past_what_can_be_forwarded_are_refused():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    schema: dict = {"type": "object"}
    for _ in range(300):
        schema = {"type": "object", "properties": {"a": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(ParamError, match="`tools` nests more than 128 levels deep"):
        check_request({**body, "tools": [tool]}, max_tokens=100, max_n=1)
    response_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    with pytest.raises(RequestError) as refused:
        parse_request(json.dumps({**body, "response_format": response_format}).encode(), max_tokens=100)
    assert refused.value.status == 400 and refused.value.param == "response_format"
    shallow = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert check_request({**body, "tools": [shallow]}, max_tokens=100, max_n=1)["tools"] == [shallow]


# --- text PostgreSQL cannot store -----------------------------------------------------------------------


def test_nul_escapes_become_u_fffd_and_an_escaped_backslash_stays_text():
    assert without_nul(r'{"a":"x\u0000y"}') == r'{"a":"x\ufffdy"}'
    assert without_nul(rb'{"a\u0000":1}') == rb'{"a\ufffd":1}'
    assert without_nul(r'{"a":"x\\u0000y"}') == r'{"a":"x\\u0000y"}'  # the six characters \u0000, typed
    assert without_nul(r'{"a":"\\\u0000"}') == r'{"a":"\\\ufffd"}'  # a backslash, then NUL
    assert loads_stored(rb'{"a": ["x\u0000"]}') == {"a": ["x\ufffd"]}


def test_model_output_with_nul_is_kept_as_u_fffd():
    state = StreamState(started_at=0.0)
    added = state.feed(b'{"id": "c1", "choices": [{"delta": {"content": "a\\u0000b"}}]}', 0.0)
    assert added == ("a\ufffdb", "") and state.text == "a\ufffdb"


def test_a_tool_result_with_nul_is_kept_as_u_fffd():
    block = types.TextContent(type="text", text="x\x00y")
    assert result_text([block], None) == "x\ufffdy"


@pytest.mark.parametrize("text", ["\ud800x", "x\udfff"])
def test_a_lone_surrogate_in_a_page_api_body_is_a_400(client, alice, text):
    client.force_login(alice)
    conversation = Conversation.objects.create(owner=alice, title="t")
    body = json.dumps({"title": text})  # ensure_ascii: the surrogate travels as an escape, as a browser's would
    response = client.patch(f"/api/conversations/{conversation.pk}", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "bad_json", "detail": "The body is not valid JSON."}
    stop = json.dumps({"params": {"stop": text}})
    assert (
        client.patch(f"/api/conversations/{conversation.pk}", stop, content_type="application/json").status_code == 400
    )
    conversation.refresh_from_db()
    assert conversation.title == "t" and not conversation.params
    export = json.dumps({"title": "t", "messages": [{"id": 1, "parent": None, "role": "user", "content": text}]})
    imported = client.post("/api/import", export, content_type="application/json")
    assert imported.status_code == 400 and imported.json()["error"]["code"] == "bad_import"
    assert Conversation.objects.count() == 1


def test_nul_in_a_page_api_body_or_an_import_is_stored_as_u_fffd(client, alice):
    client.force_login(alice)
    folder = client.post("/api/folders", json.dumps({"name": "a\x00b"}), content_type="application/json")
    assert folder.status_code == 201 and folder.json()["name"] == "a\ufffdb"
    export = json.dumps(
        {"title": "n\x00l", "messages": [{"id": 1, "parent": None, "role": "user", "content": "x\x00"}]}
    )
    assert client.post("/api/import", export, content_type="application/json").status_code == 201
    conversation = Conversation.objects.get(owner=alice)
    assert conversation.title == "n\ufffdl" and conversation.messages.get().content == "x\ufffd"
