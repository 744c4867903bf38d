"""Generation tasks: one upstream stream per assistant reply, independent of any websocket.

A task reads the upstream, coalesces deltas for at most CHAT_COALESCE_MS before one
channel-layer message carries them to the sockets watching the conversation, and
saves the text every CHAT_SAVE_INTERVAL seconds. A failed save is retried with
backoff while the stream goes on (the text stays in memory); the final save is
retried for up to CHAT_FINAL_SAVE_SECONDS, and `done` goes out only once it landed.
Stop and snapshot requests reach a running stream through its process's control
listener (chat/runtime/process_loops.py), which calls Generation.handle().
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.utils.translation import gettext as _

from chat.models import Message
from chat.streaming import upstream
from chat.streaming.answer_saves import UNSAVED_ERROR, AnswerSaves
from chat.streaming.frames import (
    conversation_group,
    frame,
    merge_deltas,
    send_done,
    snapshot_frames,
    split_text,
)
from chat.streaming.providers import open_provider_stream, stream_state
from chat.streaming.tool_catalog import ToolSpec
from chat.streaming.tool_turn import ToolTurn

log = logging.getLogger(__name__)

# Between one stream's thinking and the next's in one answer (tool rounds, a continue): a blank line.
THINKING_APART = "\n\n"

_tasks: set[asyncio.Task] = set()
# The generation tasks alone (a graceful shutdown waits for these, not for control handlers).
_streams: set[asyncio.Task] = set()
# message id -> the generation streaming it in this process
_running: dict[int, Generation] = {}


def _nothing_after(conversation_id: int, message_id: int) -> None:
    return None


# What runs in the background after a complete answer: ChatConfig.ready() connects the titles to it.
after_complete: Callable[[int, int], Coroutine[Any, Any, Any] | None] = _nothing_after


@dataclass(frozen=True)
class Job:
    """Everything a generation needs, read from the database before it starts."""

    conversation_id: int
    message_id: int
    user_message_id: int
    usage_id: int
    title: str
    provider_name: str
    base_url: str
    api_key: str
    model: str
    payload: dict[str, Any]
    prompt_chars: int
    max_connections: int = 1  # the provider's connections per process (chat/metering/limits.py)
    user_id: int | None = None  # the conversation's owner, so a deactivation can stop their streams
    # The usage row's price key, so the final save need not read back the row it wrote.
    usage_key: dict[str, Any] | None = None
    # A continued answer's (content, reasoning) so far: this stream's text is appended to them.
    prefix: tuple[str, str] | None = None
    # The MCP tools this turn may call (chat/streaming/tool_catalog.py), sent upstream as `tools`.
    tools: tuple[ToolSpec, ...] = ()


def track(task: asyncio.Task) -> asyncio.Task:
    """Keep a task of this module's machinery referenced until it ends (wait_all() waits for it)."""
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return task


def running_generation(message_id: int | None) -> Generation | None:
    """The generation streaming this reply in this process, if any."""
    return _running.get(message_id)


def start(job: Job) -> asyncio.Task:
    """Run a generation in a task of its own; it outlives the socket that asked for it."""
    generation = _running[job.message_id] = Generation(job)  # before any control request can arrive
    task = track(asyncio.create_task(generation.run(), name=f"generation-{job.message_id}"))
    _streams.add(task)
    task.add_done_callback(_streams.discard)
    return task


async def wait_all() -> None:
    """Wait for every running generation of this process (tests, shutdown)."""
    while _tasks:
        await asyncio.gather(*list(_tasks), return_exceptions=True)


