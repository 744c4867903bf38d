"""The usage dashboard's tool calls: how many the period's people made, by server and tool, and how they ended."""

from __future__ import annotations

from django.db.models import Count, Q, Sum

from chat.metering.dashboard import Filters
from chat.models import ToolCall

FAILED = (ToolCall.Outcome.ERROR, ToolCall.Outcome.TIMEOUT, ToolCall.Outcome.INVALID)


def tool_counts(filters: Filters) -> list[dict]:
    """[{server, tool, calls, ok, failed, refused, result_bytes}] for the filters' period, person or group."""
    rows = ToolCall.objects.filter(created__gte=filters.start, created__lt=filters.end)
    if filters.user_id is not None:
        rows = rows.filter(user_id=filters.user_id)
    if filters.group_id is not None:
        rows = rows.filter(user__groups=filters.group_id)
    refused = (ToolCall.Outcome.DENIED, ToolCall.Outcome.FORBIDDEN, ToolCall.Outcome.LIMITED)
    return list(
        rows.values("server", "tool")
        .annotate(
            calls=Count("pk"),
            ok=Count("pk", filter=Q(status=ToolCall.Outcome.OK)),
            failed=Count("pk", filter=Q(status__in=FAILED)),
            refused=Count("pk", filter=Q(status__in=refused)),
            result_bytes=Sum("result_bytes"),
        )
        .order_by("-calls", "server", "tool")
    )
