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
