"""Tools in the chat: the MCP servers staff connect, their tools' settings, and every call made.

A Streamable HTTP server is registered in the admin; a stdio one (a command run on the host)
only in the file MCP_SERVERS_FILE names, whose servers are copied here at start-up so staff can
set their groups and tools. A server's headers and bearer secret stay on the server: they never
go to a page, a frame or a log line.
"""

from __future__ import annotations

import hashlib
import re

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

# How a tool is named to the model: <server>__<tool>.
NAME_SEPARATOR = "__"
# What OpenAI's and Anthropic's APIs accept as a function's name; MCP allows more (dots, 128 characters).
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAME_HASH = 8  # hex digits that keep a name made to fit distinct
# Two underscores in a server's name would make tool names ambiguous (server a, tool b__c; server a__b, tool c).
ONE_SEPARATOR = RegexValidator(
    NAME_SEPARATOR, inverse_match=True,
    message="Two underscores in a row separate a server's name from its tools' names: use one, or a hyphen.",
)  # fmt: skip


def tool_name(server: str, tool: str) -> str:
    """A tool's name as the model sees it: its server's name, NAME_SEPARATOR, the tool's own (tests__echo).

    One a provider would refuse (files.read, or over 64 characters) is made to fit, the same in every process:
    other characters become _, it is cut, and a hash of the whole name keeps it apart from any other.
    """
    name = f"{server}{NAME_SEPARATOR}{tool}"
    if FUNCTION_NAME.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[: 64 - NAME_HASH - 1]}_{digest}"


class McpServerQuerySet(models.QuerySet):
    def usable_by(self, user):
        """The enabled servers this person may use: all for a superuser, else those open to one of their groups
        (a server with no groups is open to no one but superusers)."""
        servers = self.filter(enabled=True)
        if user.is_superuser:
            return servers
        return servers.filter(groups__in=user.groups.all()).distinct()


class McpServer(models.Model):
    class Transport(models.TextChoices):
        HTTP = "http", "Streamable HTTP"
        STDIO = "stdio", "stdio (from MCP_SERVERS_FILE)"

    class Health(models.TextChoices):
        UNKNOWN = "unknown"
        UP = "up"
        DOWN = "down"

    name = models.SlugField(
        max_length=40, unique=True, validators=[ONE_SEPARATOR],
        help_text="Letters, digits, hyphens and single underscores; the model sees each tool as this name, two "
        "underscores and the tool's name (a server named tests: tests__echo).",
    )  # fmt: skip
    transport = models.CharField(max_length=10, choices=Transport.choices, default=Transport.HTTP)
    url = models.URLField("URL", max_length=500, blank=True, help_text="The server's Streamable HTTP endpoint.")
    headers = models.JSONField(
        default=dict, blank=True,
        help_text='Extra HTTP headers, e.g. {"X-Api-Key": "…"}. Kept on the server: never shown to people or logged.',
    )  # fmt: skip
    bearer = models.CharField(
        "bearer secret", max_length=500, blank=True, help_text="Sent as Authorization: Bearer …; never shown or logged."
    )
    groups = models.ManyToManyField(
        Group, blank=True, related_name="mcp_servers", help_text="Who may use its tools (superusers: always)."
    )
    enabled = models.BooleanField(default=True)
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.UNKNOWN)
    last_error = models.TextField(blank=True)
    # [{"name", "description", "input_schema"}] as the server last listed them.
    tools = models.JSONField(default=list, blank=True)
    refreshed = models.DateTimeField("tools listed at", null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    objects = McpServerQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.name


class McpTool(models.Model):
    """Staff's settings of one tool of a server: on or off, and whether it asks the person first."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tool_settings")
    name = models.CharField(max_length=128)
    enabled = models.BooleanField(default=True)
    asks_first = models.BooleanField(
        "asks the person first", default=False, help_text="Off: runs at once. On: waits for the person's Approve."
    )

    class Meta:
        verbose_name = "MCP tool"
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="one_setting_per_tool")]

    def __str__(self) -> str:
        return tool_name(self.server.name, self.name)


class ToolCall(models.Model):
    """One tool call a model made in a chat turn: who, where, what, how it ended (the audit)."""

    class Outcome(models.TextChoices):
        OK = "ok"
        ERROR = "error"
        TIMEOUT = "timeout"
        INVALID = "invalid"
        DENIED = "denied"
        FORBIDDEN = "forbidden"
        LIMITED = "limited"
        CANCELLED = "cancelled"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="tool_calls")
    conversation = models.ForeignKey(
        "chat.Conversation", null=True, blank=True, on_delete=models.SET_NULL, related_name="tool_calls"
    )
    message = models.ForeignKey(
        "chat.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="tool_call_rows"
    )
    server = models.CharField(max_length=40)
    tool = models.CharField(max_length=128)
    arguments = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Outcome.choices)
    error = models.TextField(blank=True)
    result_bytes = models.PositiveIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["user", "-created"], name="chat_toolcall_user")]

    def __str__(self) -> str:
        return f"{self.server}.{self.tool} ({self.status})"
