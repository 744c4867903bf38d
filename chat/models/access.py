"""Who may use which model: limits to Django groups, and each group's defaults for a new chat.

A model with no limit of its own follows its provider's whole-list limit (a rule with an
empty model); a model with neither is open to everyone. Superusers may use every model.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import Group
from django.db import models

from .base import MODEL_MAX_LENGTH


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

    def allows(self, provider_id: int, model: str) -> bool:
        """Whether this person may use `model` of that provider."""
        if self.everything:
            return True
        allowed = self.rules.get((provider_id, model), self.rules.get((provider_id, "")))
        return allowed is None or bool(allowed & self.groups)


async def access_for(user) -> Access:
    """The limits as they apply to `user` (four small queries: rules, their groups, memberships, defaults)."""
    rules: dict[tuple[int, str], set[int]] = {}
    by_rule: dict[int, tuple[int, str]] = {}
    async for rule in ModelAccess.objects.values("pk", "provider_id", "model"):
        by_rule[rule["pk"]] = (rule["provider_id"], rule["model"])
        rules[by_rule[rule["pk"]]] = set()
    async for link in ModelAccess.groups.through.objects.values("modelaccess_id", "group_id"):
        rules[by_rule[link["modelaccess_id"]]].add(link["group_id"])
    groups = frozenset([pk async for pk in user.groups.values_list("pk", flat=True)])
    default_model = system_prompt = ""
    async for row in (
        GroupDefaults.objects.filter(group__in=groups).order_by("group__name").values("default_model", "system_prompt")
    ):
        default_model = default_model or row["default_model"]
        system_prompt = system_prompt or row["system_prompt"]
    return Access(
        everything=user.is_superuser,
        groups=groups,
        rules={key: frozenset(value) for key, value in rules.items()},
        default_model=default_model,
        system_prompt=system_prompt,
    )
