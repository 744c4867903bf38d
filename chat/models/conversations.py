"""Conversations and their messages."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce, Greatest, Lower, StrIndex, Substr
from django.utils import timezone
from django.utils.translation import gettext as _

from chat.models.base import MODEL_MAX_LENGTH, Status, update_row
from chat.models.usage import Usage
from chat.models.workers import streaming_worker

log = logging.getLogger(__name__)


# --- conversations and messages -----------------------------------------------


def branch_ids(parent_of: Mapping[int, int | None], end: int | None) -> list[int]:
    """The branch that ends at `end`, root first: `end` and its ancestors, from each message's parent."""
    path, pk = [], end
    while pk is not None and pk in parent_of:
        path.append(pk)
        pk = parent_of[pk]
    return path[::-1]


class ConversationQuerySet(models.QuerySet):
    def owned_by(self, user):
        return self.filter(owner=user)

    def untouched_for(self, days: int):
        """Conversations not updated for `days` days (retention: `manage.py purge`)."""
        return self.filter(updated__lt=timezone.now() - timedelta(days=days))

    def with_last_answer_status(self):
        """Each conversation with `last_status`: the status of its newest answer (None without one)."""
        last = Message.objects.filter(conversation=models.OuterRef("pk"), role=Message.Role.ASSISTANT)
        return self.annotate(last_status=models.Subquery(last.order_by("-created", "-pk").values("status")[:1]))

    def with_failed_answers(self, failed: bool = True):
        """Conversations with (or without) an answer that failed or was interrupted."""
        bad = Message.objects.filter(
            conversation=models.OuterRef("pk"), status__in=[Message.Status.FAILED, Message.Status.INTERRUPTED]
        )
        return self.filter(models.Exists(bad)) if failed else self.exclude(models.Exists(bad))

    def listed(self):
        """What the sidebar lists under its date groups: neither archived, pinned nor in a folder."""
        return self.filter(archived=False, pinned=False, folder__isnull=True)

    def page_after(self, updated, pk: int):
        """The conversations after (older than) the row (updated, pk), in the order newest first."""
        # `updated <= …` alone bounds an index range scan; the OR then only breaks the tie.
        return self.filter(Q(updated__lt=updated) | Q(updated=updated, pk__lt=pk), updated__lte=updated)

    def newest_first(self):
        return self.order_by("-updated", "-pk")

    def excerpts(self, query: str, before: int = 60, after: int = 160) -> dict[int, str]:
        """Each conversation's first message containing `query` (case-insensitive), cut around the match.

        The cut is made by the database (a few hundred characters per conversation, not its messages).
        """
        position = StrIndex(Lower("content"), Lower(models.Value(query)))
        first = (
            Message.objects.filter(conversation=models.OuterRef("pk"))
            .annotate(at=position)
            .filter(at__gt=0)
            .annotate(excerpt=Substr("content", Greatest(models.F("at") - before, 1), before + len(query) + after))
            .order_by("pk")
            .values("excerpt")[:1]
        )
        rows = self.annotate(excerpt=models.Subquery(first)).values_list("pk", "excerpt")
        return {pk: excerpt for pk, excerpt in rows if excerpt}

    def search(self, query: str):
        """Conversations whose title or any message contains the query."""
        if not query:
            return self
        return self.filter(Q(title__icontains=query) | Q(messages__content__icontains=query)).distinct()


# What a title leaves out of a first line: [[directives]], images, link targets, heading, list,
# quote and emphasis marks, code ticks.
_DIRECTIVE_RE = re.compile(r"\[\[[^\]]*\]\]")
_IMAGE_RE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK_RE = re.compile(r"\[([^\]]*)\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+\"[^\"]*\")?\)")  # a (one-level) parens URL
_FENCE_RE = re.compile(r"^\s*(?:```|~~~)")
_LEAD_RE = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,9}[.)]\s+)+")
_MARKS_RE = re.compile(r"(\*\*|__|~~|`+|(?<!\w)[*_](?=\S)|(?<=\S)[*_](?!\w))")


_THINK_RE = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_TITLE_LABEL_RE = re.compile(r"^\s*title\s*:\s*", re.IGNORECASE)
_TITLE_TRIM = " \t\"'`“”‘’«».:"


