"""An import stored in bounded batches, so that one person's import never holds the database from everyone else.

The file is read and checked first (chat/actions/exports.py: its size, how many conversations and
messages, every field). Then each conversation's messages go in parent-first order, at most
CHAT_BATCH_ROWS to a transaction, each transaction one call on the database threads
(chat/runtime/db_threads.py). SQLite has one writer: a batch holds its write lock for a fraction of a
second, the stream starts queued meanwhile go before the next batch, and after each batch the import
waits as long as the batch took (0.1 s at least), so that requests polling for the lock (sign-ins, pages)
get it too.
A conversation is complete once its last batch is in; an import that fails or is abandoned half-way
deletes what it had stored (nothing half-imported stays).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from chat.actions.deletes import delete_batch, delete_one
from chat.actions.exports import _first_text, parse
from chat.models import Conversation, Message
from chat.runtime import db_busy, db_threads

log = logging.getLogger(__name__)


def parent_first(messages: list[dict]) -> list[dict]:
    """The messages with every parent before its children, otherwise in the file's order (the file has no loops)."""
    placed: set = set()
    waiting: dict = {}
    ordered: list[dict] = []
    for message in messages:
        if message["parent"] is not None and message["parent"] not in placed:
            waiting.setdefault(message["parent"], []).append(message)
            continue
        stack = [message]
        while stack:  # this one, then whatever waited for it, depth first without recursion
            ready = stack.pop()
            ordered.append(ready)
            placed.add(ready["id"])
            stack.extend(reversed(waiting.pop(ready["id"], [])))
    return ordered


def batches(messages: list[dict]) -> Iterator[list[dict]]:
    size = max(1, settings.CHAT_BATCH_ROWS)
    ordered = parent_first(messages)
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def create_conversation(user, data: dict) -> int:
    """The conversation's row (no messages yet, nothing shown): its id."""
    conversation = Conversation.objects.create(
        owner=user, title=data["title"] or Conversation.title_for(_first_text(data)), model=data["model"],
        system_prompt=data["system_prompt"], params=data["params"], updated=data["updated"] or timezone.now(),
    )  # fmt: skip
    return conversation.pk


def store_batch(conversation_id: int, batch: list[dict], new_ids: dict) -> dict:
    """One transaction: these messages (parents already stored or in this batch); their new ids by the file's."""
    with transaction.atomic():
        rows = Message.objects.bulk_create(Message(
            conversation_id=conversation_id, parent_id=new_ids.get(m["parent"]), role=m["role"], content=m["content"],
            reasoning=m["reasoning"], thinking_ms=m["thinking_ms"], tool_calls=m["tool_calls"],
            tool_rounds=m["tool_rounds"], status=m["status"], finish_reason=m["finish_reason"], error=m["error"],
            model=m["model"], imported_usage=m["usage"],
        ) for m in batch)  # fmt: skip
        made = {m["id"]: row.pk for m, row in zip(batch, rows, strict=True)}
        # A parent in this same batch got its id just now; a time from the file replaces the now of creating.
        # One prepared statement run for each row, not bulk_update's CASE over every row of the batch.
        when = Message._meta.get_field("created").get_db_prep_value
        fixes = [
            (new_ids.get(m["parent"], made.get(m["parent"])), when(m["created"], connection), row.pk)
            for m, row in zip(batch, rows, strict=True)
            if m["created"] is not None or m["parent"] in made
        ]
        if fixes:
            table, quote = Message._meta.db_table, connection.ops.quote_name
            with connection.cursor() as cursor:
                cursor.executemany(
                    f"UPDATE {quote(table)} SET {quote('parent_id')} = %s, "
                    f"{quote('created')} = COALESCE(%s, {quote('created')}) WHERE {quote('id')} = %s",
                    fixes,
                )
    return made


def finish(conversation_id: int, data: dict, new_ids: dict) -> None:
    """The branch shown and the conversation's own time, once every message is in."""
    changes = {"current_id": new_ids.get(data["current"])}
    if data["created"]:
        changes["created"] = data["created"]
    Conversation.objects.filter(pk=conversation_id).update(**changes)


def discard(conversation_ids: list[int]) -> None:
    """What an import that did not finish had stored: its conversations go, one by one, a long one in batches."""
    for conversation in Conversation.objects.filter(pk__in=conversation_ids):
        delete_one(conversation)


async def discard_between_others(conversation_ids: list[int]) -> None:
    """discard(), each batch one call on the database threads, the pauses between them off those threads."""
    for pk in conversation_ids:
        while True:
            began = time.monotonic()
            if not await db_threads.run(delete_batch)(pk):
                break
            await asyncio.sleep(db_busy.pause_after(time.monotonic() - began))
    await db_threads.run(discard)(conversation_ids)  # the conversations, their last few messages with them


def _steps(user, parsed: list[dict]) -> Iterator[tuple[Callable, tuple]]:
    """The import as calls, each its own short piece of database work; what each returns goes back in (send)."""
    for data in parsed:
        conversation_id = yield create_conversation, (user, data)
        new_ids: dict = {}
        for batch in batches(data["messages"]):
            new_ids.update((yield store_batch, (conversation_id, batch, new_ids)))
        yield finish, (conversation_id, data, new_ids)


def import_now(user, raw: bytes) -> list[Conversation]:
    """The same import in the calling thread, batch after batch (the management shell, tests)."""
    parsed, made = parse(raw), []
    steps, result = _steps(user, parsed), None
    try:
        while True:
            function, args = steps.send(result)
            result = function(*args)
            if function is create_conversation:
                made.append(result)
    except StopIteration:
        pass
    except BaseException:
        discard(made)
        raise
    return list(Conversation.objects.filter(pk__in=made).order_by("pk"))


async def import_conversations(user, raw: bytes) -> list[Conversation]:
    """Store an export's conversations as new ones of `user`: new ids, the tree and the branch shown kept.

    Nothing is metered: an answer's usage is kept as `imported_usage`, informational, never a usage row.
    """
    parsed = await sync_to_async(parse, thread_sensitive=False)(raw)  # a second of CPU: off the event loop
    total = sum(len(data["messages"]) for data in parsed)
    made: list[int] = []
    steps, result, stored, started = _steps(user, parsed), None, 0, time.monotonic()
    try:
        while True:
            try:
                function, args = steps.send(result)
            except StopIteration:
                break
            began = time.monotonic()
            # Shielded: a call under way when the client leaves finishes before the discard below runs.
            call = asyncio.ensure_future(db_threads.run(function)(*args))
            try:
                result = await asyncio.shield(call)
            except asyncio.CancelledError:
                await asyncio.wait([call])
                if not call.cancelled() and call.exception() is None and function is create_conversation:
                    made.append(call.result())
                raise
            if function is create_conversation:
                made.append(result)
            elif function is store_batch:
                stored += len(args[1])
                if stored == len(args[1]):  # the first batch: it is under way
                    log.info("import for user %s: %s of %s messages stored", user.pk, stored, total)
                await asyncio.sleep(db_busy.pause_after(time.monotonic() - began))
    except BaseException:
        # A failed or abandoned import (the client left: this task is cancelled) leaves nothing half-imported.
        await asyncio.shield(discard_between_others(made))
        raise
    log.info("import for user %s: %s conversations, %s messages in %.1f s", user.pk, len(made), total,
             time.monotonic() - started)  # fmt: skip
    return await sync_to_async(lambda: list(Conversation.objects.filter(pk__in=made).order_by("pk")))()
