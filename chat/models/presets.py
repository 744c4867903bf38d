"""A person's prompt presets (inserted with "/" in the composer) and their defaults for a new chat."""

from __future__ import annotations

from django.conf import settings
from django.db import connection, models
from django.db.models import Q
from django.utils import timezone

from chat.models.base import MODEL_MAX_LENGTH, Read, columns_of, instances_of

MAX_PRESET_TEXT = 20_000  # characters, as a message's system prompt (chat/lib/model_params.py)


class PromptPresetQuerySet(models.QuerySet):
    def visible_to(self, user):
        """The person's own presets and the published ones (everyone's, read-only to them)."""
        return self.filter(Q(owner=user) | Q(published=True)).select_related("owner")

    def owned_by(self, user):
        return self.filter(owner=user)


class PromptPreset(models.Model):
    """A saved prompt: its text, and optionally the system prompt, model and params it starts a chat with."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="prompt_presets")
    name = models.CharField(max_length=100)
    text = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    model = models.CharField(max_length=MODEL_MAX_LENGTH, blank=True, help_text="Empty: the chat's model.")
    params = models.JSONField(
        default=dict, blank=True, help_text="temperature, max_tokens, … (chat/lib/model_params.py)"
    )
    published = models.BooleanField(
        default=False, db_index=True, help_text="Listed for everyone (read-only to them). Only staff may publish."
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(default=timezone.now)

    objects = PromptPresetQuerySet.as_manager()

    class Meta:
        ordering = ["name", "pk"]
        indexes = [models.Index(fields=["owner", "name"])]

    def __str__(self) -> str:
        return self.name

    def as_json(self, user) -> dict:
        """What the page reads; `mine` says whether `user` may change it."""
        return {
            "id": self.pk,
            "name": self.name,
            "text": self.text,
            "system_prompt": self.system_prompt,
            "model": self.model,
            "params": self.params,
            "published": self.published,
            "mine": self.owner_id == user.pk,
            "owner": self.owner.get_username() if self.owner_id != user.pk else None,
        }


class ChatDefaults(models.Model):
    """One person's starting point for every new chat (model, temperature, system prompt); empty: the group's."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="chat_preferences")
    model = models.CharField(max_length=MODEL_MAX_LENGTH, blank=True)
    temperature = models.FloatField(null=True, blank=True)
    system_prompt = models.TextField(blank=True)
    # The MCP tools ("server__tool") switched on in a new chat; None: the group's default, else every tool.
    tools = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "personal chat defaults"
        verbose_name_plural = "personal chat defaults"

    def __str__(self) -> str:
        return f"defaults of {self.user_id}"

    @classmethod
    def of(cls, user) -> ChatDefaults:
        """The person's defaults, unsaved and empty when they set none."""
        return cls.read_of(user).get()

    @classmethod
    def read_of(cls, user) -> Read:
        """of() as a Read. Plain SQL: it runs on every new chat's start, where the ORM's building
        and compiling of this one-row query costs more than running it."""
        quote = connection.ops.quote_name
        user_column = quote(cls._meta.get_field("user").column)
        sql = f"SELECT {columns_of(cls)} FROM {quote(cls._meta.db_table)} WHERE {user_column} = %s"

        def made(rows: list[tuple]) -> ChatDefaults:
            found = instances_of(cls, rows)
            return found[0] if found else cls(user=user)

        return Read(sql, [user.pk], made)

    def as_json(self) -> dict:
        fields = {"model": self.model, "temperature": self.temperature, "system_prompt": self.system_prompt}
        return {**fields, "tools": self.tools}

    def apply(self, model: str | None, params: dict, system_prompt: str | None) -> tuple[str | None, dict, str | None]:
        """A new chat's model, params and system prompt, each from the request when it sent one, else from here."""
        if not model and self.model:
            model = self.model
        if self.temperature is not None and "temperature" not in params:
            params = {**params, "temperature": self.temperature}
        if system_prompt is None and self.system_prompt:
            system_prompt = self.system_prompt
        return model, params, system_prompt
