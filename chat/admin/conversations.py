"""Conversations in the admin: messages with their usage, attachments, filters, and every read recorded."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from chat.admin.review import review_rows, shown
from chat.admin.tools import ToolCallInline
from chat.models import Attachment, Conversation, ConversationRead, Message, Share
from chat.models.attachments import human_size


def attachment_links(attachments) -> str:
    """Each attachment as a download link with its size and kind (the bytes are never shown inline)."""
    return format_html_join(
        mark_safe("<br>"),
        '<a href="{}">{}</a> ({}, {}, ≈{} tokens)',
        ((a.as_json()["url"], a.name, human_size(a.size), a.kind, a.tokens) for a in attachments),
    )


def imported_usage(usage: dict) -> str:
    """An imported answer's usage, as its export said: informational, never metered."""
    parts = [f"{usage.get('prompt_tokens', 0):,} in", f"{usage.get('completion_tokens', 0):,} out"]
    if usage.get("cost") is not None:
        parts.append(f"${usage['cost']}")
    return " · ".join(parts) + " (imported, not billed)"


class MessageInline(admin.StackedInline):
    model = Message
    extra = 0
    classes = ["collapse"]  # folded: the review above shows the messages as the chat does
    verbose_name_plural = "messages, field by field"
    can_delete = False
    fields = [
        "role", "status", "finish_reason", "model", "content", "attached", "reasoning", "thinking_ms", "tool_calls",
        "tool_rounds", "error", "metered", "created",
    ]  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("usages", "attachments")

    @admin.display(description="usage")
    def metered(self, message):
        """The answer's usage as the chat shows it, linked to its usage row."""
        usage = getattr(message, "usage", None)
        if usage is None and message.imported_usage:
            return imported_usage(message.imported_usage)
        if usage is None:
            return "-"
        approx = "≈" if usage.estimated else ""
        parts = [f"{approx}{usage.prompt_tokens:,} in", f"{approx}{usage.completion_tokens:,} out"]
        if usage.reasoning_tokens:
            parts[-1] += f" ({usage.reasoning_tokens:,} reasoning)"
        if usage.cost is not None:
            parts.append(f"${usage.cost} ({usage.get_cost_source_display()})")
        if usage.ttft_ms is not None:
            parts.append(f"TTFT {usage.ttft_ms} ms")
        if usage.tokens_per_second:
            parts.append(f"{usage.tokens_per_second:.1f} tok/s")
        parts.append(usage.status)
        url = reverse("admin:chat_usage_change", args=[usage.pk])
        return format_html('<a href="{}">{}</a>', url, " · ".join(parts))

    @admin.display(description="attachments")
    def attached(self, message):
        return attachment_links(message.attachments.all()) or "-"


