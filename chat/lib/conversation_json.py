"""One conversation JSON: a message as the page reads it (with its place in the tree), and as an export keeps it."""

from __future__ import annotations

from chat.models import Message


def message_json(message: Message, *, export: bool = False) -> dict:
    """One message as the page reads it; `export`: as a file keeps it (parent by id, usage as imported when not
    metered, attachments by name), with the same keys in the same order as ever."""
    usage = getattr(message, "usage", None)
    metered = usage.as_frame() if usage is not None and message.status != Message.Status.STREAMING else None
    fields = {"id": message.pk}
    if export:
        fields["parent"] = message.parent_id
    fields.update(
        role=message.role,
        content=message.content,
        reasoning=message.reasoning,
        thinking_ms=message.thinking_ms,
        tool_calls=message.tool_calls or None,
        tool_rounds=message.tool_rounds or None,
        status=message.status,
        finish_reason=message.finish_reason if export else message.finish_reason or None,
        error=message.error if export else message.error or None,
        model=message.model,
        created=message.created.isoformat(),
        usage=metered or message.imported_usage if export else metered,
    )
    if export:
        fields["attachments"] = [
            {"name": a.name, "kind": a.kind, "size": a.size, "tokens": a.tokens} for a in message.attachments.all()
        ]
    else:
        fields["attachments"] = [attachment.as_json() for attachment in message.attachments.all()]
    return fields


def branch_json(message: Message, siblings: dict[int, list[int]]) -> dict:
    """Where a message sits in the tree: its parent, its siblings' ids (its own among them), whether it can go on."""
    return {
        "parent": message.parent_id,
        "siblings": siblings.get(message.pk, [message.pk]),
        "continuable": message.continuable,
    }
