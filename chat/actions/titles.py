"""Titles written by a model: after a conversation's first answer, in the background, metered.

When the conversation's first answer completes (not a regenerated one, nor the answer to its
first message edited into a new branch: one title per conversation, whichever branch is shown),
the conversation's model (or CHAT_TITLE_MODEL) is asked for a short title; the demo upstream,
whose answers are canned, is not asked. The request is a stream like any other: a usage row (source `titl`, no
message) reserved against the owner's budget and settled with its cost. Whatever goes wrong
(over budget, an upstream error, an empty answer) the title falls back to the first line
(Conversation.title_for). A conversation its owner renamed (`title_locked`) is never retitled.
The owner's sockets get a `title` frame (docs/websocket.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from channels.layers import get_channel_layer
from django.conf import settings

from chat.lib.channel_groups import user_group
from chat.metering import metered_streams
from chat.models import Conversation, Message, Usage
from chat.runtime import db_threads, process_loops
from chat.streaming import upstream
from chat.streaming.catalog import access_for, resolve_model
from chat.streaming.providers import open_provider_stream, provider_limit, stream_state
from chat.streaming.relay import prompt_chars

log = logging.getLogger(__name__)

# Not translated: it is sent to the model, not shown to anyone.
INSTRUCTION = (
    "Write a title for the conversation above, in its language: at most six words. "
    "Answer with the title alone, with no quotes, no markdown and no final full stop."
)
# Characters of the first message and of the answer the model reads: enough for a title.
EXCERPT_CHARS = 2000
# Room for a reasoning model to think before it writes a few words.
MAX_TOKENS = 512


@dataclass(frozen=True)
class Request:
    """A title to ask for: whose conversation, its model, the messages to send, the fallback."""

    conversation_id: int
    owner: object
    model: str
    messages: list[dict[str, str]]
    fallback: str


def wanted(conversation_id: int, reply_id: int) -> Request | None:
    """The title request for a reply that just completed, if it is the first answer to a root message."""
    reply = Message.objects.select_related("parent", "conversation__owner").filter(pk=reply_id).first()
    if reply is None or reply.status != Message.Status.COMPLETE or reply.parent is None:
        return None
    first, conversation = reply.parent, reply.conversation
    if first.parent_id is not None or conversation.title_locked:
        return None
    # One title per conversation, written after its first answer: a regenerated first answer, or the
    # answer to an edited first message (another root), would retitle the whole conversation after
    # one branch, and switching back would keep it (issue 37).
    earlier = Message.objects.filter(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status=Message.Status.COMPLETE,
        parent__parent__isnull=True,
        parent__isnull=False,
        pk__lt=reply.pk,
    )
    if earlier.exists():
        return None
    messages = [
        # A message of attachments alone has no text: its title (the first file's name) stands in.
        {"role": "user", "content": (first.content or conversation.title)[:EXCERPT_CHARS]},
        {"role": "assistant", "content": reply.content[:EXCERPT_CHARS]},
        {"role": "user", "content": INSTRUCTION},
    ]
    fallback = Conversation.title_for(first.content or conversation.title)
    return Request(conversation.pk, conversation.owner, conversation.model, messages, fallback)


def after_answer(conversation_id: int, reply_id: int) -> Coroutine[Any, Any, str | None] | None:
    """The title's writing, to run in the background after a complete answer (None when CHAT_TITLES is off)."""
    return write(conversation_id, reply_id) if settings.CHAT_TITLES else None


async def write(conversation_id: int, reply_id: int) -> str | None:
    """Ask for the title, store it unless the owner renamed the conversation meanwhile, tell their sockets."""
    try:
        request = await db_threads.run(wanted)(conversation_id, reply_id)
        if request is None:
            return None
        title = ""
        try:
            title = Conversation.clean_title(await ask(request))
        except Exception as exc:  # any failure leaves the first line: a title is never worth an error
            log.info("conversation %s: no title from the model (%s); the first line stays", conversation_id, exc)
        title = title or request.fallback
        if not await db_threads.run(store)(conversation_id, title):
            return None
        text = orjson.dumps({"type": "title", "conversation": conversation_id, "title": title}).decode()
        try:
            await get_channel_layer().group_send(user_group(request.owner.pk), {"type": "chat.title", "text": text})
        except Exception as exc:  # Redis out: stored all the same, and the sidebar shows it at its next refresh
            log.warning("conversation %s: its title is stored; its tabs could not be told (%r)", conversation_id, exc)
        return title
    except Exception:  # the database, the channel layer: the conversation keeps the title it has
        log.exception("conversation %s: could not write its title", conversation_id)
        return None


def store(conversation_id: int, title: str) -> bool:
    """Write the title unless the owner has renamed the conversation (or deleted it)."""
    return bool(Conversation.objects.filter(pk=conversation_id, title_locked=False).update(title=title))


async def ask(request: Request) -> str:
    """One metered stream to the title model; its text (raises on an upstream error or over budget)."""
    if settings.CHAT_TITLE_MODEL:  # the site's choice, whichever models the person may pick themselves
        entry = await resolve_model(settings.CHAT_TITLE_MODEL)
    else:
        entry = await resolve_model(request.model or None, await access_for(request.owner))
    provider = entry.provider
    if provider.is_demo:
        # The demo upstream answers everything with its canned text, which is no title: the first line stays.
        return ""
    await process_loops.ensure_started()
    payload = upstream.build_payload(entry.model, request.messages, max_tokens=MAX_TOKENS)
    chars = prompt_chars(request.messages)
    usage = await db_threads.run(begin)(request.owner, provider, entry.model, chars, process_loops.worker_id())
    loop = asyncio.get_running_loop()
    state = stream_state(loop.time(), provider.api_key)
    status, error = Message.Status.FAILED, ""
    try:
        async with open_provider_stream(
            provider.name, provider.base_url, provider.api_key, provider_limit(provider), payload, state
        ) as stream:
            await stream.read(state)
        status = state.outcome()
        error = state.error_message() if status == Message.Status.FAILED else ""
    except upstream.UpstreamError as exc:
        status, error = state.outcome(exc), str(exc)
        raise
    except BaseException as exc:
        status, error = Message.Status.INTERRUPTED, repr(exc)
        raise
    finally:
        state.ended_at = loop.time()
        metering = state.metering(chars, loop.time())
        ending = Usage.ending(state, status, error, metering)
        await db_threads.run(metered_streams.settle)(usage.pk, ending)
    if status == Message.Status.FAILED:
        raise upstream.UpstreamError("protocol", error or "the title request failed")
    return state.text


def begin(owner, provider, model: str, chars: int, worker_id: int | None) -> Usage:
    """The title request's usage row, reserved against the owner's budget (BudgetExceeded over it)."""
    # No limits: a title is the server's own follow-up to an answer the limits already let start
    # (one per new conversation), not a stream the person asked for. Checked, a person at their cap
    # of streams or of starts a minute would lose the title (the first line stays) for nothing.
    # The budget still applies: a title costs.
    return metered_streams.start(owner, source=Usage.Source.TITLE, provider=provider, model=model,
                                 prompt_tokens=upstream.estimate_tokens(chars), max_tokens=MAX_TOKENS,
                                 worker_id=worker_id, check_limits=False)  # fmt: skip
