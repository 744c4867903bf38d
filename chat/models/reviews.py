"""Review that is recorded: every read of a conversation by someone other than its owner."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ConversationReadQuerySet(models.QuerySet):
    def of(self, conversation):
        """The reads of one conversation, newest first, with their readers."""
        return self.filter(conversation=conversation).select_related("reader").order_by("-read")


class ConversationRead(models.Model):
    """Who read whose conversation, when. Kept when the conversation is deleted (its title and owner stay)."""

    conversation = models.ForeignKey(
        "chat.Conversation", on_delete=models.SET_NULL, null=True, blank=True, related_name="reads"
    )
    title = models.CharField(max_length=200, blank=True, help_text="The conversation's title when it was read.")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="conversations_read_by_others"
    )
    reader = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="reads")
    read = models.DateTimeField(auto_now_add=True, db_index=True)
    where = models.CharField(max_length=40, default="admin", help_text="Which page showed it.")

    objects = ConversationReadQuerySet.as_manager()

    class Meta:
        ordering = ["-read"]

    def __str__(self) -> str:
        return f"{self.reader} read “{self.title}” of {self.owner}"

    @classmethod
    def record_attachment(cls, attachment, reader, where: str) -> ConversationRead | None:
        """A read of someone's attachment (its file or its text), recorded against its conversation if it was sent."""
        if reader.pk == attachment.owner_id:
            return None
        conversation = attachment.message.conversation if attachment.message_id is not None else None
        title = f"{attachment.name} (attachment of “{conversation.title}”)" if conversation else attachment.name
        return cls.objects.create(
            conversation=conversation, title=title[:200], owner_id=attachment.owner_id, reader=reader, where=where,
        )  # fmt: skip

    @classmethod
    def record_tool_call(cls, call, reader) -> ConversationRead | None:
        """A read of someone's tool call (its arguments), recorded against its conversation while it exists."""
        if reader.pk == call.user_id:
            return None
        conversation = call.conversation
        title = f"{call.server}.{call.tool} call" + (f" (in “{conversation.title}”)" if conversation else "")
        return cls.objects.create(
            conversation=conversation, title=title[:200], owner_id=call.user_id, reader=reader, where="admin tool call"
        )

    @classmethod
    def record_owned(cls, owner_id: int, reader, title: str, where: str) -> ConversationRead | None:
        """A read of someone's content that belongs to no conversation (a private preset, their default system
        prompt), recorded with what it was."""
        if reader.pk == owner_id:
            return None
        return cls.objects.create(conversation=None, title=title[:200], owner_id=owner_id, reader=reader, where=where)

    @classmethod
    def record(cls, conversation, reader, where: str = "admin") -> ConversationRead | None:
        """A read by anyone but the owner is recorded; the owner's own reads are not."""
        if reader.pk == conversation.owner_id:
            return None
        return cls.objects.create(
            conversation=conversation, title=conversation.title, owner_id=conversation.owner_id, reader=reader,
            where=where,
        )  # fmt: skip
