"""Tool calls in a chat turn over the websocket: real MCP servers, the fake upstream asking for the calls."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.test import override_settings

from chat.models import Budget, McpServer, McpTool, Message, ToolCall, Usage
from tests.conftest import MODELS

pytestmark = pytest.mark.django_db(transaction=True)

ECHO = '[[call:tests.echo {"text": "hi"}]]'


def tool_frames(frames, status=None):
    return [f["call"] for f in frames if f["type"] == "tool_call" and status in (None, f["call"]["status"])]


@pytest.mark.parametrize("dialect", ["i14", "api14", "infyrence"])
async def test_two_rounds_of_calls_each_metered(connect, alice, team, tools_server, tool_providers, fake, dialect):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=f"{ECHO} [[rounds:2]] [[reasoning:0]]",
                  model=MODELS[dialect])  # fmt: skip
    frames = await ws.until("done")
    done = frames[-1]
    assert done["status"] == "complete" and done["error"] is None, done
    finished = tool_frames(frames, "ok")
    assert len(finished) == 2 and all(c["result"] == "echo: hi" and c["server"] == "tests" for c in finished)
    assert any(f["type"] == "tool_arguments" for f in frames)  # the arguments streamed as they came

    reply = await Message.objects.aget(pk=done["message"])
    assert reply.content.endswith("Tool results: echo: hi") and len(reply.tool_rounds) == 2
    assert [c["status"] for r in reply.tool_rounds for c in r["calls"]] == ["ok", "ok"]
    # Three upstream requests, each metered on a row of its own, settled.
    rows = [u async for u in Usage.objects.filter(message=reply).order_by("started")]
    assert len(rows) == 3 and {u.status for u in rows} == {"complete"}
    assert done["usage"]["requests"] == 3
    assert done["usage"]["total_tokens"] == sum(u.total_tokens for u in rows)
    # The model was offered the tool and read the results in OpenAI's shape.
    body = fake.app.last().body
    names = ("echo", "add", "big", "hang", "fail", "hostile")
    assert [t["function"]["name"] for t in body["tools"]] == [f"tests__{n}" for n in names]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]
    assert body["messages"][1]["tool_calls"][0]["function"] == {"name": "tests__echo", "arguments": '{"text": "hi"}'}
    assert body["messages"][2]["content"] == "echo: hi"
    audit = [c async for c in ToolCall.objects.filter(message=reply)]
    assert len(audit) == 2 and {(c.user_id, c.server, c.tool, c.status) for c in audit} == {
        (alice.pk, "tests", "echo", "ok")
    }
    assert audit[0].arguments == {"text": "hi"} and audit[0].result_bytes == len("echo: hi")

    # The next turn sends the earlier answer's calls and results too.
    await ws.send(type="send", conversation=done["conversation"], content="[[echo]] again")
    await ws.until("done")
    roles = [m["role"] for m in fake.app.last().body["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user"]


async def test_several_calls_at_once_and_failures_do_not_stall(connect, alice, team, tools_server, tool_providers):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    content = ('[[call:tests.add {"a": 2, "b": 3}]] [[call:tests.hang {}]] [[call:tests.fail {}]] '
               '[[call:tests.big {"size": 2000000}]] [[call:tests.add {"a": "x"}]] [[reasoning:0]]')  # fmt: skip
    # The hanging call's timeout, long enough for the others on a busy machine (2 MB comes back in it).
    with override_settings(MCP_CALL_SECONDS=8, MCP_RESULT_MAX_CHARS=1000):
        await ws.send(type="send", conversation=None, content=content, model=MODELS["infyrence"])
        frames = await ws.until("done", timeout=60)
    done = frames[-1]
    assert done["status"] == "complete", done
    reply = await Message.objects.aget(pk=done["message"])
    calls = reply.tool_rounds[0]["calls"]
    assert [c["status"] for c in calls] == ["ok", "timeout", "error", "ok", "invalid"]
    assert calls[0]["result"] == "5"
    assert "broke on purpose" in calls[2]["error"] or "Error executing tool" in calls[2]["error"]
    assert calls[3]["size"] == 2_000_000 and calls[3]["truncated"] and len(calls[3]["result"]) == 1000
    # The hanging call ran beside the others: they did not wait for it to end.
    running = [f for f in frames if f["type"] == "tool_call" and f["call"]["status"] == "running"]
    assert len(running) == 4
    assert {c.status async for c in ToolCall.objects.filter(message=reply)} == {"ok", "timeout", "error", "invalid"}


async def test_each_rounds_thinking_is_set_apart_live_and_stored(connect, alice, team, tools_server, tool_providers):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=f"{ECHO} [[rounds:2]] [[reasoning:2]]", model=MODELS["i14"])
    frames = await ws.until("done")
    reply = await Message.objects.aget(pk=frames[-1]["message"])
    rounds = reply.reasoning.split("\n\n")
    assert len(rounds) == 3 and all(rounds), reply.reasoning  # three streams' thinking, a blank line between
    # The page's deltas add up to what is stored: a reload shows what streamed.
    assert "".join(f.get("reasoning", "") for f in frames if f["type"] == "delta") == reply.reasoning


@override_settings(MCP_MAX_ROUNDS=1)
async def test_the_round_limit_ends_the_turn(connect, alice, team, tools_server, tool_providers):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=f"{ECHO} [[rounds:3]]", model=MODELS["api14"])
    done = (await ws.until("done"))[-1]
    assert done["status"] == "complete" and "1 rounds" in done["error"]
    reply = await Message.objects.aget(pk=done["message"])
    assert len(reply.tool_rounds) == 1 and reply.tool_calls  # the second round's calls, not run
    assert await Usage.objects.filter(message=reply).acount() == 2
    assert await ToolCall.objects.filter(message=reply).acount() == 1


async def test_a_budget_used_up_by_the_first_round_ends_the_turn_saying_so(
    connect, alice, team, tools_server, tool_providers
):
    """The answer had started and its calls ran: not "Cannot start the answer", and one full stop."""
    await team.user_set.aadd(alice)
    await Budget.objects.acreate(user=alice, tokens=1)  # the first request may start; it spends more
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=f"{ECHO} [[rounds:2]]", model=MODELS["api14"])
    done = (await ws.until("done"))[-1]
    assert done["error"].startswith("The answer could not go on after its tool calls: Your monthly budget"), done
    assert done["error"].endswith(".") and ".." not in done["error"]
    assert await ToolCall.objects.filter(message_id=done["message"]).acount() == 1  # the first round's call ran


async def test_a_person_outside_the_groups_cannot_reach_the_tools(connect, alice, bob, team, tools_server,
                                                                  tool_providers, fake):  # fmt: skip
    await team.user_set.aadd(alice)
    _, _, ws = await connect(bob)
    # Naming the tool in the frame changes nothing: the turn's tools are the owner's.
    await ws.send(type="send", conversation=None, content=ECHO, model=MODELS["i14"], tools=["tests__echo"])
    done = (await ws.until("done"))[-1]
    assert "tools" not in fake.app.last().body
    reply = await Message.objects.aget(pk=done["message"])
    # No tools offered: the model's call is an answer like any other, nothing runs.
    assert reply.tool_rounds is None and reply.tool_calls
    assert not await ToolCall.objects.filter(user=bob).aexists()
    # Regenerate: the same.
    await ws.send(type="regenerate", conversation=done["conversation"])
    done = (await ws.until("done"))[-1]
    assert "tools" not in fake.app.last().body and not await ToolCall.objects.filter(user=bob).aexists()


async def test_a_tool_taken_from_the_person_during_a_turn_does_not_run_in_its_next_round(
    connect, alice, team, tools_server, tool_providers
):
    """Left the group while the first round's call ran: the next round's call of the same tool is refused."""
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content='[[call:tests.hang {"seconds": 2}]] [[rounds:2]]',
                  model=MODELS["api14"])  # fmt: skip
    frames = await ws.until("tool_call")
    while frames[-1]["call"]["status"] != "running":
        frames += await ws.until("tool_call")
    await team.user_set.aremove(alice)
    done = (await ws.until("done", timeout=60))[-1]
    reply = await Message.objects.aget(pk=done["message"])
    assert [[call["status"] for call in entry["calls"]] for entry in reply.tool_rounds] == [["ok"], ["forbidden"]]
    statuses = [row.status async for row in ToolCall.objects.filter(message=reply).order_by("pk")]
    assert statuses == ["ok", "forbidden"]


async def test_a_model_without_tools_is_sent_none(connect, alice, team, tools_server, providers, fake):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=ECHO, model=MODELS["i14"])
    done = (await ws.until("done"))[-1]
    assert done["finish_reason"] == "tool_calls" and "tools" not in fake.app.last().body
    assert not await ToolCall.objects.aexists()


async def test_after_a_tools_turn_a_model_without_tools_is_sent_no_tool_messages(
    connect, alice, team, tools_server, tool_providers, fake
):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=ECHO, model=MODELS["api14"])
    done = (await ws.until("done"))[-1]
    assert any(m["role"] == "tool" for m in fake.app.last().body["messages"])  # the tools turn's second request
    without = tool_providers["i14"]
    without.tool_models = ""  # i14's model takes no tools now
    await without.asave()
    await ws.send(type="send", conversation=done["conversation"], content="[[echo]] and now?", model=MODELS["i14"])
    await ws.until("done")
    sent = fake.app.last().body
    assert "tools" not in sent and not any(m["role"] == "tool" or m.get("tool_calls") for m in sent["messages"])
    assert "[tool result: echo: hi]" in sent["messages"][-2]["content"]


async def test_a_server_that_is_down_is_left_out(connect, alice, team, tools_server, tool_providers, fake):
    from chat.actions import tool_servers

    await team.user_set.aadd(alice)
    down = await McpServer.objects.acreate(name="gone", url="http://127.0.0.1:9/mcp")
    await down.groups.aadd(team)
    assert await tool_servers.refresh(down)
    await down.arefresh_from_db()
    assert down.health == "down" and down.last_error
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content='[[call:gone.echo {"text": "x"}]] ' + ECHO,
                  model=MODELS["i14"])  # fmt: skip
    frames = await ws.until("done")
    names = {t["function"]["name"] for t in fake.app.streams[0].body["tools"]}
    assert all(name.startswith("tests__") for name in names)
    calls = tool_frames(frames)
    assert {c["name"]: c["status"] for c in calls if c["status"] != "running"} == {
        "gone__echo": "forbidden", "tests__echo": "ok"
    }  # fmt: skip


async def test_a_server_back_up_is_listed_again_within_the_down_retry_and_others_wait_their_turn(mcp_http):
    from datetime import timedelta

    from django.utils import timezone

    from chat.actions import tool_servers

    now = timezone.now()
    retry_ago = now - timedelta(seconds=tool_servers.DOWN_RETRY_SECONDS)
    refresh_ago = now - timedelta(seconds=settings.MCP_REFRESH_SECONDS)
    make = McpServer.objects.acreate
    back = await make(name="back", url=mcp_http, health="down", last_error="was away", refreshed=retry_ago)
    fresh = await make(name="fresh", url=mcp_http, health="up", tools=[], refreshed=retry_ago)
    stale = await make(name="stale", url=mcp_http, health="up", tools=[], refreshed=refresh_ago)
    await tool_servers.refresh_due()
    for server in (back, fresh, stale):
        await server.arefresh_from_db()
    assert back.health == "up" and not back.last_error and back.tools  # its tools are offered again
    assert stale.tools and stale.refreshed > now
    assert fresh.tools == [] and fresh.refreshed < now  # listed by some process 30 s ago: not yet again


async def test_switched_off_tools_and_asks_first(connect, alice, team, tools_server, tool_providers, fake):
    await team.user_set.aadd(alice)
    await McpTool.objects.filter(server=tools_server, name="add").aupdate(enabled=False)
    await McpTool.objects.filter(server=tools_server, name="echo").aupdate(asks_first=True)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=ECHO + ' [[call:tests.add {"a": 1, "b": 1}]]',
                  model=MODELS["i14"], tools=["tests__echo", "tests__add", "tests__fail"])  # fmt: skip
    frames = await ws.until("tool_call")
    while frames[-1]["call"]["status"] != "waiting":
        frames += await ws.until("tool_call")
    waiting = frames[-1]
    assert waiting["call"]["name"] == "tests__echo"
    assert [t["function"]["name"] for t in fake.app.last().body["tools"]] == ["tests__echo", "tests__fail"]
    await ws.send(type="tool_approval", message=waiting["message"], call=waiting["call"]["id"], approve=False)
    done = (await ws.until("done"))[-1]
    reply = await Message.objects.aget(pk=done["message"])
    assert [c["status"] for c in reply.tool_rounds[0]["calls"]] == ["denied", "forbidden"]
    assert "[tool call denied]" in fake.app.last().body["messages"][2]["content"]

    # Approved, the call runs.
    await ws.send(type="send", conversation=done["conversation"], content=ECHO)
    frames = await ws.until("tool_call")
    while frames[-1]["call"]["status"] != "waiting":
        frames += await ws.until("tool_call")
    await ws.send(type="tool_approval", message=frames[-1]["message"], call=frames[-1]["call"]["id"], approve=True)
    done = (await ws.until("done"))[-1]
    reply = await Message.objects.aget(pk=done["message"])
    assert reply.tool_rounds[0]["calls"][0]["status"] == "ok"

    # Switched off by staff while it waited: an Approve does not run it.
    await ws.send(type="send", conversation=done["conversation"], content=ECHO)
    frames = await ws.until("tool_call")
    while frames[-1]["call"]["status"] != "waiting":
        frames += await ws.until("tool_call")
    await McpTool.objects.filter(server=tools_server, name="echo").aupdate(enabled=False)
    await ws.send(type="tool_approval", message=frames[-1]["message"], call=frames[-1]["call"]["id"], approve=True)
    done = (await ws.until("done"))[-1]
    call = (await Message.objects.aget(pk=done["message"])).tool_rounds[0]["calls"][0]
    assert (call["status"], call["error"]) == ("denied", "the tool was switched off while it waited for approval")
    await McpTool.objects.filter(server=tools_server, name="echo").aupdate(enabled=True)

    # Not answered in time: denied, and the record says so rather than that the person denied it.
    with override_settings(MCP_APPROVAL_SECONDS=0.2):
        await ws.send(type="send", conversation=done["conversation"], content=ECHO)
        done = (await ws.until("done"))[-1]
    reply = await Message.objects.aget(pk=done["message"])
    call = reply.tool_rounds[0]["calls"][0]
    assert (call["status"], call["error"]) == ("denied", "no answer from the person within 0.2 s")
    assert (await ToolCall.objects.filter(message=reply).afirst()).error == call["error"]


async def test_another_person_cannot_approve(connect, alice, bob, team, tools_server, tool_providers):
    await team.user_set.aadd(alice)
    await McpTool.objects.filter(server=tools_server, name="echo").aupdate(asks_first=True)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content=ECHO, model=MODELS["i14"])
    frames = await ws.until("tool_call")
    while frames[-1]["call"]["status"] != "waiting":
        frames += await ws.until("tool_call")
    _, _, other = await connect(bob)
    await other.send(type="tool_approval", message=frames[-1]["message"], call=frames[-1]["call"]["id"], approve=True)
    error = await other.receive()
    assert error["type"] == "error" and error["code"] == "not_found"
    await ws.send(type="stop", message=frames[-1]["message"])
    done = (await ws.until("done"))[-1]
    assert done["status"] == "stopped"
    reply = await Message.objects.aget(pk=done["message"])
    assert reply.tool_rounds[0]["calls"][0]["status"] == "cancelled"
    assert not done.get("tool_calls") and reply.tool_calls is None  # the calls are the round's, not shown twice
    # The round's stream was settled once, the turn ended there: one row, complete.
    assert [u.status async for u in Usage.objects.filter(message=reply)] == ["complete"]


async def test_a_stdio_server_from_the_settings_file(connect, alice, stdio_file, tool_providers, fake):
    from chat.actions import tool_servers
    from chat.streaming.tool_catalog import sync_stdio_servers

    alice.is_superuser = True
    await alice.asave()
    await sync_to_async(sync_stdio_servers)()
    local = await McpServer.objects.aget(name="local")
    assert local.transport == "stdio"
    assert await tool_servers.refresh(local) == ""
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content='[[call:local.add {"a": 20, "b": 22}]]', model=MODELS["i14"])
    done = (await ws.until("done", timeout=60))[-1]
    reply = await Message.objects.aget(pk=done["message"])
    assert reply.tool_rounds[0]["calls"][0]["result"] == "42" and reply.content.endswith("Tool results: 42")


async def running_call(ws):
    frames = await ws.until("tool_call")
    while frames[-1]["call"]["status"] != "running":
        frames += await ws.until("tool_call")
    return frames[-1]


async def test_a_tab_that_attaches_sees_the_calls_and_stop_cancels_a_running_one(
    connect, alice, team, tools_server, tool_providers
):
    await team.user_set.aadd(alice)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[call:tests.hang {}]] wait", model=MODELS["i14"])
    running = await running_call(ws)
    _, _, later = await connect(alice)
    await later.send(type="attach", conversation=running["conversation"])
    snapshot = (await later.until("snapshot"))[-1]
    assert [c["status"] for c in snapshot["tool_rounds"][0]["calls"]] == ["running"]
    assert snapshot["tool_rounds"][0]["calls"][0]["name"] == "tests__hang"

    await later.send(type="stop", message=running["message"])  # any tab of the owner
    done = (await ws.until("done"))[-1]
    assert done["status"] == "stopped"
    reply = await Message.objects.aget(pk=done["message"])
    assert reply.tool_rounds[0]["calls"][0]["status"] == "cancelled"
    assert [c.status async for c in ToolCall.objects.filter(message=reply)] == ["cancelled"]
    assert [u.status async for u in Usage.objects.filter(message=reply)] == ["complete"]


@override_settings(MCP_CALLS_PER_MINUTE=3)
async def test_the_minutes_calls_hold_for_turns_side_by_side_and_refused_calls_use_none(
    connect, alice, team, tools_server, tool_providers
):
    """Two turns at once could each count the same free calls (a call was written only when its round ended):
    4 ran of 3. Calls that never reached a tool (no such tool) used up the minute too."""
    await team.user_set.aadd(alice)
    _, _, first = await connect(alice)
    _, _, second = await connect(alice)
    await first.send(type="send", conversation=None, content="[[call:tests.nope {}]] [[call:tests.nope {}]] x",
                     model=MODELS["api14"])  # fmt: skip
    await first.until("done")
    slow = '[[call:tests.hang {"seconds": 1}]]'
    await first.send(type="send", conversation=None, content=f"{slow} {slow} wait", model=MODELS["api14"])
    running = set()
    while len(running) < 2:  # both of the first turn's calls run, not yet written as done
        frame = (await first.until("tool_call"))[-1]
        if frame["call"]["status"] == "running":
            running.add(frame["call"]["id"])
    add = '[[call:tests.add {"a": 1, "b": 2}]]'
    await second.send(type="send", conversation=None, content=f"{add} {add} sum", model=MODELS["api14"])
    await first.until("done")
    await second.until("done")
    statuses = [status async for status in ToolCall.objects.order_by("pk").values_list("status", flat=True)]
    assert sorted(statuses) == ["forbidden", "forbidden", "limited", "ok", "ok", "ok"], statuses
