"""Titles written by a model: after a conversation's first answer, in the background, metered.

When the first answer to a root user message completes (a new conversation, or its first
message edited into a new branch), the conversation's model (or CHAT_TITLE_MODEL) is asked
for a short title. The request is a stream like any other: a usage row (source `titl`, no
message) reserved against the owner's budget and settled with its cost. Whatever goes wrong
(over budget, an upstream error, an empty answer) the title falls back to the first line
(Conversation.title_for). A conversation its owner renamed (`title_locked`) is never retitled.
The owner's sockets get a `title` frame (docs/websocket.md).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import orjson
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from . import budgets, db, limits, process, upstream
from .models import Conversation, Message, Provider, Usage, access_for, client, stream_state, timeouts
from .relay import prompt_chars
from .sessions import user_group

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
    # A regenerated first answer is a sibling: the title was written for the one before it.
    earlier = first.children.filter(role=Message.Role.ASSISTANT, status=Message.Status.COMPLETE, pk__lt=reply.pk)
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


async def write(conversation_id: int, reply_id: int) -> str | None:
    """Ask for the title, store it unless the owner renamed the conversation meanwhile, tell their sockets."""
    try:
        request = await db.run(wanted)(conversation_id, reply_id)
        if request is None:
            return None
        title = ""
        try:
            title = Conversation.clean_title(await ask(request))
        except Exception as exc:  # any failure leaves the first line: a title is never worth an error
            log.info("conversation %s: no title from the model (%s); the first line stays", conversation_id, exc)
        title = title or request.fallback
        if not await db.run(store)(conversation_id, title):
            return None
        text = orjson.dumps({"type": "title", "conversation": conversation_id, "title": title}).decode()
        await get_channel_layer().group_send(user_group(request.owner.pk), {"type": "chat.title", "text": text})
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
        entry = await Provider.objects.aresolve(settings.CHAT_TITLE_MODEL)
    else:
        entry = await Provider.objects.aresolve(request.model or None, await access_for(request.owner))
    provider = entry.provider
    await process.ensure_started()
    payload = upstream.build_payload(entry.model, request.messages, max_tokens=MAX_TOKENS)
    chars = prompt_chars(request.messages)
    usage = await db.run(begin)(request.owner, provider, entry.model, chars, process.worker_id())
    loop = asyncio.get_running_loop()
    state = stream_state(loop.time(), provider.api_key)
    status, error = Message.Status.FAILED, ""
    try:
        async with (
            limits.provider_slot(provider.name, limits.provider_limit(provider)),
            upstream.open_stream(client(), provider.base_url, provider.api_key, payload, timeouts(),
                                 max_event=settings.UPSTREAM_MAX_LINE_BYTES) as stream,
        ):  # fmt: skip
            state.request_id = stream.request_id or ""
            async for event in stream.events():
                if event.data is not None:
                    state.feed(event.data, loop.time())
                if state.done or state.full:
                    break
        status = state.outcome()
        error = state.error_message() if status == Message.Status.FAILED else ""
    except upstream.UpstreamError as exc:
        error = str(exc)
        raise
    except BaseException as exc:
        status, error = Message.Status.INTERRUPTED, repr(exc)
        raise
    finally:
        state.ended_at = loop.time()
        metering = state.metering(chars, loop.time())
        ending = Usage.ending(state, status, error, metering)
        await db.run(budgets.settle)(usage.pk, ending)
    if status == Message.Status.FAILED:
        raise upstream.UpstreamError("protocol", error or "the title request failed")
    return state.text


def begin(owner, provider, model: str, chars: int, worker_id: int | None) -> Usage:
    """The title request's usage row, reserved against the owner's budget (BudgetExceeded over it)."""
    prompt_tokens = upstream.estimate_tokens(chars)
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()  # as reserve() asks
        reservation = budgets.reserve(
            owner, provider_id=provider.pk, model=model, prompt_tokens=prompt_tokens, max_tokens=MAX_TOKENS
        )
        return Usage.objects.create(
            user=owner,
            provider=provider,
            model=model,
            source=Usage.Source.TITLE,
            status=Message.Status.STREAMING,
            prompt_tokens=prompt_tokens,
            reserved_usd=reservation.usd,
            reserved_tokens=reservation.tokens,
            worker_id=worker_id,  # if this process dies, another one closes the row
        )
