"""Sending a planned answer: as an SSE stream or as one JSON body, its fault included."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from fakeupstream.chunks import API14_PROCESSING, KEEPALIVE, STAMP, ChunkEncoder, stream_events
from fakeupstream.plan import Plan
from fakeupstream.records import ConnectionState, StreamRecord
from fakeupstream.replies import respond, send_error


class UpstreamCut(Exception):
    """Raised inside the app to abort a response mid-body (the [[fault:cut]] scenario)."""


class _DropUpstreamCut(logging.Filter):
    """Drops the log record of a response ended by UpstreamCut."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, UpstreamCut)


# A deliberate cut is not an application error: keep the servers' logs quiet about it.
for _name in ("uvicorn.error", "daphne.server"):
    logging.getLogger(_name).addFilter(_DropUpstreamCut())


def _cookie(record: StreamRecord) -> list[tuple[bytes, bytes]]:
    """The bot-management cookie a CDN in front of a provider sets on API answers ([[cookie]])."""
    if "cookie" not in record.directives:
        return []
    return [(b"set-cookie", b"__cf_bm=%s; path=/; HttpOnly; SameSite=None" % secrets.token_hex(16).encode())]


async def stream_answer(
    send: Any,
    record: StreamRecord,
    state: ConnectionState,
    plan: Plan,
    watcher: asyncio.Task[None],
    *,
    keep_bytes: bool,
) -> None:
    """Stream the answer as SSE: comments, pacing and the planned fault included."""
    enc = ChunkEncoder(plan)
    headers = [(b"content-type", b"text/event-stream")]
    if plan.dialect == "infyrence":
        headers += [
            (b"cache-control", b"no-cache"),
            (b"connection", b"keep-alive"),
            (b"x-request-id", record.id.encode()),
        ]
    headers += _cookie(record)
    record.status = 200
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    api14 = plan.dialect == "api14"
    if api14:
        await send({"type": "http.response.body", "body": API14_PROCESSING, "more_body": True})
        record.comments.append(API14_PROCESSING)
    midway = (len(plan.reasoning) + len(plan.content)) // 2 if api14 and (plan.delay > 0 or plan.comment) else -1
    if plan.fault:
        midway = min(midway, (len(plan.reasoning) + plan.half) // 2)

    delay = plan.delay
    sleep = asyncio.sleep
    monotonic = time.monotonic
    sent = record.sent
    sent_at = record.sent_at
    i = 0
    for event in stream_events(enc, record.started_at, record.sent_at):
        if i:
            if delay:
                await sleep(delay)
            elif not i & 15:
                await sleep(0)  # let other streams and the disconnect watcher run
            if state.disconnected:
                break
            if plan.comment:
                await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                record.comments.append(KEEPALIVE)
            if i == midway:
                await send({"type": "http.response.body", "body": API14_PROCESSING, "more_body": True})
                record.comments.append(API14_PROCESSING)
        if plan.stamp:
            event = event.replace(STAMP, f"@{time.time():.6f} ".encode(), 1)
        await send({"type": "http.response.body", "body": event, "more_body": True})
        sent_at.append(monotonic())
        if keep_bytes:
            sent.append(event)
        i += 1
        if i == plan.hold:
            await held(record, state)
    if state.disconnected:
        return
    if plan.fault == "stall":
        await watcher  # ends when the client disconnects
        return
    state.ended = True
    if plan.fault == "cut":
        raise UpstreamCut(f"fault:cut after {len(sent)} events")
    if plan.fault is None:
        record.finish_reason = plan.finish_reason
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def held(record: StreamRecord, state: ConnectionState) -> None:
    """[[hold:N]]: nothing more until a test sets record.released (a thread's Event), or the client leaves."""
    while not state.disconnected:
        if await asyncio.to_thread(record.released.wait, 0.25):  # then a look at the client again
            return


async def whole_answer(
    send: Any, record: StreamRecord, state: ConnectionState, plan: Plan, watcher: asyncio.Task[None]
) -> None:
    """Send the answer as one chat.completion body, after as long as streaming it would take, or its fault."""
    enc = ChunkEncoder(plan)
    total_delay = plan.delay * plan.completion_tokens
    if total_delay > 0:
        await asyncio.wait({watcher}, timeout=total_delay)  # "generate", unless the client leaves
        if state.disconnected:
            return
    fault = plan.fault
    if fault == "malformed":
        fault = "eof"  # a truncated JSON body
    if fault == "midstream":
        state.ended = True
        message = "Provider disconnected" if plan.dialect == "api14" else "Upstream provider unavailable"
        return await send_error(send, plan.dialect, 502, message, rid=record.id, record=record)
    body = enc.completion(record.started_at, time.monotonic())
    headers = [(b"x-request-id", record.id.encode())] if plan.dialect == "infyrence" else []
    headers += _cookie(record)
    record.status = 200
    if fault == "eof":
        state.ended = True
        return await respond(send, 200, body[: len(body) // 2], headers)
    if fault in ("cut", "stall"):
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        if fault == "stall":
            await watcher  # silent until the client disconnects
            return
        state.ended = True
        raise UpstreamCut("fault:cut in a non-stream response")
    record.finish_reason = plan.finish_reason
    state.ended = True
    await respond(send, 200, body, headers)
