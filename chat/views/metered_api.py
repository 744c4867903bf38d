"""The metered start every /v1 request that goes upstream shares: the token, the model, the usage row, the
upstream's answer or refusal, and the usage recorded when the request ends, in OpenAI's error shapes.

/v1/chat/completions (chat/views/openai_api.py), /v1/responses and /v1/embeddings build on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import orjson
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from django.utils import timezone

from chat.auth.api_tokens import bearer, cached_token_for, caller
from chat.lib.model_params import has_images, token_limit
from chat.lib.openai_errors import error_body
from chat.metering import budgets, limits, metered_streams
from chat.models import ApiToken, ChatError, Conversation, Message, Usage, fit
from chat.runtime import db_busy, db_threads, metrics, process_loops
from chat.streaming import upstream
from chat.streaming.catalog import CatalogEntry, catalog_of, resolve_in, with_catalog
from chat.streaming.providers import client, open_provider_stream, provider_limit, provider_slot, stream_state, timeouts
from chat.streaming.relay import RequestError, message_text, request_chars

log = logging.getLogger(__name__)
M = TypeVar("M", bound="MeteredRequest")

# While the database is unavailable a request's usage is tried again, the pauses doubling from the first up to
# the longest, for CHAT_FINAL_SAVE_SECONDS (a chat answer's final save tries as long); its response waits
# for it RECORD_WAIT_SECONDS at most, then goes on while the recording does.
RECORD_FIRST_PAUSE, RECORD_LONGEST_PAUSE = 1.0, 10.0
RECORD_WAIT_SECONDS = 6.0
# Usage recordings under way, kept referenced so that they finish.
_recording: set[asyncio.Task] = set()

# Passed on from the upstream's response to the client's.
PASSED_HEADERS = ("x-request-id", "retry-after")


STREAMS_RETRY_SECONDS = 2  # Retry-After of a refusal over the streams-at-once limit

# A body past this size is checked off the event loop, one at a time in the process, and only for a known token:
# checking 28 MB of small messages element by element takes a second or more, which on the loop stalled every
# other request and stream of the process, a stranger's bogus token included.
LARGE_BODY_BYTES = 256 * 1024
_large_bodies = asyncio.Semaphore(1)


def openai_error(
    status: int, message: str, type: str, code: str | None = None, param: str | None = None
) -> HttpResponse:
    return HttpResponse(error_body(message, type, code, param), status=status, content_type="application/json")


def model_not_found(model: str) -> HttpResponse:
    """404 for a model this person cannot use or that no provider lists, in OpenAI's words."""
    message = f"The model `{model}` does not exist or you do not have access to it."
    return openai_error(404, message, "invalid_request_error", "model_not_found", "model")


def unauthorized() -> HttpResponse:
    response = openai_error(
        # OpenAI's own words: clients such as LiteLLM tell a wrong key from a bad request by them.
        401, "Incorrect API key provided: send `Authorization: Bearer <token>` with an active personal API token.",
        "invalid_request_error", "invalid_api_key",
    )  # fmt: skip
    response["WWW-Authenticate"] = "Bearer"
    return response


class SSEResponse(StreamingHttpResponse):
    """A stream whose upstream is closed (and metered) even if the client leaves before the first byte."""

    def __init__(self, relay, cleanup: AsyncExitStack, *args, **kwargs) -> None:
        super().__init__(relay, *args, **kwargs)
        self._body = relay
        self._cleanup = cleanup
        self._loop = asyncio.get_running_loop()

    def __aiter__(self):
        # Our generator yields bytes already: Django's two wrapping generators (one to call
        # make_bytes on each part) cost more than a small relayed event.
        return self._body

    async def aclose(self) -> None:
        """Close the stream on the loop, without Django's request_finished (chatsite/completions.py)."""
        await self._close_body()

    def close(self) -> None:
        # Django calls close() from a worker thread; the upstream belongs to the event loop.
        self._loop.call_soon_threadsafe(self._loop.create_task, self._close_body())
        super().close()

    async def _close_body(self) -> None:
        # Django closes only its own wrapper around our generator: a client cut while a send
        # was held (flow control) would leave ours suspended, unmetered, until garbage collected.
        # Closing a finished generator or an already closed stack does nothing.
        try:
            await self._body.aclose()
        finally:
            await self._cleanup.aclose()


