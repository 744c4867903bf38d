"""Staff views: providers (keys write-only), conversations with their messages, usage with totals."""

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

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
    list_display = ["name", "base_url", "default_model", "max_connections", "enabled", "has_key", "updated"]
    list_filter = ["enabled"]
    search_fields = ["name", "base_url"]

    @admin.display(boolean=True, description="key set")
    def has_key(self, provider):
        return bool(provider.api_key)


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
    fields = ["role", "status", "finish_reason", "model", "content", "attached", "reasoning", "error", "created"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

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
    fields = ["title", "owner", "model", "system_prompt", "params", "created", "updated"]
    inlines = [MessageInline]
    date_hierarchy = "updated"


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = [
        "started",
        "user",
        "source",
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
    list_select_related = ["user"]
    date_hierarchy = "started"

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in Usage._meta.fields]

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
