"""Streaming client for OpenAI-compatible chat completion upstreams (no Django here).

Three dialects are understood (docs/providers.md): i14 (reasoning in
`delta.reasoning_content`, a usage-only chunk with `choices: []`, `x_i14_perf`),
api14 (reasoning in `delta.reasoning`, usage with `cost` on the finish chunk,
`:` keep-alive comments, mid-stream errors as a chunk with `error` and
`finish_reason: "error"`) and infyrence (mid-stream errors as `data: {"error": ...}`
followed by `[DONE]`, `X-Request-Id`).

One module a concern: `client` (the process's HTTP client and the addresses it refuses),
`requests` (opening a stream, a whole answer, the model list), `stream` (an open stream's one
read loop), `state` (what a stream says) and `errors` (an upstream's failures as sentences
without secrets). Everything the rest of the server uses is here.
"""

from chat.lib.token_estimate import estimate_tokens
from chat.streaming.upstream.client import (
    DestinationGuard,
    close_shared_client,
    make_client,
    origin,
    refused_literal,
    shared_client,
)
from chat.streaming.upstream.errors import UpstreamError, describe_error, describe_error_body, redact_secrets, scrub
from chat.streaming.upstream.requests import (
    Answer,
    Timeouts,
    build_payload,
    list_model_items,
    list_models,
    open_stream,
    post_json,
)
from chat.streaming.upstream.state import DONE, StreamState, parse_chunk
from chat.streaming.upstream.stream import UpstreamStream

__all__ = [
    "DONE",
    "Answer",
    "DestinationGuard",
    "StreamState",
    "Timeouts",
    "UpstreamError",
    "UpstreamStream",
    "build_payload",
    "close_shared_client",
    "describe_error",
    "describe_error_body",
    "estimate_tokens",
    "list_model_items",
    "list_models",
    "make_client",
    "open_stream",
    "origin",
    "parse_chunk",
    "post_json",
    "redact_secrets",
    "refused_literal",
    "scrub",
    "shared_client",
]