class Refused(Exception):
    """A request answered without going upstream: `response` says why (a bad token, model or request)."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


async def metered_post(
    request, meter_type: type[M], parse: Callable[[bytes], Any]
) -> tuple[M, None] | tuple[None, HttpResponse]:
    """A /v1 POST up to its upstream request: the method, the bearer token, the body (`parse` raises
    RequestError, said only once the token is known good) and the metered start; the meter, or the refusal."""
    if request.method != "POST":
        return None, openai_error(405, "Use POST.", "invalid_request_error", "method_not_allowed")
    secret = bearer(request)
    if secret is None:
        return None, unauthorized()
    # read(), not request.body: Django's body refuses anything past REQUEST_MAX_BYTES, and these paths may take
    # API_MAX_BODY_BYTES (chatsite/server.py refuses more while it arrives).
    raw = request.read()
    if len(raw) <= LARGE_BODY_BYTES:
        body, invalid = _parsed(parse, raw)
    else:
        if await db_threads.run(cached_token_for)(secret) is None:
            return None, unauthorized()
        async with _large_bodies:
            body, invalid = await asyncio.to_thread(_parsed, parse, raw)
    meter = meter_type(body)
    refused = await start_metered(request, meter, secret, invalid)
    return (None, refused) if refused is not None else (meter, None)


def _parsed(parse: Callable[[bytes], Any], raw: bytes) -> tuple[Any, RequestError | None]:
    """The parsed body, or the error to answer once the token is known good (a bad token is a 401 before a 400)."""
    try:
        return parse(raw), None
    except RequestError as exc:
        return None, exc


async def start_metered(
    request, meter: MeteredRequest, secret: str, invalid: RequestError | None
) -> HttpResponse | None:
    """Everything before a metered request goes upstream (MeteredRequest.open); the response instead, if refused."""
    # The usage row records this process's lease: if the process dies, another one closes the row.
    await process_loops.ensure_started()
    meter.worker_id = process_loops.worker_id()
    # One trip to a database thread (chat/runtime/db_threads.py) before anything goes upstream. A short wait for
    # SQLite's write lock: a busy database is a quick 503 with Retry-After. The thread keeps its
    # connection: a stream does not hold one while it runs.
    opening = db_threads.run(db_busy.waiting_briefly(meter.open))
    try:
        await with_catalog(lambda catalog: opening(secret, invalid, catalog))
    except Refused as exc:
        return exc.response
    except limits.LimitExceeded as exc:
        return too_many(exc)
    except db_busy.UNAVAILABLE as exc:
        log.warning("database unavailable, refusing an API request for now: %s", exc)
        return db_busy.busy_response(request.path)
    except budgets.BudgetExceeded as exc:
        return await over_budget(meter, exc)
    except Exception:
        if meter.entry is None:  # not a failure to record: a bug before it (a logged 500)
            raise
        # Nothing went upstream: an unmetered request is not sent at all.
        log.exception("could not start API usage for %s", meter.token.user)
        return openai_error(503, "The server could not record this request; try again.", "server_error", "unavailable")
    return None


async def open_upstream(
    meter: MeteredRequest, payload: dict
) -> tuple[upstream.UpstreamStream | None, AsyncExitStack, HttpResponse | None]:
    """The provider's stream for a metered request and the stack that closes it, or the response to send
    instead (the upstream's refusal, metered; the stack already closed)."""
    provider = meter.entry.provider
    cleanup = AsyncExitStack()
    # However the response ends (even unread), the usage row stops counting as streaming.
    cleanup.push_async_callback(meter.record, "stopped", "the client disconnected")
    opening = open_provider_stream(
        provider.name, provider.base_url, provider.api_key, provider_limit(provider), payload, meter.state
    )
    try:
        stream, refused = await meter.answer_of(cleanup.enter_async_context(opening))
    except BaseException:
        await cleanup.aclose()
        raise
    if refused is not None:
        await cleanup.aclose()
    return stream, cleanup, refused


def disconnect_reason(flow) -> str:
    if flow is not None and flow.slow_cut:
        return f"the client did not read the stream for {settings.API_SLOW_CLIENT_SECONDS:g} s and was disconnected"
    return "the client disconnected"


def copy_headers(source, response: HttpResponse) -> None:
    for name in PASSED_HEADERS:
        if name in source:
            response[name] = source[name]


def too_many(exc: limits.LimitExceeded) -> HttpResponse:
    """429 in OpenAI's shape (the SDKs raise RateLimitError), with Retry-After when a wait is known."""
    response = openai_error(429, exc.detail, "rate_limit_error", exc.code)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    elif exc.code == "too_many_streams":
        # One of the person's streams may end at any moment: a short wait, which the SDKs' retries honour,
        # rather than their own backoff of under a second.
        response["Retry-After"] = str(STREAMS_RETRY_SECONDS)
    return response


async def over_budget(meter: MeteredRequest, exc: budgets.BudgetExceeded) -> HttpResponse:
    """429 with OpenAI's out-of-quota type (the SDKs raise RateLimitError); the refusal gets a usage row."""
    try:
        await db_threads.run(meter.refuse)(exc)
    except Exception:
        log.exception("could not record a refused API request for %s", meter.token.user)
    response = openai_error(429, exc.detail, "insufficient_quota", exc.code)
    # Not until the budget grows or the month turns: an SDK's retries would only add refused requests.
    response["x-should-retry"] = "false"
    return response


def upstream_error(exc: upstream.UpstreamError, provider: str = "") -> HttpResponse:
    """The upstream's own status and error body when it gave one, else 502/504 in OpenAI's shape.

    Logged here, once, naming the provider; not again as Django's "Internal Server Error" (not our bug).
    """
    log.warning("/v1: provider %s failed (%s)", provider or "?", exc)
    return already_logged(_upstream_response(exc, provider))


def unusable_answer(error: str, provider: str) -> HttpResponse:
    """A whole answer that came with a success status but cannot be used (cut short, not JSON, an error in it):
    502 in OpenAI's shape, which the SDKs raise as their own error, rather than the body they cannot read."""
    log.warning("/v1: provider %s sent an unusable answer (%s)", provider, error)
    return already_logged(openai_error(502, error or "the upstream failed", "upstream_error", "upstream_error"))


def already_logged(response: HttpResponse) -> HttpResponse:
    response._has_been_logged = True  # Django's log_response skips it (django.utils.log)
    return response


def _upstream_response(exc: upstream.UpstreamError, provider: str = "") -> HttpResponse:
    if exc.kind == "http" and exc.status == 401:
        # The provider refused this server's key, not the client's token: passed on as it was, it made the SDKs
        # raise AuthenticationError, as for a wrong personal token. The upstream's words stay in the log. (A 403
        # is passed on: i14's, for one, refuses the model the client asked for.)
        response = openai_error(
            502, f"The provider “{provider}” refused this server's API key (HTTP 401): an administrator needs "
            "to check it.", "upstream_error", "upstream_auth",
        )  # fmt: skip
        response["x-should-retry"] = "false"  # the SDKs' own header: the same request would be refused again
        return response
    if exc.kind == "http" and exc.status:
        body = exc.body or b""
        try:
            shaped = isinstance(orjson.loads(body).get("error"), dict)
        except (orjson.JSONDecodeError, AttributeError):
            shaped = False
        if not shaped:  # plain text or an HTML page: one line, e.g. "upstream 502: Bad Gateway"
            body = error_body(str(exc), "upstream_error", exc.code)
        response = HttpResponse(body, status=exc.status, content_type="application/json")
        copy_headers(exc.headers, response)
        return response
    if exc.kind == "busy":
        return openai_error(503, f"Cannot start the request: {exc.message}.", "server_error", "provider_busy")
    status = 504 if exc.kind == "timeout" else 502
    return openai_error(status, str(exc), "upstream_error", exc.kind)


class MeteredRequest:
    """One /v1 request, metered: its stream's start and settle, and (if configured) its conversation."""

    def __init__(self, body: dict | None) -> None:
        self.body = body
        self.started = timezone.now()
        self.started_at = asyncio.get_running_loop().time()
        self.token: ApiToken | None = None
        self.entry: CatalogEntry | None = None
        self.state: upstream.StreamState | None = None  # once the provider is known: its key is scrubbed from errors
        self.recorded = False
        self.usage_id: int | None = None
        self.worker_id: int | None = None
        self.prompt_size = 0  # prompt_chars(), counted once as the stream begins

    def open(self, secret: str, invalid: RequestError | None, catalog: list[CatalogEntry] | None = None) -> None:
        """Everything before the upstream request, on a database thread: the token, the model, the usage row.

        Raises Refused with the answer for a bad token (401), then a bad request (`invalid`, 400), a
        model not found or not allowed (404, 403) or images to a model without them (400). The model
        is looked up in `catalog`, or in the model lists this process holds (ModelListNotCached if one is
        missing: the caller fetches them and calls again with the catalog).
        """
        found = caller(secret)
        if found is None:
            raise Refused(unauthorized())
        if invalid is not None:
            raise Refused(HttpResponse(invalid.body(), status=invalid.status, content_type="application/json"))
        token, access, providers = found
        catalog = catalog_of(providers, catalog)
        try:
            entry = resolve_in(catalog, self.body["model"], access)
        except ChatError as exc:
            if exc.code == "model_not_allowed":  # i14's own refusal of a model, in its shape
                raise Refused(openai_error(403, exc.detail, "permission_error", "model_not_allowed", "model")) from None
            if exc.code == "unknown_model":
                raise Refused(model_not_found(self.body["model"])) from None
            raise Refused(openai_error(404, exc.detail, "invalid_request_error", "model_not_found")) from None
        refusal = self.refusal(entry)
        if refusal is not None:
            raise Refused(refusal)
        self.token, self.entry = token, entry
        self.state = stream_state(self.started_at, entry.provider.api_key)
        self.begin()
        self.state.completion_cap = self.max_tokens()  # of the body begin() settled (a Responses request's)

    def refusal(self, entry: CatalogEntry) -> HttpResponse | None:
        """The answer to a request this model cannot take: images to a model without them (400)."""
        if has_images(self.body["messages"]) and not entry.provider.accepts_images(entry.model):
            return openai_error(
                400, f"{entry.model} does not accept images (image_url parts) on this server.",
                "invalid_request_error", "images_not_supported", "messages",
            )  # fmt: skip
        return None

    def prompt_chars(self) -> int:
        """The prompt's length in characters, for estimating its tokens when the upstream does not say."""
        return request_chars(self.body)

    def begin(self) -> None:
        """Start the metered stream (chat/metering/metered_streams.py) before anything goes upstream.

        The usage row counts towards the streams and the rate limits from now on, and a crash
        leaves it behind instead of losing the request.
        """
        # Counted once, here on the database thread: the body no longer changes, and its end reuses the count
        # (a body of megabytes takes a while, which on the event loop would stall the process).
        self.prompt_size = self.prompt_chars()
        prompt_tokens = upstream.estimate_tokens(self.prompt_size)
        self.usage_id = metered_streams.start(
            self.token.user, source=Usage.Source.API, token=self.token, provider=self.entry.provider,
            model=self.entry.model, prompt_tokens=prompt_tokens, max_tokens=self.max_tokens(),
            worker_id=self.worker_id, started=self.started,
        ).pk  # fmt: skip

    def max_tokens(self) -> int:
        """The most completion tokens this request can produce, over all its choices."""
        body = self.body
        return token_limit(body, settings.UPSTREAM_MAX_TOKENS) * (body.get("n") or 1)

    def refuse(self, exc: budgets.BudgetExceeded) -> None:
        budgets.refuse(
            self.token.user,
            source=Usage.Source.API,
            token=self.token,
            provider_id=self.entry.provider.pk,
            model=self.entry.model,
            detail=exc.detail,
        )

    async def ask_whole(self, payload: dict, path: str = "chat/completions"):
        """The provider's whole answer to `payload`, in one of its connection slots: (answer, None), or
        (None, the response to send instead) once a failure is metered."""
        provider = self.entry.provider
        self.state.whole = True  # its first token comes with its last: no time to first token

        async def ask():
            async with provider_slot(provider.name, provider_limit(provider)):
                return await upstream.post_json(
                    client(), provider.base_url, provider.api_key, payload, timeouts(),
                    max_bytes=settings.API_MAX_RESPONSE_BYTES, path=path,
                )  # fmt: skip

        return await self.answer_of(ask())

    async def answer_of(self, request):
        """Await the upstream's answer; if it fails, meter the failure and give the response to send instead."""
        try:
            return await request, None
        except upstream.UpstreamError as exc:
            self.state.note_failure(exc)  # a refusal is not billed (a stream's was noted as it opened)
            await self.record("failed", str(exc))
            return None, upstream_error(exc, self.entry.provider.name)
        except asyncio.CancelledError:
            await self.record("stopped", "the client disconnected before the upstream answered")
            raise

    async def record(self, status: str, error: str) -> None:
        if self.recorded:
            return
        self.recorded = True
        self.state.ended_at = asyncio.get_running_loop().time()
        usage = self.state.metering(self.prompt_size, self.state.ended_at)
        # A task of its own: a client that hangs up after [DONE] gets this request cancelled by daphne
        # (10 s later), which must not cancel the recording of what it was given; and a database down
        # for longer than the wait leaves the recording to go on after the response.
        task = asyncio.ensure_future(self._record(status, error, usage))
        _recording.add(task)
        task.add_done_callback(_recording.discard)
        await asyncio.wait([task], timeout=RECORD_WAIT_SECONDS)

    async def _record(self, status: str, error: str, usage: dict) -> None:
        # A database that is unavailable now (restarting, or a held SQLite lock outlasting the busy timeout) is
        # tried again, so the usage of an answer already given is not lost, nor its row left `streaming`.
        loop = asyncio.get_running_loop()
        deadline, attempt = loop.time() + settings.CHAT_FINAL_SAVE_SECONDS, 0
        while True:
            attempt += 1
            try:
                await db_threads.run(self._save)(status, error, usage)
            except db_busy.UNAVAILABLE as exc:
                left = deadline - loop.time()
                if left <= 0:
                    log.error("could not record API usage for %s, giving up after %d attempts: %s",
                              self.token.user, attempt, exc)  # fmt: skip
                    return
                pause = min(RECORD_FIRST_PAUSE * 2 ** (attempt - 1), RECORD_LONGEST_PAUSE, left)
                log.warning("could not record API usage for %s yet, retrying in %g s: %s", self.token.user, pause, exc)
                metrics.db_save_retries.labels("api_usage").inc()
                await asyncio.sleep(pause)
                continue
            except Exception:
                log.exception("could not record API usage for %s", self.token.user)
                return
            if attempt > 1:
                log.warning("API usage for %s recorded after %d attempts", self.token.user, attempt)
            return

    def _save(self, status: str, error: str, usage: dict) -> None:
        message = None
        if settings.API_STORE_CONVERSATIONS:
            message = self._store_conversation(status, error)
        row = {"provider_id": self.entry.provider.pk, "model": self.entry.model, "started": self.started}
        ending = Usage.ending(self.state, status, error, usage)
        metered_streams.settle(self.usage_id, {"message": message, **ending}, row)

    def _store_conversation(self, status: str, error: str) -> Message:
        messages = self.body["messages"]
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
        text = last_user.get("content") if isinstance(last_user.get("content"), str) else "API request"
        conversation = Conversation.objects.create(
            owner=self.token.user, title=Conversation.title_for(text or "API request"), model=self.entry.qualified
        )
        parent = None
        for item in messages:
            content = message_text(item.get("content"))
            role = item.get("role") if item.get("role") in Message.Role.values else Message.Role.USER
            if role == Message.Role.SYSTEM:
                conversation.system_prompt = content
            else:
                parent = conversation.messages.create(role=role, content=content, parent=parent)
        answer = conversation.messages.create(
            parent=parent,
            role=Message.Role.ASSISTANT,
            content=self.state.text,
            reasoning=self.state.reasoning_text,
            tool_calls=self.state.tool_call_list or None,
            status=status,
            finish_reason=fit(Message, "finish_reason", self.state.finish_reason),
            error=error,
            model=self.entry.model,
        )
        conversation.current_id = answer.pk  # the id, not the row: no cycle (as begin_turn)
        conversation.save(update_fields=["system_prompt", "current"])
        return answer