def _plain(line: str) -> str:
    if line.lstrip().startswith("|"):  # a table's row: its cells; its rule (|---|:--|): nothing
        if set(line.strip()) <= set("|-: "):
            return ""
        line = " ".join(cell.strip() for cell in line.strip().strip("|").split("|"))
    line = _DIRECTIVE_RE.sub(" ", line)
    line = _IMAGE_RE.sub(r"\1", line)
    line = _LINK_RE.sub(r"\1", line)
    line = _MARKS_RE.sub("", _LEAD_RE.sub("", line))
    return " ".join(line.split())


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    # Renamed by its owner: a model-written title (chat/actions/titles.py) never replaces theirs.
    title_locked = models.BooleanField(default=False)
    model = models.CharField(max_length=MODEL_MAX_LENGTH, blank=True, help_text="The model of the last stream.")
    system_prompt = models.TextField(blank=True)
    params = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(default=timezone.now, db_index=True)
    # Messages form a tree (Message.parent); this is the last message of the path last chosen,
    # the one shown and sent upstream.
    current = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The last message of the branch shown.",
    )  # fmt: skip
    # Organising (the sidebar): pinned ones on top, archived ones out of the list but searchable,
    # a folder of the owner's (deleting it leaves its conversations unfiled).
    pinned = models.BooleanField(default=False)
    archived = models.BooleanField(default=False)
    # The MCP tools switched on for this conversation, "server__tool" names; None: every tool the person may use.
    tools = models.JSONField(null=True, blank=True)
    folder = models.ForeignKey(
        "chat.Folder", null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated"]
        indexes = [
            models.Index(fields=["owner", "-updated"]),
            # The sidebar's pages: one owner's listed conversations, newest first (chat/views/sidebar.py).
            models.Index(fields=["owner", "archived", "pinned", "folder", "-updated", "-id"], name="chat_conv_sidebar"),
        ]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @staticmethod
    def title_for(text: str) -> str:
        """The first line with words, as plain text: no markdown marks, no [[directives]], at most 60 characters."""
        # Outside code blocks first: a message that opens with code is titled by its words after it, if any.
        outside, inside, fenced = [], [], False
        for line in text.splitlines():
            if _FENCE_RE.match(line):
                fenced = not fenced
            else:
                (inside if fenced else outside).append(line)
        lines = (_plain(line) for line in (*outside, *inside))
        line = next((line for line in lines if line), _("New chat"))
        return line if len(line) <= 60 else line[:59].rstrip() + "…"

    @staticmethod
    def clean_title(text: str) -> str:
        """A model-written title as plain text: its first line with words, no markdown, quotes or
        [[directives]], no "Title:" label or final full stop, at most 60 characters; "" if none."""
        lines = (_plain(line) for line in _THINK_RE.sub("", text).splitlines())  # some models think aloud
        line = next((line for line in lines if line), "")
        line = _TITLE_LABEL_RE.sub("", line).strip(_TITLE_TRIM)
        return line if len(line) <= 60 else line[:59].rstrip() + "…"

    def merge_params(self, params: dict) -> None:
        """Remember request params on the conversation; None removes a remembered one."""
        merged = {**self.params, **params}
        self.params = {name: value for name, value in merged.items() if value is not None}

    def path_ids(self) -> list[int]:
        """The ids of the messages on the chosen branch, root first: `current` and its ancestors."""
        return branch_ids(dict(self.messages.values_list("pk", "parent_id")), self.current_id)

    def deepest(self, pk: int) -> int:
        """The last message of the branch through `pk`, following at each step the child last shown
        (Message.chosen), else the newest."""
        children: dict[int, int] = {}
        order = (Coalesce("chosen", "created"), "pk")
        for child, parent in self.messages.order_by(*order).values_list("pk", "parent_id"):
            if parent is not None:
                children[parent] = child  # the last wins
        while pk in children:
            pk = children[pk]
        return pk

    def show(self, pk: int | None) -> None:
        """Make `pk` the end of the branch shown (saved) and stamp that branch as chosen now."""
        self.current_id = pk
        self.save(update_fields=["current"])
        self.messages.filter(pk__in=self.path_ids()).update(chosen=timezone.now())

    def siblings(self, ids: list[int]) -> dict[int, list[int]]:
        """For each message in `ids`: its siblings' ids and its own (same parent), oldest first."""
        rows = list(self.messages.order_by("created", "pk").values_list("pk", "parent_id"))
        by_parent: dict[int | None, list[int]] = {}
        for pk, parent in rows:
            by_parent.setdefault(parent, []).append(pk)
        parent_of = dict(rows)
        return {pk: by_parent[parent_of[pk]] for pk in ids if pk in parent_of}

    def path(self) -> list[Message]:
        """The messages on the chosen branch, root first."""
        ids = self.path_ids()
        found = self.messages.in_bulk(ids)
        return [found[pk] for pk in ids]


class MessageQuerySet(models.QuerySet):
    def streaming(self):
        return self.filter(status=Message.Status.STREAMING)

    def save_partial(self, pk: int, content: str, reasoning: str) -> None:
        """Store a streaming message's text so far (not once it has ended), by a statement compiled once.

        Every stream saves about once a second, and the ORM's compiling of the update costs
        several times its running (docs/decisions/0002-hand-written-sql.md).
        """
        values = {"content": content, "reasoning": reasoning, "updated": timezone.now()}
        update_row(Message, pk, values, self.db, where={"status": Message.Status.STREAMING})

    def request_stop(self, pk: int) -> bool:
        """Ask the process streaming this reply to stop it, through the database; False if it no longer streams."""
        return bool(self.streaming().filter(pk=pk).update(stop_requested=True))

    def stops_requested(self, ids: list[int]) -> list[int]:
        """Which of these streaming replies someone asked, through the database, to stop."""
        return list(self.streaming().filter(pk__in=ids, stop_requested=True).values_list("pk", flat=True))


class Message(models.Model):
    class Role(models.TextChoices):
        SYSTEM = "system"
        USER = "user"
        ASSISTANT = "assistant"

    Status = Status  # shared with usage rows (base.py)

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    # The message this one answers or follows; siblings (same parent) are branches:
    # a regenerated answer or an edited user message.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    reasoning = models.TextField(blank=True)
    tool_calls = models.JSONField(null=True, blank=True)
    # A turn's rounds of MCP tool calls (chat/streaming/tool_loop.py): [{"at": offset in content, "calls": [...]}].
    tool_rounds = models.JSONField(null=True, blank=True)
    thinking_ms = models.PositiveIntegerField("time spent thinking (ms)", null=True, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.COMPLETE, db_index=True)
    finish_reason = models.CharField(max_length=30, blank=True)
    error = models.TextField(blank=True)
    model = models.CharField(max_length=MODEL_MAX_LENGTH, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(default=timezone.now, help_text="Last save of the text.")
    # Switching back to a version shows the branch below it as it was last seen (Conversation.deepest).
    chosen = models.DateTimeField(null=True, blank=True, help_text="When it was last on the branch shown.")
    worker = streaming_worker()
    # Set to stop the stream when its process cannot be told through the channel layer (Redis away)
    # or from the admin: the process checks its streams' rows every second (chat/actions/streams.py).
    stop_requested = models.BooleanField(
        default=False, db_default=False, help_text="A stop asked through the database."
    )
    # An imported answer's usage as its export had it: shown and exported again, never metered or billed.
    imported_usage = models.JSONField(null=True, blank=True, help_text="Usage from an import (not billed).")

    objects = MessageQuerySet.as_manager()

    class Meta:
        ordering = ["created", "pk"]

    def __str__(self) -> str:
        return f"{self.role} #{self.pk}"

    @property
    def usage(self) -> Usage | None:
        """The answer's usage: its stream's row, or its streams' rows added up (a continued answer)."""
        rows = list(self.usages.all())
        return Usage.combined(rows) if len(rows) > 1 else (rows[0] if rows else None)

    @property
    def continuable(self) -> bool:
        """An answer cut at the token limit, stopped, or interrupted: `continue` can append to it."""
        if self.role != Message.Role.ASSISTANT or self.tool_calls:
            return False
        return self.finish_reason == "length" or self.status in (Status.STOPPED, Status.INTERRUPTED)
