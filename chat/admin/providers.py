"""Providers in the admin: the key write-only, models limited to groups, health and a connection test."""

from asgiref.sync import async_to_sync
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.utils.html import format_html
from django.utils.timesince import timesince

from chat.models import ModelAccess, Provider
from chat.streaming import upstream
from chat.streaming.providers import check as check_provider


class ProviderForm(forms.ModelForm):
    base_url = forms.URLField(label="Base URL", max_length=500, assume_scheme="https")
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
            "name", "base_url", "api_key", "default_model", "model_list", "image_models", "tool_models",
            "max_connections",
            "enabled",
        ]  # fmt: skip

    def clean_api_key(self):
        key = self.cleaned_data["api_key"]
        # A key typed again, even the same one, counts as entered again (clean() below).
        self.key_entered = bool(key)
        return key or (self.instance.api_key if self.instance.pk else "")

    def clean(self):
        """Refuse link-local and metadata hosts, and a stored key following the base URL to another server."""
        data = super().clean()
        base_url = data.get("base_url")
        if not base_url:
            return data
        address = upstream.refused_literal(upstream.origin(base_url)[1])
        if address and not settings.UPSTREAM_ALLOW_LINK_LOCAL:
            self.add_error(
                "base_url",
                f"{address} is a link-local or cloud metadata address; such upstreams are refused "
                "(UPSTREAM_ALLOW_LINK_LOCAL=1 allows them).",
            )
        stored = self.instance.pk and Provider.objects.filter(pk=self.instance.pk).values("base_url", "api_key").first()
        if (
            stored
            and not getattr(self, "key_entered", False)
            and stored["api_key"]
            and data.get("api_key") == stored["api_key"]
            and upstream.origin(stored["base_url"]) != upstream.origin(base_url)
        ):
            self.add_error(
                "api_key",
                "The base URL now points at another server (its scheme, host or port changed): "
                "enter the API key again, so the stored key is not sent there.",
            )
        return data


class ModelAccessInline(admin.TabularInline):
    """Who may use this provider's models: a row per limited model, or one with no model for the whole list."""

    model = ModelAccess
    extra = 0
    fields = ["model", "groups"]
    filter_horizontal = ["groups"]
    verbose_name_plural = "limited to groups (no row: everyone may use every model)"


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    form = ProviderForm
    inlines = [ModelAccessInline]
    list_display = ["name", "base_url", "default_model", "enabled", "has_key", "health", "updated"]
    list_filter = ["enabled"]
    search_fields = ["name", "base_url"]
    readonly_fields = ["reached", "last_error", "last_error_at"]
    actions = ["test_connection"]

    @admin.display(boolean=True, description="key set")
    def has_key(self, provider):
        return bool(provider.api_key)

    def get_fields(self, request, obj=None):
        """Staff who may only view get "key set", not the key: Django shows a read-only field's value."""
        fields = super().get_fields(request, obj)
        if obj is not None and not self.has_change_permission(request, obj):
            fields = ["has_key" if name == "api_key" else name for name in fields]
        return fields

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

    @admin.action(description="Test connection (list the models now)", permissions=["change"])
    def test_connection(self, request, queryset):
        for provider in queryset:
            reachable, said = async_to_sync(check_provider)(provider)
            self.message_user(request, said, messages.SUCCESS if reachable else messages.ERROR)
