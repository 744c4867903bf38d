"""Which MCP tools a person may use in a turn, and where their servers are.

Read on a database thread when a turn starts (every path: send, edit, regenerate, continue),
for the conversation's owner: servers open to one of their groups (superusers: all), enabled,
not down, and their tools that staff left on and the conversation did not switch off. A tool
outside this set is never called, whatever a model or a frame names.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from chat.models import McpServer, McpTool, tool_name
from chat.streaming.mcp_client import Endpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolSpec:
    """One tool a turn may call: its name to the model, its server's, its schema and whether it asks first."""

    name: str
    server: str
    tool: str
    description: str
    schema: dict[str, Any]
    asks_first: bool
    endpoint: Endpoint

    def as_openai(self) -> dict[str, Any]:
        schema = self.schema if self.schema.get("type") == "object" else {"type": "object", "properties": {}}
        return {"type": "function", "function": {"name": self.name, "description": self.description[:1024],
                                                 "parameters": schema}}  # fmt: skip


@functools.cache
def stdio_servers() -> dict[str, dict[str, Any]]:
    """The stdio servers MCP_SERVERS_FILE declares, by name (read once per process)."""
    path = settings.MCP_SERVERS_FILE
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            servers = json.load(file).get("servers") or {}
    except (OSError, ValueError, AttributeError) as exc:
        log.error("MCP_SERVERS_FILE %s cannot be read: %s", path, exc)
        return {}
    usable = {}
    for name, spec in servers.items():
        if not isinstance(spec, dict) or not spec.get("command"):
            continue
        try:
            McpServer._meta.get_field("name").run_validators(str(name))
        except ValidationError as exc:
            log.error("MCP_SERVERS_FILE %s: server %r is left out: %s", path, name, " ".join(exc.messages))
            continue
        usable[str(name)] = spec
    return usable


def sync_stdio_servers() -> None:
    """The file's stdio servers as rows (for their groups and tools in the admin); rows no longer in it disabled.

    A process with no MCP_SERVERS_FILE has no say: in a rolling restart that adds the file, the processes not yet
    restarted would otherwise disable the rows the new ones made (and nothing enables a disabled row again).
    """
    if not settings.MCP_SERVERS_FILE:
        return
    declared = stdio_servers()
    for name in declared:
        server, _ = McpServer.objects.get_or_create(name=name, defaults={"transport": McpServer.Transport.STDIO})
        if server.transport != McpServer.Transport.STDIO:
            log.warning("MCP_SERVERS_FILE: server %r is left out: an HTTP server has that name in the admin", name)
    gone = McpServer.objects.filter(transport=McpServer.Transport.STDIO, enabled=True).exclude(name__in=list(declared))
    if gone.exists():  # read first: run on every refresh tick, it writes nothing while nothing changed
        gone.update(enabled=False)


def endpoint_of(server: McpServer) -> Endpoint | None:
    """Where to reach a server (None: a stdio server the file no longer declares)."""
    if server.transport == McpServer.Transport.STDIO:
        spec = stdio_servers().get(server.name)
        return Endpoint(server.name, stdio=spec) if spec is not None else None
    headers = {str(k): str(v) for k, v in (server.headers or {}).items()}
    if server.bearer:
        headers["Authorization"] = f"Bearer {server.bearer}"
    return Endpoint(server.name, url=server.url, headers=headers, allow_link_local=settings.UPSTREAM_ALLOW_LINK_LOCAL)


def tools_for(user, chosen: list[str] | None) -> tuple[ToolSpec, ...]:
    """The tools `user` may call in a turn; `chosen`: the conversation's switched-on names (None: all)."""
    servers = list(McpServer.objects.usable_by(user).exclude(health=McpServer.Health.DOWN))
    if not servers:
        return ()
    settings_of = _tool_settings(servers)
    specs = []
    for server in servers:
        endpoint = endpoint_of(server)
        if endpoint is None:
            continue
        for tool in server.tools or []:
            setting = settings_of.get((server.pk, tool.get("name")))
            if setting is not None and not setting.enabled:
                continue
            name = tool_name(server.name, tool["name"])
            if chosen is not None and name not in chosen:
                continue
            if any(spec.name == name for spec in specs):  # server a, tool b__c and server a__b, tool c
                log.warning("MCP tool %s of server %s is left out: another tool has that name", tool["name"], server)
                continue
            specs.append(ToolSpec(
                name=name, server=server.name, tool=tool["name"], description=tool.get("description") or "",
                schema=tool.get("input_schema") or {}, asks_first=bool(setting and setting.asks_first),
                endpoint=endpoint,
            ))  # fmt: skip
    return tuple(specs)


def still_offered(user_id: int, specs: Iterable[ToolSpec]) -> set[str]:
    """The names of these tools, offered at a turn's start, that still are: their server enabled and open to the
    person, the tool on. Asked at each round and at each approval: staff may take a tool away during a turn."""
    specs = list(specs)
    user = get_user_model().objects.get(pk=user_id)
    servers = list(McpServer.objects.usable_by(user).filter(name__in={spec.server for spec in specs}))
    off = set(McpTool.objects.filter(server__in=servers, enabled=False).values_list("server__name", "name"))
    usable = {server.name for server in servers}
    return {spec.name for spec in specs if spec.server in usable and (spec.server, spec.tool) not in off}


def menu_for(user) -> list[dict[str, Any]]:
    """The composer's tools menu: each server this person may use, up or down, with its enabled tools."""
    servers = list(McpServer.objects.usable_by(user))
    settings_of = _tool_settings(servers)
    menu = []
    for server in servers:
        tools = []
        for tool in server.tools or []:
            setting = settings_of.get((server.pk, tool.get("name")))
            if setting is not None and not setting.enabled:
                continue
            tools.append({
                "name": tool_name(server.name, tool["name"]), "tool": tool["name"],
                "description": (tool.get("description") or "")[:300],
                "asks_first": bool(setting and setting.asks_first),
            })  # fmt: skip
        menu.append({"server": server.name, "health": server.health, "tools": tools})
    return menu


def _tool_settings(servers: list[McpServer]) -> dict[tuple[int, str], McpTool]:
    """Staff's settings of these servers' tools by (server id, tool name); a tool without one is on and runs at once."""
    return {(row.server_id, row.name): row for row in McpTool.objects.filter(server__in=[s.pk for s in servers])}
