"""The MCP client against the real test server: a call past its time limit is a timeout, whichever timer wins."""

from __future__ import annotations

import asyncio
import time

import pytest

from chat.streaming import mcp_client
from tests.mcp_servers import server


async def test_a_call_whose_event_loop_stalls_past_the_limit_is_a_timeout(mcp_http):
    endpoint = mcp_client.Endpoint(name="tests", url=mcp_http)
    seconds, ended = 3.0, False
    server.hang_started.clear()

    async def stall_once_the_tool_runs() -> None:
        await asyncio.to_thread(server.hang_started.wait)
        if not ended:
            # The loop is busy past every timer (ours, the SDK's, httpx's), so all come due at once, as when
            # another call's 2 MB result is parsed on it.
            asyncio.get_running_loop().call_soon(time.sleep, seconds + 0.5)

    staller = asyncio.create_task(stall_once_the_tool_runs())
    try:
        with pytest.raises(TimeoutError):
            await mcp_client.call_tool(endpoint, "hang", {}, seconds, 1000)
    finally:
        ended = True
        server.hang_started.set()
        await staller


async def test_a_result_past_the_response_cap_fails_as_it_arrives_and_one_under_it_is_cut(mcp_http, monkeypatch):
    """A result is held whole before it is cut to the chat's share: past MAX_RESPONSE_BYTES the call fails
    instead (a 60 MB result took the process from 165 to 800 MB)."""
    monkeypatch.setattr(mcp_client, "MAX_RESPONSE_BYTES", 1_000_000)
    endpoint = mcp_client.Endpoint(name="tests", url=mcp_http)
    with pytest.raises(mcp_client.McpFailure, match="passed"):
        await mcp_client.call_tool(endpoint, "big", {"size": 2_000_000}, 30, 1000)
    result = await mcp_client.call_tool(endpoint, "big", {"size": 300_000}, 30, 1000)  # sent twice: 600 KB
    assert (result.size, len(result.text), result.truncated) == (300_000, 1000, True)


async def test_a_stdio_call_past_its_limit_answers_at_once_and_its_server_is_ended_behind_it():
    """The SDK gives a stdio server seconds to exit before it ends it: a 10 s limit showed "Timed out 11.5 s",
    and a Stop waited as long. The caller is answered at the limit; the session closes in a task of its own."""
    import sys

    from tests.live import ROOT

    command = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.server", "stdio"], "cwd": str(ROOT)}
    endpoint = mcp_client.Endpoint(name="local", stdio=command)
    assert (await mcp_client.call_tool(endpoint, "echo", {"text": "up"}, 30, 1000)).text == "echo: up"  # it starts
    with pytest.raises(TimeoutError):
        await mcp_client.call_tool(endpoint, "hang", {}, 3, 1000)
    closing = set(mcp_client._closing)
    assert len(closing) == 1  # answered while its session still closes
    async with asyncio.timeout(30):
        await asyncio.wait(closing)
    assert not mcp_client._closing
