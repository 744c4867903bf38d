"""`POST /v1/embeddings`: passed to the provider that serves the model, metered, limited and budgeted as chat is.

The request takes the same one metered start as a chat completion (chat/views/metered_api.py's
start_metered, then chat/metering/metered_streams.py): the token, the model against the
person's access, the limits, the budget's reservation (the prompt's estimate: an embedding
produces no completion tokens) and a usage row, before anything goes upstream. The answer is
passed on as the upstream sent it, and its usage (prompt tokens, a reported cost, else the
price in force) settles the row.
"""

from __future__ import annotations

import asyncio

import orjson
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from chat.lib.embedding_params import check_embeddings_request, input_chars
from chat.lib.model_params import ParamError
from chat.streaming import upstream
from chat.streaming.catalog import CatalogEntry
from chat.streaming.relay import RequestError
from chat.views.metered_api import MeteredRequest, copy_headers, metered_post, unusable_answer


def parse_embeddings(raw: bytes) -> dict:
    """The client's request, checked (chat/lib/embedding_params.py), or RequestError with OpenAI's error fields."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise RequestError(400, "The request body is not valid JSON.") from None
    try:
        return check_embeddings_request(body)
    except ParamError as exc:
        raise RequestError(400, exc.message, code=exc.code, param=exc.param or None) from None


class MeteredEmbedding(MeteredRequest):
    """An embeddings request, metered as a chat completion is; never stored as a conversation."""

    def refusal(self, entry: CatalogEntry) -> HttpResponse | None:
        return None

    def prompt_chars(self) -> int:
        return input_chars(self.body["input"])

    def max_tokens(self) -> int:
        return 0  # an embedding's cost is its prompt

    def _store_conversation(self, status: str, error: str) -> None:
        return None


@csrf_exempt
async def embeddings(request):
    meter, refused = await metered_post(request, MeteredEmbedding, parse_embeddings)
    if refused is not None:
        return refused
    payload = {**meter.body, "model": meter.entry.model}
    answer, refused = await meter.ask_whole(payload, path="embeddings")
    if refused is not None:
        return refused
    status, error = "complete", ""
    try:
        reply = upstream.parse_chunk(answer.content)
        meter.state.feed_chunk(reply, asyncio.get_running_loop().time())  # its usage: prompt tokens, a cost
        meter.state.request_id = answer.headers.get("x-request-id", "")
        if not isinstance(reply.get("data"), list):
            status, error = "failed", "the upstream's answer has no embeddings"
    except upstream.UpstreamError as exc:
        status, error = "failed", str(exc)
    await meter.record(status, error)
    if status == "failed":
        return unusable_answer(error, meter.entry.provider.name)
    content = upstream.redact_secrets(answer.content, meter.state.secrets)  # an upstream may echo the key
    response = HttpResponse(
        content, status=answer.status_code, content_type=answer.headers.get("content-type", "application/json")
    )
    copy_headers(answer.headers, response)
    return response
