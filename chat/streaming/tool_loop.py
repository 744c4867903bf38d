"""A round of tool calls: the model's calls checked, approved when a tool asks first, run at once, recorded.

Each call is checked against the turn's tools (chat/streaming/tool_catalog.py: what the person
may use) and its arguments against the tool's JSON schema; a tool that asks first waits for the
person's Approve or Deny; the calls then run in parallel, each within MCP_CALL_SECONDS and its
text cut to MCP_RESULT_MAX_CHARS. Whatever happens, every call ends with a result the model
reads: the tool's text, or a sentence saying why there is none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import orjson
from django.conf import settings

from chat.lib.json_depth import without_nul
from chat.runtime import stopping
from chat.streaming import mcp_client
from chat.streaming.tool_catalog import ToolSpec

log = logging.getLogger(__name__)

OK, ERROR, TIMEOUT, INVALID, DENIED, FORBIDDEN, LIMITED, CANCELLED = (
    "ok", "error", "timeout", "invalid", "denied", "forbidden", "limited", "cancelled",
)  # fmt: skip
RUNNING, WAITING = "running", "waiting"
UNFINISHED = ("pending", WAITING, RUNNING)


@dataclass
class Call:
    """One call of a round, as stored on the answer (Message.tool_rounds) and shown in the page."""

    id: str
    name: str
    arguments: str
    server: str = ""
    tool: str = ""
    status: str = "pending"
    result: str = ""
    error: str = ""
    size: int = 0
    truncated: bool = False
    duration_ms: int = 0
    started_ms: int = 0  # epoch ms the run began, for the page's elapsed time
    parsed: Any = field(default=None, repr=False)
    slot: int | None = field(default=None, repr=False)  # its ToolCall row, taken from the minute's calls to run it

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "server": self.server, "tool": self.tool, "arguments": self.arguments,
            "status": self.status, "result": self.result, "error": self.error, "size": self.size,
            "truncated": self.truncated, "duration_ms": self.duration_ms, "started_ms": self.started_ms,
        }  # fmt: skip

    def for_model(self) -> str:
        """What the model reads as this call's result."""
        if self.status == OK:
            cut = f"\n[result cut to its first {len(self.result)} characters]" if self.truncated else ""
            return self.result + cut
        return f"[tool call {self.status}] {self.error}"


def ended_rounds(rounds: Any, error: str) -> tuple[Any, list[Call]]:
    """Stored rounds (Message.tool_rounds) with each call still unfinished marked cancelled with `error`, for an
    answer whose turn ended without them (its server stopped); anything else comes back as it was. And the calls
    of the rounds that had one unfinished, so ended: the round that server was in, which its turn never recorded
    (that happens once all of a round's calls end)."""
    if not isinstance(rounds, list):
        return rounds, []
    ended, cut = [], []
    for entry in rounds:
        if not isinstance(entry, dict):
            ended.append(entry)
            continue
        calls = entry.get("calls") or []
        unfinished = [isinstance(call, dict) and call.get("status") in UNFINISHED for call in calls]
        ending = {"status": CANCELLED, "error": error}
        calls = [{**call, **ending} if late else call for call, late in zip(calls, unfinished, strict=True)]
        ended.append({**entry, "calls": calls})
        if any(unfinished):
            cut += [_stored(call) for call in calls if isinstance(call, dict)]
    return ended, cut


def _stored(call: dict[str, Any]) -> Call:
    """A stored call (Call.public()) as a Call, its arguments parsed where they are JSON."""
    fields = {name: call[name] for name in Call.__dataclass_fields__ if name in call and name != "parsed"}
    stored = Call(**{"id": "", "name": "", "arguments": "", **fields})
    try:
        stored.parsed = orjson.loads(stored.arguments)
    except (orjson.JSONDecodeError, TypeError):
        pass
    return stored


def calls_of(tool_calls: list[dict[str, Any]]) -> list[Call]:
    """The model's assembled tool calls (by index, chat/streaming/upstream/state.py) as calls to run."""
    calls = []
    for index, raw in enumerate(tool_calls):
        function = raw.get("function") or {}
        calls.append(Call(id=str(raw.get("id") or f"call_{index}"), name=str(function.get("name") or ""),
                          arguments=str(function.get("arguments") or "")))  # fmt: skip
    return calls


def check(call: Call, specs: dict[str, ToolSpec]) -> ToolSpec | None:
    """The call's tool if it may run; otherwise the call is ended (forbidden or invalid) with a reason."""
    spec = specs.get(call.name)
    if spec is None:
        call.status, call.error = FORBIDDEN, f"no tool named {call.name[:100]!r} is available in this chat"
        return None
    call.server, call.tool = spec.server, spec.tool
    try:
        arguments = orjson.loads(without_nul(call.arguments or "{}"))  # stored in the audit: no NUL
    except orjson.JSONDecodeError:
        call.status, call.error = INVALID, "the arguments are not valid JSON"
        return None
    if not isinstance(arguments, dict):
        call.status, call.error = INVALID, "the arguments must be a JSON object"
        return None
    try:
        jsonschema.validate(arguments, spec.schema or {"type": "object"})
    except jsonschema.ValidationError as exc:
        call.status, call.error = INVALID, f"the arguments do not match the tool's schema: {exc.message[:300]}"
        return None
    except jsonschema.SchemaError:
        pass  # the server's schema is broken: the server judges its arguments itself
    call.parsed = arguments
    return spec


