"""A tool round's database work, on a database thread: the round's stream settled, the next one metered,
the person's calls this minute counted, and every call recorded (ToolCall)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from chat.metering import budgets, metered_streams
from chat.models import Message, Provider, ToolCall, Usage, update_row
from chat.streaming.tool_loop import Call


def settle_round(usage_id: int, usage_key: dict | None, ending: dict[str, Any], message_id: int, content: str,
                 reasoning: str, rounds: list[dict]) -> dict[str, Any]:  # fmt: skip
    """The round's stream ends complete on its usage row; the answer so far and its rounds are saved."""
    with transaction.atomic():
        written = metered_streams.settle(usage_id, ending, usage_key)
        update_row(Message, message_id, {
            "content": content, "reasoning": reasoning, "tool_rounds": rounds, "updated": timezone.now(),
        })  # fmt: skip
    return written


def save_rounds(message_id: int, rounds: list[dict]) -> None:
    """The rounds as they stand (a call approved, a result in), for a reload during the turn."""
    update_row(Message, message_id, {"tool_rounds": rounds})


def open_round(user_id: int, provider_name: str, model: str, message_id: int, prompt_tokens: int, max_tokens: int,
               worker_id: int | None) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """The next request of the turn, metered like any stream: limits, budget reservation, its usage row.

    Raises LimitExceeded or BudgetExceeded (a refusal over budget is kept as a `refused` row)."""
    user = get_user_model().objects.get(pk=user_id)
    provider = Provider.objects.get(name=provider_name)
    try:
        with transaction.atomic():
            metered_streams.admit(user, source=Usage.Source.CHAT)
            row = metered_streams.open_row(
                user, source=Usage.Source.CHAT, provider=provider, model=model, prompt_tokens=prompt_tokens,
                max_tokens=max_tokens, message=Message(pk=message_id), worker_id=worker_id,
            )  # fmt: skip
    except budgets.BudgetExceeded as exc:
        budgets.refuse(user, source=Usage.Source.CHAT, provider_id=provider.pk, model=model, detail=exc.detail)
        raise
    return row.pk, {"provider_id": row.provider_id, "model": row.model, "started": row.started}


# The outcomes of calls that never reached a tool: they use none of the person's calls a minute.
NOT_RUN = (ToolCall.Outcome.LIMITED, ToolCall.Outcome.FORBIDDEN, ToolCall.Outcome.INVALID, ToolCall.Outcome.DENIED)


def take_slots(user_id: int, conversation_id: int, message_id: int, wanted: list[Call]) -> list[int]:
    """Of the person's tool calls this minute (MCP_CALLS_PER_MINUTE), one for each `wanted` call while they last,
    taken: their ToolCall rows, in order.

    Counted and written under the person's row lock (as a stream's start is), so that turns running side by side,
    in any process, cannot each take the same free ones. A row stands as `cancelled` until record() writes how its
    call ended: a process that dies meanwhile leaves it so, which is what became of the call.
    """
    with transaction.atomic():
        metered_streams.lock_person(user_id)
        since = timezone.now() - timedelta(minutes=1)
        made = ToolCall.objects.filter(user_id=user_id, created__gte=since).exclude(status__in=NOT_RUN).count()
        free = max(0, settings.MCP_CALLS_PER_MINUTE - made)
        rows = ToolCall.objects.bulk_create([
            ToolCall(user_id=user_id, conversation_id=conversation_id, message_id=message_id, server=call.server[:40],
                     tool=(call.tool or call.name)[:128], status=ToolCall.Outcome.CANCELLED)
            for call in wanted[:free]
        ])  # fmt: skip
    return [row.pk for row in rows]


def record(user_id: int, conversation_id: int, message_id: int, calls: list[Call]) -> None:
    """Every call of a round in the audit, however it ended: on the row its slot took, or a new one."""
    rows = [
        ToolCall(
            pk=call.slot, user_id=user_id, conversation_id=conversation_id, message_id=message_id,
            server=call.server[:40], tool=(call.tool or call.name)[:128],
            arguments=call.parsed if call.parsed is not None else call.arguments,
            status=call.status if call.status in ToolCall.Outcome.values else ToolCall.Outcome.CANCELLED,
            error=call.error[:2000], result_bytes=min(call.size, 2**31 - 1), duration_ms=call.duration_ms,
        )
        for call in calls
    ]  # fmt: skip
    fields = ["conversation", "message", "server", "tool", "arguments", "status", "error", "result_bytes",
              "duration_ms"]  # fmt: skip
    with transaction.atomic():
        ToolCall.objects.bulk_update([row for row in rows if row.pk is not None], fields)
        ToolCall.objects.bulk_create([row for row in rows if row.pk is None])


def record_ended(user_id: int, conversation_id: int, message_id: int, calls: list[Call]) -> None:
    """A round its turn never recorded (its process stopped), as record() would have: each call on the row its
    slot took, which still stands as take_slots() wrote it (no arguments yet), matched by tool in order."""
    unwritten = list(
        ToolCall.objects.filter(message_id=message_id, arguments__isnull=True)
        .order_by("pk")
        .values_list("pk", "server", "tool")
    )
    for call in calls:
        key = (call.server[:40], (call.tool or call.name)[:128])
        row = next((row for row in unwritten if row[1:] == key), None)
        if row is not None:
            unwritten.remove(row)
            call.slot = row[0]
    record(user_id, conversation_id, message_id, calls)
