"""`POST /v1/responses`: OpenAI's Responses API on top of the providers' chat completions.

The request is checked and turned into a chat completions request (chat/lib/responses_request.py),
then goes the way /v1/chat/completions goes (chat/views/metered_api.py): the same token, model
resolution, limits, budget and one usage row per upstream request (the one metered start), the
same upstream read loop and relay (heartbeats, back-pressure, shutdown); only what the client
is sent differs: the chunks become Responses events (chat/lib/responses_events.py). A response
is stored for its owner (`store`, on by default) once it ends, before the client hears the end,
so a follow-up naming it in `previous_response_id` needs only its new input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chat.lib.json_depth import without_nul
from chat.lib.model_params import ParamError, check_request
from chat.lib.openai_errors import error_body
from chat.lib.responses_events import ResponsesTranslator, encode, usage_of
from chat.lib.responses_request import ITEM_ID, ResponsesRequest, chat_messages, parse_responses_request
from chat.models import StoredResponse
from chat.models.responses import BrokenChain
from chat.streaming import upstream
from chat.streaming.relay import DONE_EVENT, Relay, RequestError, running, upstream_body
from chat.views.metered_api import (
    MeteredRequest,
    Refused,
    SSEResponse,
    copy_headers,
    disconnect_reason,
    metered_post,
    open_upstream,
    unusable_answer,
)

log = logging.getLogger(__name__)


def not_found(message: str, param: str | None) -> Refused:
    return Refused(
        HttpResponse(
            error_body(message, "invalid_request_error", "not_found", param),
            status=404,
            content_type="application/json",
        )
    )


class MeteredResponse(MeteredRequest):
    """A /v1/responses request, metered as a chat completion; its stored response written with its usage."""

    def __init__(self, request: ResponsesRequest | None) -> None:
        # Until the token is known, the body holds the new input's messages: enough to find the model and check images.
        body = None if request is None else {"model": request.model, "messages": chat_messages(None, request.items)}
        super().__init__(body)
        self.request = request
        self.items: list[dict[str, Any]] = []  # the whole input: the previous responses' items, then this one's
        self.own_items: list[dict[str, Any]] = []  # this one's: what its stored row keeps as its input
        self.translator: ResponsesTranslator | None = None

    def begin(self) -> None:
        """The previous response and referenced items brought back (the person's own only), then the metered start."""
        request = self.request
        history: list[dict[str, Any]] = []
        mine = StoredResponse.objects.owned_by(self.token.user)
        if request.previous_response_id:
            try:
                found = mine.conversation(request.previous_response_id, settings.RESPONSES_MAX_HISTORY_BYTES)
            except BrokenChain as exc:
                error = error_body(
                    str(exc), "invalid_request_error", "previous_response_unusable", "previous_response_id"
                )
                raise Refused(HttpResponse(error, status=400, content_type="application/json")) from None
            if found is None:
                raise not_found(
                    f"Previous response with id '{request.previous_response_id}' not found.", "previous_response_id"
                )
            history = found
        stored: dict[str, list[dict[str, Any]]] = {}
        items = []
        for item in request.items:
            if item["type"] == "item_reference":
                response_id = "resp_" + ITEM_ID.match(item["id"]).group(1)
                if response_id not in stored:
                    stored[response_id] = mine.filter(pk=response_id).values_list("output", flat=True).first() or []
                wanted = item["id"]
                item = next((found for found in stored[response_id] if found.get("id") == wanted), None)
                if item is None:
                    raise not_found(f"Item with id '{wanted}' not found.", "input")
            items.append(item)
        self.own_items = items
        self.items = history + items
        try:
            self.body = check_request(
                request.chat_body(self.items),
                max_tokens=settings.MAX_TOKENS_LIMIT,
                max_n=1,
                max_image_bytes=settings.ATTACHMENT_MAX_FILE_BYTES,
            )
        except ParamError as exc:
            error = RequestError(400, exc.message, code=exc.code, param=exc.param or None)
            raise Refused(HttpResponse(error.body(), status=400, content_type="application/json")) from None
        super().begin()

    def _save(self, status: str, error: str, usage: dict) -> None:
        super()._save(status, error, usage)
        if self.request.store and self.translator is not None:
            ended = self.translator.status or "failed"
            output = upstream.redact_secrets(orjson.dumps(self.translator.output), self.state.secrets)
            output = orjson.loads(without_nul(output))
            StoredResponse.objects.create(
                id=self.translator.response_id,
                owner=self.token.user,
                model=self.request.model,
                status=ended,
                input=self.own_items,
                output=output,
                previous=self.request.previous_response_id or "",
            )

    def usage(self) -> dict[str, Any]:
        """The usage so far in the Responses API's names, as the usage row will record it."""
        return usage_of(self.state.metering(self.prompt_size, asyncio.get_running_loop().time()))

    def start_translator(self) -> ResponsesTranslator:
        request = self.request
        echo = {
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "metadata": request.metadata,
            "model": request.model,
            "parallel_tool_calls": request.params.get("parallel_tool_calls", True),
            "previous_response_id": request.previous_response_id,
            "reasoning": {"effort": request.reasoning.get("effort"), "summary": request.reasoning.get("summary")},
            "store": request.store,
            "temperature": request.params.get("temperature", 1.0),
            "text": {"format": request.text_format},
            "tool_choice": request.tool_choice,
            "tools": [{"strict": None, "description": None, "parameters": None, **tool} for tool in request.tools],
            "top_p": request.params.get("top_p", 1.0),
            "truncation": "disabled",
            "user": request.params.get("user"),
        }
        self.translator = ResponsesTranslator("resp_" + secrets.token_hex(12), int(time.time()), echo)
        return self.translator


class ResponsesRelay(Relay):
    """The chat completions relay, sending each chunk's Responses events instead of the chunk."""

    def __init__(self, stream, state, translator: ResponsesTranslator, *, heartbeat: float) -> None:
        super().__init__(stream, state, forward_usage=False, heartbeat=heartbeat)
        self.translator = translator

    def translator_bytes(self, events: list[dict[str, Any]]) -> bytes:
        """Events as SSE, the provider's key (were the upstream to echo it) redacted, in the text done events repeat."""
        return upstream.redact_secrets(b"".join(map(encode, events)), self.state.secrets)

    def _client_bytes(self, event, chunk):
        # Comments, [DONE] and error chunks are not passed on: the end (completed or failed) is said once, after it.
        if chunk is None or "error" in chunk:
            return None
        events = self.translator.feed(chunk)
        return self.translator_bytes(events) if events else None


def parse_responses_body(raw: bytes) -> ResponsesRequest:
    """A Responses request body, checked; raises RequestError."""
    try:
        # Its input is stored (StoredResponse), and stored text never holds NUL.
        return parse_responses_request(orjson.loads(without_nul(raw)), max_tokens=settings.MAX_TOKENS_LIMIT)
    except orjson.JSONDecodeError:
        raise RequestError(400, "The request body is not valid JSON.") from None
    except ParamError as exc:
        raise RequestError(400, exc.message, code=exc.code, param=exc.param or None) from None


@csrf_exempt
async def responses(request):
    meter, refused = await metered_post(request, MeteredResponse, parse_responses_body)
    if refused is not None:
        return refused
    payload, _ = upstream_body(meter.body, meter.entry.model, settings.UPSTREAM_MAX_TOKENS)
    meter.start_translator()
    if meter.request.stream:
        flow = getattr(request, "scope", {}).get("extensions", {}).get("chatsite.flow")
        return await stream_response(meter, payload, flow)
    return await whole_response(meter, payload)


async def stream_response(meter: MeteredResponse, payload: dict, flow=None) -> HttpResponse:
    """The upstream's stream relayed as Responses events; the end said once the usage and the response are stored."""
    stream, cleanup, refused = await open_upstream(meter, payload)
    if refused is not None:
        return refused
    translator = meter.translator
    relay = ResponsesRelay(stream, meter.state, translator, heartbeat=settings.API_HEARTBEAT_SECONDS)
    # Its progress is written on the row (process_loops.py); a deactivation or a revocation ends it.
    running.add(relay, meter.token.user_id, meter.usage_id, token=meter.token.pk)

    async def body():
        try:
            yield relay.translator_bytes(translator.start())
            async for data in relay:
                if data.endswith(DONE_EVENT):
                    continue  # the relay's own end of a broken stream: said as response.failed below
                yield data
            ending = translator.finish(relay.status, relay.error, meter.usage())
            # Stored before the client hears the end, as on /v1/chat/completions; a busy database
            # holds it back this long at most.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.API_DB_WAIT_SECONDS):
                    await meter.record(relay.status, relay.error)
            yield relay.translator_bytes(ending)
        finally:
            try:
                if not meter.recorded and relay.interruption is not None:
                    await meter.record(relay.status, relay.error)
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


async def whole_response(meter: MeteredResponse, payload: dict) -> HttpResponse:
    """The upstream's whole answer as one response object."""
    answer, refused = await meter.ask_whole(payload)
    if refused is not None:
        return refused
    status, error = "complete", ""
    try:
        # The provider's key echoed in an answer never reaches the client (nor a stored response).
        chunk = upstream.parse_chunk(upstream.redact_secrets(answer.content, meter.state.secrets))
        meter.state.feed_chunk(chunk, asyncio.get_running_loop().time())
        meter.translator.feed(chunk)
        status = meter.state.outcome()
        error = meter.state.error_message() if status == "failed" else ""
        meter.state.request_id = answer.headers.get("x-request-id", "")
    except upstream.UpstreamError as exc:
        status, error = "failed", str(exc)
    ending = meter.translator.finish(status, error, meter.usage())
    await meter.record(status, error)
    if status == "failed":
        return unusable_answer(error, meter.entry.provider.name)
    response = HttpResponse(orjson.dumps(ending[-1]["response"]), content_type="application/json")
    copy_headers(answer.headers, response)
    return response