@admin.register(Attachment)
class AttachmentAdmin(admin.ModelAdmin):
    """Read-only: what a person attached, the text the model was sent, and a link to download the file."""

    list_display = ["name", "owner", "kind", "size", "tokens", "message", "created"]
    list_filter = ["kind", "created"]
    search_fields = ["name", "owner__username"]
    list_select_related = ["owner"]
    fields = ["download", "owner", "message", "kind", "content_type", "size", "stored_bytes", "tokens", "width",
              "height", "created", "text"]  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="file")
    def download(self, attachment):
        return attachment_links([attachment])

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Staff reading someone's attachment (its text is on this page) is recorded, as a conversation's read is."""
        response = super().change_view(request, object_id, form_url, extra_context)
        if shown(request, response):
            attachment = Attachment.objects.select_related("message__conversation").filter(pk=object_id).first()
            if attachment is not None:
                ConversationRead.record_attachment(attachment, request.user, where="admin attachment")
        return response


class LastAnswerStatusFilter(admin.SimpleListFilter):
    title = "status of the last answer"
    parameter_name = "last_status"

    def lookups(self, request, model_admin):
        return Message.Status.choices

    def queryset(self, request, queryset):
        return queryset.filter(last_status=self.value()) if self.value() else queryset


class FailedAnswersFilter(admin.SimpleListFilter):
    title = "has failed answers"
    parameter_name = "failed"

    def lookups(self, request, model_admin):
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request, queryset):
        return queryset.with_failed_answers(self.value() == "yes") if self.value() else queryset


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["title", "owner", "model", "last_status", "created", "updated"]
    list_filter = [
        ("owner", admin.RelatedOnlyFieldListFilter), "model", LastAnswerStatusFilter, FailedAnswersFilter, "updated",
    ]  # fmt: skip
    search_fields = ["title", "owner__username", "owner__email"]
    list_select_related = ["owner"]
    readonly_fields = ["owner", "model", "params", "created", "updated"]
    fields = ["title", "owner", "model", "system_prompt", "params", "created", "updated", "links"]
    inlines = [MessageInline, ToolCallInline]
    date_hierarchy = "updated"

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "links"]

    def get_queryset(self, request):
        return super().get_queryset(request).with_last_answer_status()

    def has_add_permission(self, request):
        return False  # conversations are had in the chat, not typed in here

    @admin.display(description="last answer", ordering="last_status")
    def last_status(self, conversation):
        return conversation.last_status or "-"

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Staff reading someone's conversation is recorded (listed under Conversation reads).

        Above the raw message fields, the conversation laid out like the chat (chat/admin/review.py).
        """
        conversation = self.get_object(request, object_id)
        if conversation is not None and self.has_view_or_change_permission(request, conversation):
            extra_context = {**(extra_context or {}), "review": self.review(conversation)}
        response = super().change_view(request, object_id, form_url, extra_context)
        if conversation is not None and shown(request, response):
            ConversationRead.record(conversation, request.user)
        return response

    def review(self, conversation) -> list:
        rows = review_rows(conversation)
        inline = MessageInline(Message, self.admin_site)
        for row in rows:
            metered = row.message.usage is not None or row.message.imported_usage
            row.usage = inline.metered(row.message) if metered else ""
            row.attachments = attachment_links(row.message.attachments.all())
        return rows

    @admin.display(description="see also")
    def links(self, conversation):
        """The person (their user page), their figures on the usage dashboard, and this conversation's usage rows."""
        if conversation.pk is None:
            return "-"
        meta = conversation.owner._meta
        person = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[conversation.owner_id])
        dashboard = f"{reverse('usage')}?user={conversation.owner_id}"
        rows = f"{reverse('admin:chat_usage_changelist')}?message__conversation__id__exact={conversation.pk}"
        return format_html(
            '<a href="{}">{}</a> · <a href="{}">{}\'s usage</a> · <a href="{}">usage rows of this conversation</a>',
            person,
            conversation.owner,
            dashboard,
            conversation.owner,
            rows,
        )


@admin.register(ConversationRead)
class ConversationReadAdmin(admin.ModelAdmin):
    list_display = ["read", "reader", "title", "owner", "where"]
    list_filter = [("reader", admin.RelatedOnlyFieldListFilter), ("owner", admin.RelatedOnlyFieldListFilter), "read"]
    search_fields = ["title", "reader__username", "owner__username"]
    date_hierarchy = "read"

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in ConversationRead._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # a record of what happened: not edited

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Share)
class ShareAdmin(admin.ModelAdmin):
    """Every share link, to see what is shared (and publicly) and to revoke one by deleting it."""

    list_display = ["conversation", "owner", "live", "public", "show_usage", "created"]
    list_filter = ["public", "live", ("owner", admin.RelatedOnlyFieldListFilter), "created"]
    search_fields = ["conversation__title", "owner__username"]
    list_select_related = ["conversation", "owner"]
    fields = ["conversation", "owner", "live", "public", "show_usage", "created"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # links are made by their owners, in the chat
