"""A real MCP server built with the `mcp` SDK, for the tools tests.

`python -m tests.mcp_servers.server http PORT` (Streamable HTTP) or `… stdio`.

Its tools answer, return a large result, run past any time limit, fail, and return hostile HTML.
A bearer secret, when MCP_TEST_BEARER is set, is required on every HTTP request.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

from mcp.server.mcpserver import MCPServer

server = MCPServer("test-tools")
# Set when `hang` starts: a test in the same process knows the call reached the tool.
hang_started = threading.Event()


@server.tool(description="Says the text back, with a prefix.")
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


@server.tool(description="A result of `size` bytes.")
def big(size: int = 10_000_000) -> str:
    return "x" * size


@server.tool(description="Never answers in time.")
async def hang(seconds: float = 3600) -> str:
    hang_started.set()
    await asyncio.sleep(seconds)
    return "late"


@server.tool(description="Always fails.")
def fail() -> str:
    raise RuntimeError("the tool broke on purpose")


@server.tool(description="Answers with HTML that must never run.")
def hostile() -> str:
    return '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script><b>bold?</b>'


def guarded(app, bearer: str):
    """`app` answering 401 to an HTTP request without `Authorization: Bearer <bearer>`."""

    async def guarded_app(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {bearer}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no"})
            return
        await app(scope, receive, send)

    return guarded_app


def main() -> None:
    if sys.argv[1] == "stdio":
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app()
    bearer = os.environ.get("MCP_TEST_BEARER", "")
    uvicorn.run(guarded(app, bearer) if bearer else app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")


if __name__ == "__main__":
    main()
