"""Streams in the admin: live and orphaned ones told apart, stopped or marked interrupted; messages read-only.

A stop is asked through the reply's row (Message.stop_requested): its process, wherever it runs,
stops it within a second (chat/actions/streams.py). "Mark interrupted" ends only orphans, streams no
live process runs (chat/actions/orphans.py): a live one's final save would write over it. Reading a
message here is recorded like reading its conversation (Conversation reads).
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from chat.actions import orphans
from chat.admin.review import shown
from chat.models import ConversationRead, Message, Usage

log = logging.getLogger(__name__)

LIVE, ORPHANED = "live", "orphaned"


class StreamFilter(admin.SimpleListFilter):
    """Streaming rows split in two: live (a process runs the stream) and orphaned (none does)."""

    title = "stream"
    parameter_name = "stream"

    def lookups(self, request, model_admin):
        return [(LIVE, "Streaming, live"), (ORPHANED, "Streaming, orphaned (no live process)")]

    def queryset(self, request, queryset):
        if self.value() not in (LIVE, ORPHANED):
            return queryset
        live = orphans.live_q(usage=queryset.model is Usage)
        streaming = queryset.filter(status=Message.Status.STREAMING)
        return streaming.filter(live) if self.value() == LIVE else streaming.exclude(live)


def stream_state(row) -> str:
    """live, orphaned or "-" (not streaming), for a message or a usage row."""
    if row.status != Message.Status.STREAMING:
        return "-"
    model = type(row)
    live = model.objects.filter(pk=row.pk).filter(orphans.live_q(usage=model is Usage)).exists()
    return LIVE if live else ORPHANED


def _split(queryset) -> tuple[list[int], list[int]]:
    """(reply ids, /v1 usage row ids) of the streaming rows selected."""
    streaming = queryset.filter(status=Message.Status.STREAMING)
    if queryset.model is Message:
        return list(streaming.values_list("pk", flat=True)), []
    replies = list(streaming.filter(message__isnull=False).values_list("message_id", flat=True))
    return replies, list(streaming.filter(message__isnull=True).values_list("pk", flat=True))


class StreamActions:
    """The two actions of the usage rows' and the messages' lists, for staff who may change messages (a stop is
    written on the reply's row); view-only staff see neither."""

    def has_stop_permission(self, request) -> bool:
        return request.user.has_perm("chat.change_message")


@admin.action(description="Stop the selected streams", permissions=["stop"])
def stop_streams(modeladmin, request, queryset):
    replies, api_rows = _split(queryset)
    asked = sum(Message.objects.request_stop(pk) for pk in replies)
    modeladmin.message_user(request, f"Asked {asked} stream(s) to stop; their process stops them within a second.")
    if api_rows:
        modeladmin.message_user(
            request, f"{len(api_rows)} /v1 stream(s) cannot be stopped from here; an orphaned one can be marked "
            "interrupted.", messages.WARNING,
        )  # fmt: skip


@admin.action(description="Mark the selected orphaned streams interrupted", permissions=["stop"])
def mark_interrupted(modeladmin, request, queryset):
    replies, api_rows = _split(queryset)
    ended, api, skipped = orphans.mark_interrupted(replies, api_rows)
    try:
        async_to_sync(orphans.announce_recovered)(ended)  # the watching tabs get `done`
    except Exception as exc:
        log.warning("could not tell the watchers of %d reply(ies) marked interrupted: %r", len(ended), exc)
    modeladmin.message_user(request, f"Marked {len(ended) + api} orphaned stream(s) interrupted.")
    if skipped:
        modeladmin.message_user(
            request, f"{skipped} selected row(s) were live or no longer streaming: stop a live one instead.",
            messages.WARNING,
        )  # fmt: skip


@admin.register(Message)
class MessageAdmin(StreamActions, admin.ModelAdmin):
    """Read-only. The list shows no text; opening a message shows it, and that read is recorded."""

    list_display = ["id", "conversation_link", "owner", "role", "status", "stream", "model", "created", "updated"]
    list_filter = [StreamFilter, "status", "role", "created"]
    search_fields = ["conversation__owner__username", "model"]
    list_select_related = ["conversation__owner"]
    date_hierarchy = "created"
    actions = [stop_streams, mark_interrupted]
    fields = [
        "conversation_link", "owner", "role", "status", "stream", "model", "finish_reason", "error", "content",
        "reasoning", "tool_calls", "thinking_ms", "worker", "stop_requested", "created", "updated",
    ]  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a message goes with its conversation, or from the chat

    @admin.display(description="owner")
    def owner(self, message):
        return message.conversation.owner

    @admin.display(description="conversation")
    def conversation_link(self, message):
        url = reverse("admin:chat_conversation_change", args=[message.conversation_id])
        return format_html('<a href="{}">#{}</a>', url, message.conversation_id)

    @admin.display(description="stream")
    def stream(self, message):
        return stream_state(message)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Staff reading someone's message is recorded, as reading their conversation is."""
        message = self.get_object(request, object_id)
        response = super().change_view(request, object_id, form_url, extra_context)
        if message is not None and shown(request, response):
            ConversationRead.record(message.conversation, request.user, where="admin message")
        return response
