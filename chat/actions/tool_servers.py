"""MCP servers' tool lists and health: fetched when staff save or test a server, and again on a schedule.

A server that cannot list its tools is marked down with the reason (no secret in it); a down
server's tools are left out of every turn (chat/streaming/tool_catalog.py) until a refresh finds
it up. Each refresh has its own time limit, so a hanging server delays nobody's chat.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from asgiref.sync import async_to_sync
from django.conf import settings
from django.utils import timezone

from chat.models import McpServer, McpTool, update_row
from chat.runtime import db_threads, process_loops
from chat.runtime.failures import every
from chat.streaming import mcp_client
from chat.streaming.tool_catalog import endpoint_of, sync_stdio_servers

# One listing's time limit.
LIST_SECONDS = 10.0
# A server found down is listed again this often, so its tools come back soon after it does.
DOWN_RETRY_SECONDS = 30.0


async def _listing(server: McpServer) -> tuple[list[dict] | None, str]:
    """The server's tools (None when it cannot list them) and the error ("" when up)."""
    endpoint = endpoint_of(server)
    if endpoint is None:
        return None, "not declared in MCP_SERVERS_FILE"
    try:
        return await mcp_client.list_tools(endpoint, LIST_SECONDS), ""
    except mcp_client.McpFailure as exc:
        return None, str(exc) or "unreachable"


async def refresh(server: McpServer) -> str:
    """List a server's tools and store them with its health; the error ("" when up)."""
    tools, error = await _listing(server)
    await db_threads.run(_store)(server.pk, tools, error)
    return error


def _store(pk: int, tools: list[dict] | None, error: str) -> None:
    fields: dict = {"refreshed": timezone.now(), "last_error": error}
    if tools is None:
        fields["health"] = McpServer.Health.DOWN
    else:
        fields.update(health=McpServer.Health.UP, tools=tools)
        server = McpServer(pk=pk)
        known = set(McpTool.objects.filter(server=server).values_list("name", flat=True))
        McpTool.objects.bulk_create([McpTool(server=server, name=t["name"]) for t in tools if t["name"] not in known])
    update_row(McpServer, pk, fields)


def refresh_now(server: McpServer) -> str:
    """refresh() from synchronous code (the admin's save, once committed, and "Test connection"); stored at once."""
    tools, error = async_to_sync(_listing)(server)
    _store(server.pk, tools, error)
    return error


def due(server: McpServer, now: datetime) -> bool:
    """Whether a server's tools are listed again now: every MCP_REFRESH_SECONDS, or DOWN_RETRY_SECONDS while it
    is down. Another process's listing counts: the processes share the work."""
    if server.refreshed is None:
        return True
    wait = settings.MCP_REFRESH_SECONDS
    if server.health == McpServer.Health.DOWN:
        wait = min(wait, DOWN_RETRY_SECONDS)
    return (now - server.refreshed).total_seconds() >= wait * 0.9  # a tick that comes a little early still counts


async def refresh_due() -> None:
    """The enabled servers due a listing, at once."""
    await db_threads.run(sync_stdio_servers)()
    now = timezone.now()
    servers = await db_threads.run(lambda: [s for s in McpServer.objects.filter(enabled=True) if due(s, now)])()
    await asyncio.gather(*(refresh(server) for server in servers))


async def refresh_forever(process: process_loops.Process) -> None:
    """refresh_due() every DOWN_RETRY_SECONDS (or MCP_REFRESH_SECONDS if shorter); a database outage is logged
    once a streak and retried."""
    tick = max(1.0, min(settings.MCP_REFRESH_SECONDS, DOWN_RETRY_SECONDS))  # MCP_REFRESH_SECONDS=0 must not spin

    def interval(failures: int) -> float:
        return min(tick * 2**failures, max(tick, 600.0))

    await every(interval, refresh_due, "cannot refresh the MCP servers' tools", "MCP servers' tools refreshed again")
