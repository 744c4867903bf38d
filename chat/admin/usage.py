"""Metering in the admin: usage rows with totals, prices and budgets."""

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from chat.admin.streams import StreamActions, StreamFilter, mark_interrupted, stop_streams
from chat.models import Budget, Price, Usage


@admin.register(Usage)
class UsageAdmin(StreamActions, admin.ModelAdmin):
    list_display = [
        "started",
        "user",
        "source",
        "conversation",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "reasoning_tokens",
        "cost",
        "cost_source",
        "ttft_ms",
        "tokens_per_second",
        "status",
        "estimated",
    ]
    list_filter = [
        StreamFilter,  # the status filter's "streaming" mixes live and orphaned rows
        "source",
        "status",
        "model",
        "estimated",
        "cost_source",
        "cost_estimated",
        "started",
        ("user", admin.RelatedOnlyFieldListFilter),
        ("token", admin.RelatedOnlyFieldListFilter),
    ]
    search_fields = ["user__username", "model", "upstream_id", "request_id"]
    list_select_related = ["user", "message"]
    date_hierarchy = "started"
    actions = [stop_streams, mark_interrupted]

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Usage._meta.fields]

    def lookup_allowed(self, lookup, value, request=None):
        # A conversation's admin page links to its usage rows by this lookup.
        return lookup == "message__conversation__id__exact" or super().lookup_allowed(lookup, value, request)

    @admin.display(description="conversation")
    def conversation(self, usage):
        """A link to the chat's conversation in the admin (API requests have none)."""
        if usage.message is None:
            return "-"
        url = reverse("admin:chat_conversation_change", args=[usage.message.conversation_id])
        return format_html('<a href="{}">#{}</a>', url, usage.message.conversation_id)

    def has_add_permission(self, request):
        return False

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        try:
            queryset = response.context_data["cl"].queryset
        except (AttributeError, KeyError):
            return response  # a redirect or an error page
        response.context_data["totals"] = queryset.totals()
        return response


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Prices per million tokens; add a row with a later effective date for a change, so history keeps its cost."""

    list_display = ["model", "provider", "prompt", "completion", "reasoning", "cached_prompt", "effective_from"]
    list_filter = [("provider", admin.RelatedOnlyFieldListFilter), "effective_from"]
    search_fields = ["model", "provider__name"]
    list_select_related = ["provider"]
    date_hierarchy = "effective_from"


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    """Monthly limits: a user's own wins over their groups' (the most generous group), which win over the default."""

    list_display = ["__str__", "user", "group", "token", "usd", "tokens", "updated"]
    list_filter = [
        ("user", admin.EmptyFieldListFilter),
        ("group", admin.EmptyFieldListFilter),
        ("token", admin.EmptyFieldListFilter),
    ]
    search_fields = ["user__username", "group__name", "token__name", "token__user__username"]
    list_select_related = ["user", "group", "token__user"]
    autocomplete_fields = ["user", "group"]
    raw_id_fields = ["token"]
