"""MCP servers in the admin: secrets write-only, groups, per-tool settings, a connection test, and the calls made.

Only Streamable HTTP servers are added here; a stdio server runs a command on this host, so it
is declared in MCP_SERVERS_FILE alone and appears here for its groups and tools.
"""

from __future__ import annotations

import orjson
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.utils.html import format_html, format_html_join

from chat.actions import tool_servers
from chat.admin.review import shown
from chat.models import ConversationRead, McpServer, McpTool, ToolCall
from chat.streaming import upstream


class McpServerForm(forms.ModelForm):
    url = forms.URLField(label="URL", max_length=500, required=False, assume_scheme="https")
    # Secrets are write-only: never rendered back into the page.
    bearer = forms.CharField(
        label="Bearer secret", required=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent as “Authorization: Bearer …”. Leave empty to keep the current one.",
    )  # fmt: skip
    new_headers = forms.CharField(
        label="Headers", required=False, widget=forms.Textarea(attrs={"rows": 3}),
        help_text='A JSON object of extra HTTP headers, e.g. {"X-Api-Key": "…"}. Leave empty to keep the current '
        'ones (their names are listed below); {} removes them.',
    )  # fmt: skip
    clear_bearer = forms.BooleanField(required=False, label="Remove the bearer secret")

    class Meta:
        model = McpServer
        fields = ["name", "url", "bearer", "clear_bearer", "new_headers", "groups", "enabled"]

    def clean_bearer(self):
        return self.cleaned_data["bearer"] or (self.instance.bearer if self.instance.pk else "")

    def clean_new_headers(self):
        text = self.cleaned_data["new_headers"].strip()
        if not text:
            return None
        try:
            headers = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise forms.ValidationError("Not valid JSON.") from None
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise forms.ValidationError("A JSON object of header names and string values.")
        return headers

    def clean(self):
        data = super().clean()
        if self.instance.pk and self.instance.transport == McpServer.Transport.STDIO:
            return data
        url = data.get("url")
        if not url:
            self.add_error("url", "A Streamable HTTP server needs its URL (stdio servers: MCP_SERVERS_FILE).")
            return data
        address = upstream.refused_literal(upstream.origin(url)[1])
        if address and not settings.UPSTREAM_ALLOW_LINK_LOCAL:
            self.add_error("url", f"{address} is a link-local or cloud metadata address; it is refused.")
        return data

    def save(self, commit=True):
        server = super().save(commit=False)
        if self.cleaned_data.get("clear_bearer"):
            server.bearer = ""
        if self.cleaned_data.get("new_headers") is not None:
            server.headers = self.cleaned_data["new_headers"]
        if commit:
            server.save()
            self.save_m2m()
        return server


class McpToolInline(admin.TabularInline):
    """Each tool the server listed: on or off, runs at once or asks the person first."""

    model = McpTool
    extra = 0
    fields = ["name", "enabled", "asks_first"]
    readonly_fields = ["name"]
    can_delete = False
    verbose_name_plural = "tools (as the server last listed them)"

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("server")  # each row is titled with its server's name


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    form = McpServerForm
    inlines = [McpToolInline]
    list_display = ["name", "transport", "url", "enabled", "health", "tool_count", "refreshed"]
    list_filter = ["enabled", "health", "transport"]
    search_fields = ["name", "url"]
    filter_horizontal = ["groups"]
    readonly_fields = ["transport", "health", "last_error", "refreshed", "header_names", "tool_list"]
    actions = ["test_connection"]

    def get_fields(self, request, obj=None):
        fields = ["name", "transport", "url", "bearer", "clear_bearer", "new_headers", "header_names", "groups",
                  "enabled", "health", "last_error", "refreshed", "tool_list"]  # fmt: skip
        if obj is not None and obj.transport == McpServer.Transport.STDIO:
            fields = [f for f in fields if f not in ("url", "bearer", "clear_bearer", "new_headers", "header_names")]
        elif obj is not None and not self.has_change_permission(request, obj):
            # Django shows a read-only field's value: staff who may only view get whether a secret is set.
            fields = ["has_bearer" if f == "bearer" else f for f in fields if f not in ("clear_bearer", "new_headers")]
        return fields

    @admin.display(boolean=True, description="bearer secret set")
    def has_bearer(self, server):
        return bool(server.bearer)

    @admin.display(description="header names")
    def header_names(self, server):
        return ", ".join(sorted(server.headers or {})) or "none"

    @admin.display(description="tools")
    def tool_count(self, server):
        return len(server.tools or [])

    @admin.display(description="tools listed")
    def tool_list(self, server):
        return format_html(
            "<ul>{}</ul>",
            format_html_join("", "<li><code>{}</code> {}</li>",
                             ((t.get("name", ""), t.get("description", "")) for t in server.tools or [])),
        )  # fmt: skip

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # Listed once the admin's transaction has committed: a server that takes its MCP_CALL_SECONDS to answer
        # must not hold the database (SQLite's write lock, every chat's saves) meanwhile.
        transaction.on_commit(lambda: self._refresh(request, obj))

    def _refresh(self, request, server: McpServer) -> None:
        error = tool_servers.refresh_now(server)
        server.refresh_from_db()
        if error:
            self.message_user(request, f"“{server.name}” is down: {error}", messages.ERROR)
        else:
            names = ", ".join(t["name"] for t in server.tools) or "no tools"
            self.message_user(request, f"“{server.name}” is up: {names}", messages.SUCCESS)

    @admin.action(description="Test connection (list the tools now)", permissions=["change"])
    def test_connection(self, request, queryset):
        for server in queryset:
            self._refresh(request, server)


class ToolCallInline(admin.TabularInline):
    """A conversation's tool calls, in the admin's review of it."""

    model = ToolCall
    extra = 0
    can_delete = False
    fields = ["created", "message", "server", "tool", "arguments", "status", "error", "result_bytes", "duration_ms"]
    readonly_fields = fields
    verbose_name_plural = "tool calls"

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin):
    """Every tool call made in the chat: who, which server and tool, the arguments, the result's size, how it ended."""

    list_display = ["created", "user", "server", "tool", "status", "result_bytes", "duration_ms", "conversation"]
    list_filter = ["status", "server", "tool"]
    search_fields = ["user__username", "server", "tool"]
    date_hierarchy = "created"
    list_select_related = ["user"]
    readonly_fields = [f.name for f in ToolCall._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """Staff reading a call's arguments (someone's content) is recorded, as reading its conversation is."""
        response = super().change_view(request, object_id, form_url, extra_context)
        if shown(request, response):
            call = ToolCall.objects.select_related("conversation").filter(pk=object_id).first()
            if call is not None:
                ConversationRead.record_tool_call(call, request.user)
        return response
