"""An answer's tool rounds in the message tree: its JSON, the history sent upstream, export and import."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from chat.models import Conversation, Message, ToolCall
from chat.streaming.history import upstream_messages
from tests.views.test_share_views import read

pytestmark = pytest.mark.django_db

ROUNDS = [{"at": 5, "calls": [{"id": "call_1", "name": "tests__echo", "server": "tests", "tool": "echo",
                               "arguments": '{"text": "hi"}', "status": "ok", "result": "echo: hi"}]},
          {"at": 9, "calls": [{"id": "call_2", "name": "tests__fail", "server": "tests", "tool": "fail",
                               "arguments": "{}", "status": "error", "error": "it broke"}]}]  # fmt: skip


@pytest.fixture
def answered(alice):
    conversation = Conversation.objects.create(owner=alice, title="tools")
    question = Message.objects.create(conversation=conversation, role="user", content="use tools")
    answer = Message.objects.create(conversation=conversation, role="assistant", parent=question,
                                    content="Let meSee.Done.", tool_rounds=ROUNDS)  # fmt: skip
    conversation.current = answer
    conversation.save()
    return conversation


def test_a_model_that_takes_no_tools_reads_the_calls_as_text(answered):
    """Tool messages in a request that offers no tools are refused by some providers (Anthropic's API): after a
    switch to a model without tools, the earlier answer goes as one message, its calls noted where they were."""
    history = upstream_messages(answered, tools=False)
    assert [m["role"] for m in history] == ["user", "assistant"] and "tool_calls" not in history[1]
    assert history[1]["content"] == "\n".join([
        "Let m", '[tool call tests__echo {"text": "hi"}]', "[tool result: echo: hi]",
        "eSee", "[tool call tests__fail {}]", "[tool result: [tool call error] it broke]", ".Done.",
    ])  # fmt: skip


def test_the_history_replays_the_calls_and_their_results(answered):
    history = upstream_messages(answered)
    assert [(m["role"], m.get("content")) for m in history] == [
        ("user", "use tools"),
        ("assistant", "Let m"),
        ("tool", "echo: hi"),
        ("assistant", "eSee"),
        ("tool", "[tool call error] it broke"),
        ("assistant", ".Done."),
    ]
    assert history[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "tests__echo", "arguments": '{"text": "hi"}'}}
    ]
    assert history[2]["tool_call_id"] == "call_1"


def test_export_and_import_keep_the_rounds_and_run_nothing(alice, bob, answered):
    owner, other = Client(), Client()
    owner.force_login(alice)
    other.force_login(bob)
    body = read(owner.get(f"/api/conversations/{answered.pk}/export?format=json"))
    assert json.loads(body)["conversations"][0]["messages"][1]["tool_rounds"] == ROUNDS
    imported = other.post("/api/import", body, content_type="application/json")
    assert imported.status_code == 201, imported.content
    copy = Conversation.objects.get(pk=imported.json()["conversations"][0]["id"])
    assert copy.messages.get(role="assistant").tool_rounds == ROUNDS
    assert not ToolCall.objects.exists()
    page = other.get(f"/api/conversations/{copy.pk}").json()
    assert page["messages"][-1]["tool_rounds"] == ROUNDS


def test_the_markdown_export_folds_each_call_in_where_the_model_made_it(alice, answered):
    from chat.actions.exports import fenced

    client = Client()
    client.force_login(alice)
    text = read(client.get(f"/api/conversations/{answered.pk}/export?format=md")).decode()
    order = ["Let m", "Tool call · echo · tests · ok", '```json\n{"text": "hi"}\n```', "echo: hi", "eSee",
             "Tool call · fail · tests · error", "it broke", ".Done."]  # fmt: skip
    assert [text.index(part) for part in order] == sorted(text.index(part) for part in order), text
    # A result is code, in a fence no backticks of its own can end.
    assert fenced("<b>x</b> ``` y") == "````\n<b>x</b> ``` y\n````"


def test_an_imported_call_left_waiting_or_running_arrives_cancelled(bob):
    """Such an answer showed live Approve and Deny buttons and a timer counting for ever: an import runs nothing."""
    from chat.models import Message

    client = Client()
    client.force_login(bob)
    calls = [
        {"id": "a", "name": "tests__echo", "status": "waiting"},
        {"id": "b", "name": "tests__add", "status": "running", "started_ms": 1},
        {"id": "c", "name": "tests__add", "status": "ok", "result": "3"},
    ]
    answer = {"id": 2, "parent": 1, "role": "assistant", "content": "y", "tool_rounds": [{"at": 0, "calls": calls}]}
    body = {"messages": [{"id": 1, "role": "user", "content": "x"}, answer]}
    assert client.post("/api/import", json.dumps(body), content_type="application/json").status_code in (200, 201)
    stored = Message.objects.get(role="assistant", conversation__owner=bob).tool_rounds[0]["calls"]
    assert [call["status"] for call in stored] == ["cancelled", "cancelled", "ok"]
    assert stored[0]["error"] == "not finished when it was exported" and stored[2]["result"] == "3"


def test_an_import_with_malformed_rounds_is_refused(bob):
    client = Client()
    client.force_login(bob)
    answer = {"id": 2, "parent": 1, "role": "assistant", "content": "y", "tool_rounds": [{"at": "x"}]}
    bad = {"messages": [{"id": 1, "role": "user", "content": "x"}, answer]}
    response = client.post("/api/import", json.dumps(bad), content_type="application/json")
    assert response.status_code == 400 and "tool_rounds" in response.content.decode()


def test_the_usage_dashboard_counts_calls_by_server_and_tool(alice, bob):
    for user, tool, status in [(alice, "echo", "ok"), (alice, "echo", "timeout"), (alice, "add", "denied"),
                               (bob, "echo", "ok")]:  # fmt: skip
        ToolCall.objects.create(user=user, server="tests", tool=tool, status=status)
    client = Client()
    client.force_login(alice)
    page = client.get("/usage/").content.decode()
    row = page.split('data-tool="tests__echo"')[1].split("</tr>")[0]
    cells = [cell.split(">")[1].split("<")[0] for cell in row.split("<td")[1:]]
    assert cells == ["tests", "echo", "2", "1", "1", "0"]  # alice's own calls only
    assert 'data-tool="tests__add"' in page


def test_the_tools_menu_lists_only_what_the_person_may_use_and_no_secret(alice, bob):
    from django.contrib.auth.models import Group

    from chat.models import McpServer, McpTool

    team = Group.objects.create(name="team")
    team.user_set.add(alice)
    echo = {"name": "echo", "description": "Says it back", "input_schema": {}}
    add, hidden = {"name": "add", "input_schema": {}}, {"name": "hidden", "input_schema": {}}
    server = McpServer.objects.create(name="tests", url="https://mcp.example/mcp", bearer="s3cret-bearer",
                                      headers={"X-Key": "h3ader"}, health="up", tools=[echo, add, hidden])  # fmt: skip
    server.groups.add(team)
    McpTool.objects.create(server=server, name="add", asks_first=True)
    McpTool.objects.create(server=server, name="hidden", enabled=False)
    conversation = Conversation.objects.create(owner=alice, tools=["tests__echo"])
    client = Client()
    client.force_login(alice)
    menu = client.get(f"/api/tools?conversation={conversation.pk}")
    tools = [{"name": "tests__echo", "tool": "echo", "description": "Says it back", "asks_first": False},
             {"name": "tests__add", "tool": "add", "description": "", "asks_first": True}]  # fmt: skip
    assert menu.json() == {
        "servers": [{"server": "tests", "health": "up", "tools": tools}],
        "chosen": ["tests__echo"],
    }  # fmt: skip
    assert b"s3cret" not in menu.content and b"h3ader" not in menu.content and b"example" not in menu.content
    client.force_login(bob)
    assert client.get("/api/tools").json() == {"servers": [], "chosen": None}
    assert client.get(f"/api/tools?conversation={conversation.pk}").status_code == 404


@pytest.mark.parametrize("live", [False, True])
def test_a_share_link_shows_the_calls_and_their_results(alice, bob, answered, live):
    owner, reader = Client(), Client()
    owner.force_login(alice)
    reader.force_login(bob)
    made = owner.post(f"/api/conversations/{answered.pk}/shares", {"live": live}, content_type="application/json")
    assert made.status_code == 201
    shown = reader.get(made.json()["url"]).context["content"]
    assert shown["messages"][-1]["tool_rounds"] == ROUNDS
    # "Continue in my chats": the reader's copy has the calls, and its next turn sends them upstream.
    continued = reader.post(made.json()["url"] + "continue")
    copy = Conversation.objects.get(pk=int(continued.url.strip("/").rsplit("/", 1)[-1]))
    assert copy.owner == bob and copy.messages.get(role="assistant").tool_rounds == ROUNDS
    assert [m["role"] for m in upstream_messages(copy)].count("tool") == 2


def test_an_edit_branches_and_the_first_answer_keeps_its_calls(alice, answered):
    """An edited question is a new branch; switching back shows the answer with its calls."""
    from chat.actions import branches

    question = answered.messages.get(role="user")
    edited = Message.objects.create(conversation=answered, role="user", content="use no tools")
    answered.current = edited
    answered.save()
    client = Client()
    client.force_login(alice)
    assert client.get(f"/api/conversations/{answered.pk}").json()["messages"][-1]["content"] == "use no tools"
    branches.switch(alice, question.pk)
    page = client.get(f"/api/conversations/{answered.pk}").json()
    assert page["messages"][-1]["tool_rounds"] == ROUNDS
    assert [m["role"] for m in upstream_messages(Conversation.objects.get(pk=answered.pk))].count("tool") == 2