async def run_call(call: Call, spec: ToolSpec) -> None:
    """Run one checked call within the time limit; its outcome set on `call`."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    call.status, call.started_ms = RUNNING, int(time.time() * 1000)
    try:
        result = await mcp_client.call_tool(spec.endpoint, spec.tool, call.parsed, settings.MCP_CALL_SECONDS,
                                            settings.MCP_RESULT_MAX_CHARS)  # fmt: skip
    except TimeoutError:
        call.status, call.error = TIMEOUT, f"no answer within {settings.MCP_CALL_SECONDS:g} s"
    except mcp_client.McpFailure as exc:
        call.status, call.error = ERROR, f"the server {spec.server} failed: {exc}"
    except asyncio.CancelledError:
        call.status, call.error = CANCELLED, cancelled_because()
        call.duration_ms = round((loop.time() - began) * 1000)
        raise
    except Exception as exc:  # the SDK's own surprises must not end the turn
        log.warning("tool %s.%s: unexpected failure %r", spec.server, spec.tool, exc)
        call.status, call.error = ERROR, "the call failed unexpectedly"
    else:
        call.size, call.truncated = result.size, result.truncated
        if result.is_error:
            call.status, call.error = ERROR, result.text[:2000] or "the tool reported an error"
        else:
            call.status, call.result = OK, result.text
    call.duration_ms = round((loop.time() - began) * 1000)


def cancelled_because() -> str:
    """Why a call was cut off: the person's Stop (or a deactivation), or this process's graceful stop."""
    return "the server stopped while the call ran" if stopping.draining() else "stopped by the person"


async def run_round(calls: list[Call], specs: dict[str, ToolSpec],
                    take_slots: Callable[[list[Call]], Awaitable[list[int]]],
                    notify: Callable[[Call], Awaitable[None]],
                    approve: Callable[[Call], Awaitable[bool]]) -> None:  # fmt: skip
    """Check, approve and run a round's calls (in parallel).

    `take_slots(calls)`: of the person's calls this minute, one for each of these calls while they last, taken at
    once (as rows of the audit, so that turns running side by side cannot each count the same free ones); a call
    that may run but gets none is over the rate limit. A call refused before (no such tool, invalid arguments)
    takes none.
    """
    checked = [(call, check(call, specs)) for call in calls]
    wanted = [call for call, spec in checked if spec is not None]
    slots = await take_slots(wanted) if wanted else []

    async def one(call: Call, spec: ToolSpec) -> None:
        if spec.asks_first:
            call.status = WAITING
            await notify(call)
            if not await approve(call):  # which says why when it was not the person's Deny (a timeout)
                call.status, call.error = DENIED, call.error or "the person denied this call"
                await notify(call)
                return
        call.status, call.started_ms = RUNNING, int(time.time() * 1000)
        await notify(call)
        await run_call(call, spec)
        await notify(call)

    jobs = []
    for call, spec in checked:
        if spec is not None and not slots:
            call.status, call.error = LIMITED, f"at most {settings.MCP_CALLS_PER_MINUTE} tool calls a minute"
            spec = None
        if spec is None:
            await notify(call)
            continue
        call.slot = slots.pop(0)
        jobs.append(one(call, spec))
    if jobs:
        await asyncio.gather(*jobs)


def round_messages(content: str, calls: list[Call]) -> list[dict[str, Any]]:
    """The assistant's tool-call message and the results, in OpenAI's shape, for the next request."""
    assistant = {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ],
    }
    return [assistant, *({"role": "tool", "tool_call_id": call.id, "content": call.for_model()} for call in calls)]


def stored_round_text(content: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """stored_round_messages() as one assistant message of text, for a model that takes no tools: each call and
    its result noted where the model made it."""
    parts = []
    for message in stored_round_messages(content, rounds):
        if message["role"] == "tool":
            parts.append(f"[tool result: {message['content']}]")
            continue
        if message.get("content"):
            parts.append(message["content"])
        for call in message.get("tool_calls") or ():
            parts.append(f"[tool call {call['function']['name']} {call['function']['arguments']}]")
    return {"role": "assistant", "content": "\n".join(parts)}


def stored_round_messages(content: str, rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored answer with tool rounds (Message.tool_rounds) as the messages the model saw: each round's text
    and calls, their results, then the text after the last round."""
    messages: list[dict[str, Any]] = []
    start = 0
    for entry in rounds if isinstance(rounds, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("at"), int):
            continue
        at = entry["at"]
        calls = [
            Call(id=str(c.get("id")), name=str(c.get("name")), arguments=str(c.get("arguments") or ""),
                 status=str(c.get("status")), result=str(c.get("result") or ""), error=str(c.get("error") or ""),
                 truncated=bool(c.get("truncated")))
            for c in entry.get("calls") or []
            if isinstance(c, dict)
        ]  # fmt: skip
        if calls:
            messages += round_messages(content[start:at], calls)
        start = max(start, at)
    if content[start:]:
        messages.append({"role": "assistant", "content": content[start:]})
    return messages
