"""Who may use which model: limits to Django groups, and each group's defaults for a new chat.

A model with no limit of its own follows its provider's whole-list limit (a rule with an
empty model); a model with neither is open to everyone. Superusers may use every model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.contrib.auth.models import Group
from django.db import connection, models

from chat.models.base import MODEL_MAX_LENGTH, Read, read_together


class ModelAccess(models.Model):
    """A provider's model (or, with no model, its whole list) limited to members of some groups."""

    provider = models.ForeignKey("chat.Provider", on_delete=models.CASCADE, related_name="access_rules")
    model = models.CharField(
        max_length=MODEL_MAX_LENGTH,
        blank=True,
        help_text="A model id of this provider. Empty: every model of the provider that has no limit of its own.",
    )
    groups = models.ManyToManyField(
        Group, blank=True, related_name="model_access", help_text="Only members of these groups may use it."
    )

    class Meta:
        verbose_name = "model access limit"
        constraints = [models.UniqueConstraint(fields=["provider", "model"], name="one_access_rule_per_model")]

    def __str__(self) -> str:
        return f"{self.provider_id}/{self.model or '*'}"


class GroupDefaults(models.Model):
    """What a new chat of a group's member starts with; with several groups, the first by name that sets one."""

    group = models.OneToOneField(Group, on_delete=models.CASCADE, related_name="chat_defaults")
    default_model = models.CharField(
        max_length=MODEL_MAX_LENGTH, blank=True, help_text="A model id, or provider/model-id. Empty: the site's."
    )
    system_prompt = models.TextField(blank=True, help_text="Used when a new chat sets none. Empty: none.")
    tools = models.JSONField(
        null=True, blank=True,
        help_text='The MCP tools switched on in a new chat, as a list of "server__tool" names. Empty: every tool '
        "the member may use. A person's own default (their settings page) comes first.",
    )  # fmt: skip

    class Meta:
        verbose_name = "chat defaults"
        verbose_name_plural = "chat defaults"

    def __str__(self) -> str:
        return f"defaults of {self.group_id}"


@dataclass(frozen=True)
class Access:
    """One person's view of the limits: which (provider, model) pairs they may use, and their defaults."""

    everything: bool
    groups: frozenset[int]
    # (provider id, model or "") -> the groups allowed
    rules: dict[tuple[int, str], frozenset[int]]
    default_model: str = ""
    system_prompt: str = ""
    tools: list[str] | None = None  # the group's default MCP tools for a new chat (None: every tool)

    def allows(self, provider_id: int, model: str) -> bool:
        """Whether this person may use `model` of that provider."""
        if self.everything:
            return True
        allowed = self.rules.get((provider_id, model), self.rules.get((provider_id, "")))
        return allowed is None or bool(allowed & self.groups)


def access_of(user) -> Access:
    """The limits as they apply to `user`, in one round trip (see access_reads)."""
    return access_from(user, *read_together(access_reads(user)))


def access_reads(user) -> list[Read]:
    """The two statements access_from() needs: every rule with its groups; the person's groups, with their defaults.

    Plain SQL: it runs on every `/v1` request, where compiling the ORM's queries cost more than running them.
    A caller that reads more at the same moment reads these with it (read_together).
    """
    quote = connection.ops.quote_name
    links = ModelAccess.groups.through._meta
    memberships = Group.user_set.through._meta.db_table
    return [
        Read(
            f"SELECT r.provider_id, r.model, l.group_id FROM {quote(ModelAccess._meta.db_table)} r "
            f"LEFT JOIN {quote(links.db_table)} l ON l.modelaccess_id = r.id",
            [],
        ),
        # The person's groups by name, with the defaults of those that have them.
        Read(
            f"SELECT m.group_id, d.default_model, d.system_prompt, d.tools FROM {quote(memberships)} m "
            f"JOIN {quote(Group._meta.db_table)} g ON g.id = m.group_id "
            f"LEFT JOIN {quote(GroupDefaults._meta.db_table)} d ON d.group_id = m.group_id "
            "WHERE m.user_id = %s ORDER BY g.name",
            [user.pk],
        ),
    ]


def access_from(user, rule_rows: list[tuple], group_rows: list[tuple]) -> Access:
    """The Access made of the rows of access_reads()."""
    rules: dict[tuple[int, str], set[int]] = {}
    for provider_id, model, group_id in rule_rows:
        allowed = rules.setdefault((provider_id, model), set())
        if group_id is not None:
            allowed.add(group_id)
    groups = frozenset(row[0] for row in group_rows)
    default_model = next((row[1] for row in group_rows if row[1]), "")
    system_prompt = next((row[2] for row in group_rows if row[2]), "")
    tools = next((names for row in group_rows if (names := tool_names(row[3])) is not None), None)
    return Access(
        everything=user.is_superuser,
        groups=groups,
        rules={key: frozenset(value) for key, value in rules.items()},
        default_model=default_model,
        system_prompt=system_prompt,
        tools=tools,
    )


def tool_names(value) -> list[str] | None:
    """A stored list of tool names as read by plain SQL (text on SQLite, parsed on PostgreSQL); None if not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(name, str) for name in value):
        return value
    return None
