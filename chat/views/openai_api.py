"""/v1/chat/completions for the team's personal tokens: relayed as the upstream sends it, or whole.

Its start, its errors and its metering are the ones every /v1 request shares (chat/views/metered_api.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chat.streaming import upstream
from chat.streaming.relay import DONE_EVENT, Relay, parse_request, running, upstream_body
from chat.views.metered_api import (
    MeteredRequest,
    SSEResponse,
    already_logged,
    copy_headers,
    disconnect_reason,
    metered_post,
    open_upstream,
    unusable_answer,
)

log = logging.getLogger(__name__)


@csrf_exempt
async def chat_completions(request):
    meter, refused = await metered_post(request, MeteredRequest, parse_chat_request)
    if refused is not None:
        return refused
    body = meter.body
    payload, wants_usage = upstream_body(body, meter.entry.model, settings.UPSTREAM_MAX_TOKENS)
    if body.get("stream"):
        flow = getattr(request, "scope", {}).get("extensions", {}).get("chatsite.flow")
        return await stream_completion(meter, payload, wants_usage, flow)
    return await complete(meter, payload)


def parse_chat_request(raw: bytes) -> dict:
    """A chat completions request body, checked; raises RequestError."""
    return parse_request(
        raw, max_tokens=settings.MAX_TOKENS_LIMIT, max_n=settings.API_MAX_N,
        max_image_bytes=settings.ATTACHMENT_MAX_FILE_BYTES,
    )  # fmt: skip


async def stream_completion(meter: MeteredRequest, payload: dict, wants_usage: bool, flow=None) -> HttpResponse:
    """Relay the upstream's stream; `flow` (chatsite.server's scope extension) says if the server cut the client."""
    stream, cleanup, refused = await open_upstream(meter, payload)
    if refused is not None:
        return refused
    relay = Relay(stream, meter.state, forward_usage=wants_usage, heartbeat=settings.API_HEARTBEAT_SECONDS)
    # Its progress is written on the row (process_loops.py); a deactivation or a revocation ends it.
    running.add(relay, meter.token.user_id, meter.usage_id, token=meter.token.pk)

    async def body():
        try:
            async for data in relay:
                if data.endswith(DONE_EVENT):
                    # The usage row is stored before the client hears [DONE], as a page hears `done`;
                    # a busy database holds [DONE] back this long at most (the row is written later).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(settings.API_DB_WAIT_SECONDS):
                            await meter.record(relay.status, relay.error)  # shielded: a timeout only stops waiting
                yield data
            await meter.record(relay.status, relay.error)  # (already, unless the stream ended otherwise)
        finally:
            # Unfinished: the client went away (cancelled while awaiting, or closed at a yield
            # or in a send held by flow control). Meter it with the reason before the cleanup
            # meters it as a plain disconnect, and close the upstream.
            try:
                if not meter.recorded and relay.interruption is not None:
                    await meter.record(relay.status, relay.error)  # ended at shutdown, then cut unread
                elif not meter.recorded:
                    await relay.drain()  # the usage the upstream reports, if it had finished
                    await meter.record("stopped", disconnect_reason(flow))
            finally:
                await cleanup.aclose()

    response = SSEResponse(body(), cleanup, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    copy_headers(stream.response.headers, response)
    return response


async def complete(meter: MeteredRequest, payload: dict) -> HttpResponse:
    answer, refused = await meter.ask_whole(payload)
    if refused is not None:
        return refused
    status, error = "complete", ""
    # The provider's key echoed in an answer never reaches the client (nor a stored conversation).
    content = upstream.redact_secrets(answer.content, meter.state.secrets)
    try:
        meter.state.feed_chunk(upstream.parse_chunk(content), asyncio.get_running_loop().time())
        status = meter.state.outcome()
        error = meter.state.error_message() if status == "failed" else ""
        meter.state.request_id = answer.headers.get("x-request-id", "")
    except upstream.UpstreamError as exc:
        status, error = "failed", str(exc)
    await meter.record(status, error)
    if status == "failed":
        return unusable_answer(error, meter.entry.provider.name)
    response = HttpResponse(
        content, status=answer.status_code, content_type=answer.headers.get("content-type", "application/json")
    )
    copy_headers(answer.headers, response)
    if answer.status_code >= 500:
        log.warning("/v1: provider %s answered %d", meter.entry.provider.name, answer.status_code)
        already_logged(response)
    return response
