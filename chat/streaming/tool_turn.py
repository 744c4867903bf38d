"""A Generation's tool rounds: the model's calls shown as they stream, run, approved, saved and metered.

A mixin of chat/streaming/generation.py's Generation, which has what these read: its job, its
state, its lock and flush, its text as a whole (_whole) and its usage row. The calls themselves
run in chat/streaming/tool_loop.py; their database side is chat/streaming/tool_rounds.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from django.conf import settings

from chat.models import Message, Usage
from chat.runtime import db_threads, process_loops
from chat.streaming import tool_catalog, tool_loop, tool_rounds, upstream
from chat.streaming.frames import MAX_FRAME_CHARS, frame
from chat.streaming.providers import stream_state
from chat.streaming.relay import prompt_chars

log = logging.getLogger(__name__)


class ToolTurn:
    """The tool rounds of one reply's turn (Generation's)."""

    def unrun_tool_calls(self) -> list[dict[str, Any]]:
        """The model's last calls if no round ran them (a model without tools, the round limit): shown as asked.
        A stop during a round finds them in the round, its row settled: not shown twice."""
        return self.state.tool_call_list if self.row_open else []

    def public_rounds(self) -> list[dict[str, Any]]:
        return [{"at": entry["at"], "calls": [call.public() for call in entry["calls"]]} for entry in self.rounds]

    async def _send_tool(self, **fields: Any) -> None:
        text = frame(conversation=self.job.conversation_id, message=self.job.message_id, **fields)
        # In order with the deltas, never waiting on Redis (chat/runtime/channel_layers.py).
        self.layer.post_to_group(self.group, {"type": "chat.tool", "message": self.job.message_id, "text": text})

    async def _send_tool_arguments(self) -> None:
        """The tool calls' names and arguments as they stream (only when they grew)."""
        calls = self.state.tool_call_list
        sign = sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls)
        if sign == self._tool_sign:
            return
        self._tool_sign = sign
        await self._send_tool(type="tool_arguments", round=len(self.rounds), calls=[
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"][:MAX_FRAME_CHARS]}
            for c in calls
        ])  # fmt: skip

    async def _notify_call(self, call: tool_loop.Call) -> None:
        if call.status == tool_loop.WAITING:
            # Ready for the answer before the person is asked: an Approve that arrives while the rounds
            # are being saved, below, is kept for _approve rather than dropped (handle).
            self._approvals.setdefault(call.id, asyncio.get_running_loop().create_future())
        await self._send_tool(type="tool_call", round=len(self.rounds) - 1, call=call.public())
        if call.status not in (tool_loop.RUNNING,):
            try:
                await db_threads.run(tool_rounds.save_rounds)(self.job.message_id, self.public_rounds())
            except Exception as exc:  # the final save writes them again
                log.warning("generation %s: cannot save the tool rounds (%s)", self.job.message_id, exc)

    async def _approve(self, call: tool_loop.Call) -> bool:
        """The person's Approve (True) or Deny, or a denial after MCP_APPROVAL_SECONDS; an Approve of a tool staff
        switched off (or took from the person) while it waited is not one."""
        future = self._approvals.setdefault(call.id, asyncio.get_running_loop().create_future())
        try:
            async with asyncio.timeout(settings.MCP_APPROVAL_SECONDS):
                approved = await future
            if approved and call.name not in await self._offered_now():
                call.error = "the tool was switched off while it waited for approval"
                return False
            return approved
        except TimeoutError:
            call.error = f"no answer from the person within {settings.MCP_APPROVAL_SECONDS:g} s"
            return False
        finally:
            self._approvals.pop(call.id, None)

    async def _offered_now(self) -> set[str]:
        """The names of the turn's tools still offered to the person (staff may take one away mid-turn)."""
        return await db_threads.run(tool_catalog.still_offered)(self.job.user_id, self.job.tools)

    async def _tool_round(self) -> None:
        """Settle this round's stream, run its calls, and open the next request with their results, metered."""
        job, loop = self.job, asyncio.get_running_loop()
        state = self.state
        async with self._lock:
            await self._flush()
            content, reasoning = self._whole(state.text, state.reasoning_text)
            calls = tool_loop.calls_of(state.tool_call_list)
            self.rounds.append({"at": len(content), "calls": calls})
        state.ended_at = loop.time()
        usage = state.metering(self.prompt_chars, loop.time())
        ending = Usage.ending(state, Message.Status.COMPLETE, "", usage)
        written = await db_threads.run(tool_rounds.settle_round)(
            self.usage_id, self.usage_key, ending, job.message_id, content, reasoning, self.public_rounds()
        )
        self.row_open = False
        self.earlier_usage.append({**usage, "cost": written.get("cost")})
        offered = await self._offered_now()  # a tool taken away since the turn began is no longer run
        specs = {spec.name: spec for spec in job.tools if spec.name in offered}

        async def take_slots(wanted: list[tool_loop.Call]) -> list[int]:
            return await db_threads.run(tool_rounds.take_slots)(job.user_id, job.conversation_id, job.message_id,
                                                                wanted)  # fmt: skip

        try:
            await tool_loop.run_round(calls, specs, take_slots, self._notify_call, self._approve)
        finally:
            for call in calls:
                if call.status in (*tool_loop.UNFINISHED, tool_loop.CANCELLED):
                    call.status, call.error = tool_loop.CANCELLED, tool_loop.cancelled_because()
                    await self._send_tool(type="tool_call", round=len(self.rounds) - 1, call=call.public())
            await db_threads.run(tool_rounds.record)(job.user_id, job.conversation_id, job.message_id, calls)
        messages = [*self.payload["messages"], *tool_loop.round_messages(state.text, calls)]
        chars = prompt_chars(messages)
        try:
            self.usage_id, self.usage_key = await db_threads.run(tool_rounds.open_round)(
                job.user_id, job.provider_name, job.model, job.message_id, upstream.estimate_tokens(chars),
                int(self.payload.get("max_tokens") or settings.UPSTREAM_MAX_TOKENS), process_loops.worker_id(),
            )  # fmt: skip
        except Exception as exc:
            detail = getattr(exc, "detail", None) or str(exc)
            raise upstream.UpstreamError("next_round", detail) from None
        async with self._lock:
            self.row_open = True
            self.prefix = (content, reasoning)
            self.payload = {**self.payload, "messages": messages}
            self.prompt_chars = chars
            self.state = stream_state(loop.time(), job.api_key)
            self._sent = (0, 0)
            self._tool_sign = 0