class Generation(AnswerSaves, ToolTurn):
    """One reply's stream: read upstream, sent to the sockets as deltas, saved (AnswerSaves), with its tool rounds
    (ToolTurn)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.layer = get_channel_layer()
        self.group = conversation_group(job.conversation_id)
        self.window = settings.CHAT_COALESCE_MS / 1000
        loop = asyncio.get_running_loop()
        self.state = stream_state(loop.time(), job.api_key)
        self.state.completion_cap = job.payload.get("max_tokens")
        self.seq = 0
        self.thinking_ms: int | None = None  # set when the stream ends
        # How many of state.content's and state.reasoning's pieces the deltas sent so far carried.
        self._sent = (0, 0)
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._last_flush = 0.0
        self._reader: asyncio.Task | None = None
        # Tool rounds (chat/streaming/tool_loop.py): each round's stream is metered on a row of its own;
        # the answer's text so far is the prefix the next round's text is appended to.
        self.prefix = job.prefix
        self.payload = job.payload
        self.prompt_chars = job.prompt_chars
        self.usage_id, self.usage_key = job.usage_id, job.usage_key
        self.row_open = True  # the current usage row is not settled yet
        self.rounds: list[dict[str, Any]] = []  # {"at": offset in the content, "calls": [tool_loop.Call]}
        self.earlier_usage: list[dict[str, Any]] = []
        self.note = ""  # said under a complete answer (the round limit)
        self._approvals: dict[str, asyncio.Future] = {}
        self._tool_sign = 0

    async def run(self) -> None:
        job = self.job
        _running[job.message_id] = self
        try:
            await self._run()
        finally:
            _running.pop(job.message_id, None)

    async def _run(self) -> None:
        job = self.job
        self.layer.post_to_group(
            self.group,
            {
                "type": "chat.started",
                "message": job.message_id,
                "conversation": job.conversation_id,
                "text": frame(
                    type="started",
                    conversation=job.conversation_id,
                    message=job.message_id,
                    user_message=job.user_message_id,
                    model=job.model,
                    provider=job.provider_name,
                    title=job.title,
                    continued=job.prefix is not None,
                ),
            },
        )
        helpers = [
            asyncio.create_task(self._flush_loop()),
            asyncio.create_task(self._save_loop()),
        ]
        self._reader = asyncio.create_task(self._turn())
        status, error, cancelled = Message.Status.FAILED, "", False
        try:
            await self._reader
            status = self.state.outcome()
            if status == Message.Status.COMPLETE:
                error = self.note
            elif status == Message.Status.FAILED:
                error = _mid_answer(self.state)
            elif status == Message.Status.INTERRUPTED:
                error = _("The upstream closed the stream before the answer was finished.")
        except upstream.UpstreamError as exc:
            status, error = self.state.outcome(exc), _describe(exc)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            cancelled = current is not None and current.cancelling() > 0
            if cancelled:  # the process is shutting down, not a stop
                status, error = Message.Status.INTERRUPTED, _("The server stopped while this answer was streaming.")
            else:
                status = Message.Status.STOPPED
        except Exception:
            log.exception("generation %s failed", job.message_id)
            error = _("Internal error while streaming; the partial answer was kept.")
        finally:
            self.state.ended_at = asyncio.get_running_loop().time()
            async with self._lock:
                for helper in helpers:
                    helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._finish(status, error)
        if cancelled:
            raise asyncio.CancelledError

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()

    async def _turn(self) -> None:
        """The upstream read, then, while the model asks for tools, a round of calls and a read again."""
        await self._read()
        while self.job.tools and self.state.tool_calls and self.state.outcome() == Message.Status.COMPLETE:
            if len(self.rounds) >= settings.MCP_MAX_ROUNDS:
                self.note = _("The model asked for more tool calls than a turn allows (%(rounds)s rounds).") % {
                    "rounds": settings.MCP_MAX_ROUNDS
                }
                return
            await self._tool_round()
            await self._read()

    async def _read(self) -> None:
        job = self.job
        payload = self.payload
        if job.tools and "tools" not in payload:
            payload = self.payload = {**payload, "tools": [spec.as_openai() for spec in job.tools]}
        async with open_provider_stream(
            job.provider_name, job.base_url, job.api_key, job.max_connections, payload, self.state
        ) as stream:
            # The text gathers in the state; the flush loop sends what its last delta did not carry.
            await stream.read(self.state, on_text=self._dirty.set)

    # --- to the sockets -------------------------------------------------------

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # The window first, then the text: under a steady stream the text is there when
            # the window ends, so a frame costs the loop one wake-up, not two (on the text,
            # then on the window). After a silence the first text still goes out at once.
            wait = self._last_flush + self.window - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await self._dirty.wait()
            async with self._lock:
                await self._flush()

    async def _flush(self) -> None:
        """Send what arrived since the last flush as one delta (caller holds the lock)."""
        self._dirty.clear()
        if self.job.tools and self.state.tool_calls:
            await self._send_tool_arguments()
        state, (sent_content, sent_reasoning) = self.state, self._sent
        if len(state.content) == sent_content and len(state.reasoning) == sent_reasoning:
            return
        content, reasoning = "".join(state.content[sent_content:]), "".join(state.reasoning[sent_reasoning:])
        if reasoning and not sent_reasoning:
            reasoning = self._apart(reasoning)
        self._sent = (len(state.content), len(state.reasoning))
        self._last_flush = asyncio.get_running_loop().time()
        # Nearly always one part; a huge upstream chunk becomes several deltas, each under the frame limit.
        for reasoning_part, content_part in split_text(reasoning, content):
            self.seq += 1
            fields: dict[str, Any] = {"type": "delta", "message": self.job.message_id, "seq": self.seq}
            if content_part:
                fields["content"] = content_part
            if reasoning_part:
                fields["reasoning"] = reasoning_part
            await self._send_delta(
                {"type": "chat.delta", "message": self.job.message_id, "seq": self.seq, "text": frame(**fields),
                 "conversation": self.job.conversation_id}
            )  # fmt: skip

    async def _send_delta(self, message: dict) -> None:
        """To the group's sockets without waiting on Redis (chat/runtime/channel_layers.py).

        This process's sockets get it at once; other processes' through the layer's sender, which
        reads the group's members at most once a second and, while Redis is away, keeps the
        deltas (merged by merge_deltas) until it is back. A socket that joins while the reply
        streams asks for a snapshot first (handle()), which makes the sender read the members
        again, so it misses no delta after the snapshot's; one that left may get a delta or two
        more, which the consumer drops (ChatConsumer.chat_delta).
        """
        self.layer.post_to_group(self.group, message, merge_deltas)

    def _flushed_text(self) -> tuple[str, str]:
        """The text up to the last delta sent: what arrived during the flush's awaits is still pending
        and goes out in the next delta, so a snapshot must not carry it too."""
        sent_content, sent_reasoning = self._sent
        return self._whole("".join(self.state.content[:sent_content]), "".join(self.state.reasoning[:sent_reasoning]))

    def _whole(self, content: str, reasoning: str) -> tuple[str, str]:
        """The answer's text: a continued answer's (or the earlier rounds') text, then this stream's."""
        if self.prefix is None:
            return content, reasoning
        return self.prefix[0] + content, self.prefix[1] + (self._apart(reasoning) if reasoning else "")

    def _apart(self, reasoning: str) -> str:
        """This stream's first thinking, set apart from the earlier rounds' (or the continued answer's)."""
        return THINKING_APART + reasoning if self.prefix is not None and self.prefix[1] else reasoning

    async def handle(self, request: dict) -> None:
        """A control request from a socket on any process: stop, or a snapshot for an attaching socket."""
        if request["type"] == "generation.stop":
            self.stop()
        elif request["type"] == "generation.approve":
            future = self._approvals.get(str(request.get("call")))
            if future is not None and not future.done():
                future.set_result(bool(request.get("approve")))
        elif request["type"] == "generation.snapshot":
            async with self._lock:
                # The asking socket has joined the group: its members are read again for what follows.
                self.layer.forget_members(self.group)
                await self._flush()
                content, reasoning = self._flushed_text()
                first, *parts = snapshot_frames(
                    self.job.conversation_id,
                    self.job.message_id,
                    content,
                    reasoning,
                    Message.Status.STREAMING,
                    self.job.model,
                    self.seq,
                    self.public_rounds(),
                )
                # After the deltas it includes, in order, whatever Redis does meanwhile.
                self.layer.post(
                    request["reply_to"],
                    # `parts`: the snapshot's continuation frames, sent right after `text`.
                    {"type": "chat.snapshot", "message": self.job.message_id, "seq": self.seq, "text": first,
                     "parts": parts},
                )  # fmt: skip

    # --- to the database ------------------------------------------------------

    async def _finish(self, status: str, error: str) -> None:
        """Store the text and the usage whatever the ending, then tell the sockets."""
        job, state = self.job, self.state
        usage = state.metering(self.prompt_chars, asyncio.get_running_loop().time())
        self.thinking_ms = state.thinking_ms(asyncio.get_running_loop().time())
        async with self._lock:
            await self._flush()
        if not await self._store_final(status, error, usage):
            # The answer is not stored: the socket must not be told it is.
            status, error = Message.Status.INTERRUPTED, _(UNSAVED_ERROR)
        frame_usage = {**usage, "cost": float(usage["cost"]) if usage["cost"] is not None else None}
        if self.earlier_usage:
            frame_usage = _added_up([*self.earlier_usage, usage] if self.row_open else self.earlier_usage)
        await send_done(
            job.conversation_id, job.message_id, status, state.finish_reason, frame_usage, error,
            thinking_ms=self.thinking_ms, tool_calls=self.unrun_tool_calls(),
        )  # fmt: skip
        if status == Message.Status.COMPLETE:
            # After `done`, never before it: a title is written in the background (chat/actions/titles.py).
            follow_up = after_complete(job.conversation_id, job.message_id)
            if follow_up is not None:
                track(asyncio.create_task(follow_up, name=f"title-{job.message_id}"))


def _added_up(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds' usage as one, for the `done` frame."""
    costs = [u["cost"] for u in usages if u.get("cost") is not None]
    names = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "total_tokens", "duration_ms")
    total = {name: sum(u.get(name) or 0 for u in usages) for name in names}
    last = usages[-1]
    return {**last, **total, "cost": float(sum(costs)) if costs else None, "ttft_ms": usages[0].get("ttft_ms"),
            "estimated": any(u.get("estimated") for u in usages), "requests": len(usages)}  # fmt: skip


def _mid_answer(state: upstream.StreamState) -> str:
    """What the user reads under an answer the upstream ended with an error of its own: its code and words."""
    if state.error is None:  # finish_reason "error" alone
        return _("The upstream ended the answer with an error; the text so far was kept.")
    code = upstream.describe_error(state.error)[1]
    values = {"code": f" ({code})" if code else "", "message": state.error_message().rstrip(" .")}
    sentence = _("The upstream reported an error during the answer%(code)s: %(message)s; the text so far was kept.")
    return sentence % values


def _describe(exc: upstream.UpstreamError) -> str:
    """What the user reads under a failed answer (the upstream's own words stay as they came)."""
    values = {"message": exc.message.rstrip(" .")}  # its own full stop, where ours ends the sentence
    if exc.kind == "http":
        code = f" {exc.code}" if exc.code and exc.code != str(exc.status) else ""
        values["status"], values["message"] = f"{exc.status}{code}", exc.message
        text = _("The upstream refused the request (%(status)s): %(message)s") % values
        if exc.retry_after and "retry" not in exc.message.lower():  # the upstream may have said so already
            text = text if text.endswith((".", "!", "?", "…", "。")) else text + "."
            text += " " + _("Retry after %(seconds)s s.") % {"seconds": exc.retry_after}
        return text
    if exc.kind == "cut":
        return _("The upstream connection broke off before the answer was finished.")
    if exc.kind == "timeout":
        return _("The upstream timed out: %(message)s.") % values
    if exc.kind == "connect":
        return _("Cannot reach the upstream: %(message)s.") % values
    if exc.kind == "busy":
        return _("Cannot start the answer: %(message)s.") % values
    if exc.kind == "next_round":  # the answer had started: its tool calls ran, the model's next turn did not
        return _("The answer could not go on after its tool calls: %(message)s.") % values
    if exc.kind == "too_large":
        return _("The answer was stopped because %(message)s; the text so far was kept.") % values
    return _("The upstream sent something unreadable (%(message)s); the text so far was kept.") % values


# --- shutdown -----------------------------------------------------------------


def stop_user(user_id: int) -> int:
    """Stop this process's generations of one user (deactivated); how many there were."""
    stopping = [generation for generation in _running.values() if generation.job.user_id == user_id]
    for generation in stopping:
        generation.stop()
    return len(stopping)


def running_messages() -> list[int]:
    """The replies this process is streaming."""
    return list(_running)


def running_users() -> set[int]:
    """Whose generations this process is running."""
    return {generation.job.user_id for generation in _running.values() if generation.job.user_id is not None}


def running() -> list[asyncio.Task]:
    """The generations this process is running."""
    return list(_streams)


async def shutdown() -> None:
    """End every running generation as interrupted: text, usage and the `done` frames saved and sent."""
    streams = list(_streams)
    for task in streams:
        task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
