"""Staff views: providers (keys write-only), conversations with their messages, usage with totals."""

from asgiref.sync import async_to_sync
from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince

from .models import ApiToken, Attachment, Budget, Conversation, Message, Price, Provider, Usage
from .models.attachments import human_size


class ProviderForm(forms.ModelForm):
    base_url = forms.URLField(label="base URL", max_length=500, assume_scheme="https")
    # The key is write-only: never rendered back into the page.
    api_key = forms.CharField(
        label="API key",
        required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Leave empty to keep the current key.",
    )

    class Meta:
        model = Provider
        fields = [
            "name", "base_url", "api_key", "default_model", "model_list", "image_models", "max_connections", "enabled",
        ]  # fmt: skip

    def clean_api_key(self):
        key = self.cleaned_data["api_key"]
        # Provider.clean() refuses a kept key when the base URL moved to another server.
        self.instance.key_entered = bool(key)
        return key or (self.instance.api_key if self.instance.pk else "")


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    form = ProviderForm
    list_display = ["name", "base_url", "default_model", "enabled", "has_key", "health", "updated"]
    list_filter = ["enabled"]
    search_fields = ["name", "base_url"]
    readonly_fields = ["reached", "last_error", "last_error_at"]
    actions = ["test_connection"]

    @admin.display(boolean=True, description="key set")
    def has_key(self, provider):
        return bool(provider.api_key)

    @admin.display(description="health")
    def health(self, provider):
        """The last success and, if it came after, the last error."""
        if provider.last_error_at and (not provider.reached or provider.last_error_at > provider.reached):
            return format_html(
                '<span class="provider-error" title="{}">error {} ago</span>',
                provider.last_error,
                timesince(provider.last_error_at),
            )
        if provider.reached:
            return format_html('<span class="provider-ok">reached {} ago</span>', timesince(provider.reached))
        return "not tried yet"

    @admin.action(description="Test connection (list the models now)")
    def test_connection(self, request, queryset):
        for provider in queryset:
            reachable, said = async_to_sync(provider.acheck)()
            self.message_user(request, said, messages.SUCCESS if reachable else messages.ERROR)


def attachment_links(attachments) -> str:
    """Each attachment as a download link with its size and kind (the bytes are never shown inline)."""
    return format_html_join(
        mark_safe("<br>"),
        '<a href="{}">{}</a> ({}, {}, ≈{} tokens)',
        ((a.as_json()["url"], a.name, human_size(a.size), a.kind, a.tokens) for a in attachments),
    )


class MessageInline(admin.StackedInline):
    model = Message
    extra = 0
    can_delete = False
    fields = [
        "role", "status", "finish_reason", "model", "content", "attached", "reasoning", "thinking_ms", "tool_calls",
        "error", "metered", "created",
    ]  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("usage").prefetch_related("attachments")

    @admin.display(description="usage")
    def metered(self, message):
        """The answer's usage as the chat shows it, linked to its usage row."""
        usage = getattr(message, "usage", None)
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


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["title", "owner", "model", "created", "updated"]
    list_filter = ["updated"]
    search_fields = ["title", "owner__username", "owner__email"]
    list_select_related = ["owner"]
    readonly_fields = ["owner", "model", "params", "created", "updated"]
    fields = ["title", "owner", "model", "system_prompt", "params", "created", "updated", "links"]
    inlines = [MessageInline]
    date_hierarchy = "updated"

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "links"]

    @admin.display(description="see also")
    def links(self, conversation):
        """The owner's figures on the usage dashboard and this conversation's usage rows."""
        if conversation.pk is None:
            return "-"
        dashboard = f"{reverse('usage')}?user={conversation.owner_id}"
        rows = f"{reverse('admin:chat_usage_changelist')}?message__conversation__id__exact={conversation.pk}"
        return format_html(
            '<a href="{}">{}\'s usage</a> · <a href="{}">usage rows of this conversation</a>',
            dashboard,
            conversation.owner,
            rows,
        )


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Every user's tokens; only a prefix is known here, the secret was shown once to its owner."""

    list_display = ["name", "user", "prefix", "created", "last_used", "revoked"]
    list_filter = [("revoked", admin.EmptyFieldListFilter), ("user", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    list_select_related = ["user"]
    readonly_fields = ["user", "name", "prefix", "created", "last_used", "revoked"]
    fields = readonly_fields
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    # Revoking changes a token: staff who may only view tokens do not get the action.
    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        for token in queryset:
            token.revoke()
        self.message_user(request, f"Revoked {queryset.count()} token(s).")


# --- prices and budgets -------------------------------------------------------


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


class BudgetInline(admin.StackedInline):
    model = Budget
    fk_name = "user"
    fields = ["usd", "tokens"]
    can_delete = True
    verbose_name = "monthly budget"
    verbose_name_plural = "monthly budget (empty: the group's or the default)"


User = get_user_model()
if admin.site.is_registered(User) and isinstance(admin.site._registry[User], UserAdmin):
    # The user admin gains the budget inline; the rest of it stays Django's.
    user_admin = type(admin.site._registry[User])
    admin.site.unregister(User)

    @admin.register(User)
    class UserWithBudgetAdmin(user_admin):
        inlines = [*user_admin.inlines, BudgetInline]
