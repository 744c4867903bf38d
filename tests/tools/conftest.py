"""Real MCP servers for the tools tests: the `mcp` SDK's Streamable HTTP app served on a free port in a thread,
and the same server over stdio, declared in an MCP_SERVERS_FILE."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.contrib.auth.models import Group

from tests.fakeserver import FakeServer
from tests.mcp_servers.server import server as mcp_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def mcp_http():
    """The test MCP server over Streamable HTTP; its endpoint URL."""
    with FakeServer(mcp_server.streamable_http_app(), lifespan="on") as served:
        yield served.url + "/mcp"


@pytest.fixture
def stdio_file(tmp_path, settings):
    """An MCP_SERVERS_FILE declaring the test server as the stdio server `local`."""
    from chat.streaming import tool_catalog

    path = tmp_path / "mcp.json"
    command = {"command": sys.executable, "args": ["-m", "tests.mcp_servers.server", "stdio"], "cwd": str(ROOT)}
    path.write_text(json.dumps({"servers": {"local": command}}))
    settings.MCP_SERVERS_FILE = str(path)
    tool_catalog.stdio_servers.cache_clear()
    yield path
    tool_catalog.stdio_servers.cache_clear()


@pytest.fixture
def team(transactional_db):
    return Group.objects.create(name="team")


@pytest.fixture
def tools_server(mcp_http, team, transactional_db):
    """The HTTP server registered as `tests`, open to the group `team`, its tools listed."""
    from chat.actions import tool_servers
    from chat.models import McpServer

    server = McpServer.objects.create(name="tests", url=mcp_http)
    server.groups.add(team)
    # On a thread of its own: the browser tests' thread has Playwright's event loop marked as running.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(tool_servers.refresh_now, server).result() == ""
    server.refresh_from_db()
    return server


@pytest.fixture
def tool_providers(providers):
    """The fake upstream's providers, every model taking tools."""
    for provider in providers.values():
        provider.tool_models = "*"
        provider.save()
    return providers
