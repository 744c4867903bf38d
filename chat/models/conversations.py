"""Conversations and their messages, and the start of a turn: the user's message and a streaming reply."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext as _

from .. import upstream
from ..relay import prompt_chars
from .base import MODEL_MAX_LENGTH, ChatError, Status, insert_row, update_row
from .providers import CatalogEntry
from .usage import Usage
from .workers import INTERRUPTED_ERROR, Worker, streaming_worker

log = logging.getLogger(__name__)


# --- conversations and messages -----------------------------------------------


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

    def search(self, query: str):
        """Conversations whose title or any message contains the query."""
        if not query:
            return self
        return self.filter(Q(title__icontains=query) | Q(messages__content__icontains=query)).distinct()


# What a title leaves out of a first line: [[directives]], images, link targets, heading, list,
# quote and emphasis marks, code ticks.
_DIRECTIVE_RE = re.compile(r"\[\[[^\]]*\]\]")
_IMAGE_RE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK_RE = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_LEAD_RE = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-*+]\s+|\d{1,9}[.)]\s+)+")
_MARKS_RE = re.compile(r"(\*\*|__|~~|`+|(?<!\w)[*_](?=\S)|(?<=\S)[*_](?!\w))")


_THINK_RE = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
_TITLE_LABEL_RE = re.compile(r"^\s*title\s*:\s*", re.IGNORECASE)
_TITLE_TRIM = " \t\"'`“”‘’«».:"


def _plain(line: str) -> str:
    line = _DIRECTIVE_RE.sub(" ", line)
    line = _IMAGE_RE.sub(r"\1", line)
    line = _LINK_RE.sub(r"\1", line)
    line = _MARKS_RE.sub("", _LEAD_RE.sub("", line))
    return " ".join(line.split())


class Conversation(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    # Renamed by its owner: a model-written title (chat/titles.py) never replaces theirs.
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
    folder = models.ForeignKey(
        "chat.Folder", null=True, blank=True, on_delete=models.SET_NULL, related_name="conversations"
    )

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated"]
        indexes = [
            models.Index(fields=["owner", "-updated"]),
            # The sidebar's pages: one owner's listed conversations, newest first (chat/organise.py).
            models.Index(fields=["owner", "archived", "pinned", "folder", "-updated", "-id"], name="chat_conv_sidebar"),
        ]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @staticmethod
    def title_for(text: str) -> str:
        """The first line with words, as plain text: no markdown marks, no [[directives]], at most 60 characters."""
        lines = (_plain(line) for line in text.splitlines())
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
        parents = dict(self.messages.values_list("pk", "parent_id"))
        path, pk = [], self.current_id
        while pk is not None and pk in parents:
            path.append(pk)
            pk = parents[pk]
        return path[::-1]

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

    def upstream_messages(self, *, images: bool = False) -> list[dict]:
        """The history in OpenAI's shape: system prompt, then every message with text or attachments.

        A user message's attachments go with it (chat/models/attachments.py): documents as
        delimited text before its words, images as image_url parts when `images` (the model accepts them).
        """
        from .attachments import Attachment, upstream_content

        history: list[dict] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        attached: dict[int, list[Attachment]] = {}
        for attachment in Attachment.objects.filter(message__conversation=self):
            attached.setdefault(attachment.message_id, []).append(attachment)
        on_path = set(self.path_ids())
        for pk, role, content in self.messages.filter(pk__in=on_path).values_list("pk", "role", "content"):
            if pk in attached:
                history.append({"role": role, "content": upstream_content(content, attached[pk], images=images)})
            elif content:
                history.append({"role": role, "content": content})
        return history


class MessageQuerySet(models.QuerySet):
    def streaming(self):
        return self.filter(status=Message.Status.STREAMING)

    def save_partial(self, pk: int, content: str, reasoning: str) -> None:
        """Store a streaming message's text so far (not once it has ended), by a statement compiled once.

        Every stream saves about once a second: the ORM's compiling of the update cost eight
        times its running (370 µs against 45 on SQLite), a few percent of a websocket stream's CPU.
        """
        values = {"content": content, "reasoning": reasoning, "updated": timezone.now()}
        update_row(Message, pk, values, self.db, where={"status": Message.Status.STREAMING})

    def recover_orphans(
        self, lease: timedelta | None = None, *, only: int | None = None, before: datetime | None = None
    ) -> list[Message]:
        """Mark streams whose owning process is dead as interrupted, with estimated usage.

        A stream is orphaned when its worker's lease is older than `lease`; lease=None
        takes every stream not owned by this process (one process, just started), with
        or without a worker. This process's own streams are never touched: it is alive.
        `before` (with lease=None): only streams last written before then, when this process
        began serving; one it started before its lease was registered is its own.
        API usage rows (no message) of dead workers are closed the same way.
        `only` limits the sweep to one message (attach/stop to a stream whose owner is gone).
        """
        now = timezone.now()
        mine = Worker.current_id()
        if lease is None:
            dead = ~Q(worker=mine) | Q(worker__isnull=True) if mine is not None else Q()
        else:
            # A row without a worker predates leases or comes from a process that did not
            # register: only a lone process at start-up (lease=None) may take it as dead.
            dead = Q(worker__heartbeat__lt=now - lease) & ~Q(worker=mine)
        dead_messages, dead_api_rows = dead, dead
        if lease is None and before is not None:
            dead_messages, dead_api_rows = dead & Q(updated__lt=before), dead & Q(started__lt=before)
        with transaction.atomic():
            orphans = self.streaming().filter(dead_messages)
            if only is not None:
                orphans = orphans.filter(pk=only)
            orphans = list(orphans.select_for_update(of=("self",)))
            for message in orphans:
                message.status = Message.Status.INTERRUPTED
                message.error = INTERRUPTED_ERROR
                message.updated = now
                message.save(update_fields=["status", "error", "updated"])
                # A continued answer's earlier streams metered their part of the text already.
                earlier = Usage.objects.filter(message=message).exclude(status=Message.Status.STREAMING)
                before = earlier.aggregate(out=Sum("completion_tokens"), thought=Sum("reasoning_tokens"))
                completion = upstream.estimate_tokens(len(message.content) + len(message.reasoning))
                completion = max(0, completion - (before["out"] or 0))
                reasoning = max(0, upstream.estimate_tokens(len(message.reasoning)) - (before["thought"] or 0))
                Usage.objects.filter(message=message, status=Message.Status.STREAMING).update(
                    status=Message.Status.INTERRUPTED,
                    completion_tokens=completion,
                    reasoning_tokens=reasoning,
                    total_tokens=models.F("prompt_tokens") + completion,
                    estimated=True,
                    ended=now,
                    error=message.error,
                )
            if only is None:
                # API streams keep no text: their usage is closed with what the row has (their checkpoints).
                Usage.objects.filter(dead_api_rows, message__isnull=True, status=Message.Status.STREAMING).update(
                    status=Message.Status.INTERRUPTED, estimated=True, ended=now, error=INTERRUPTED_ERROR
                )
        # The swept rows (chat and API) get the price table's cost, like any final save.
        from ..budgets import price_unpriced  # chat.budgets refers to Usage: imported when needed

        price_unpriced(Usage.objects.filter(status=Message.Status.INTERRUPTED, ended=now, cost__isnull=True))
        return orphans


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


@dataclass(frozen=True)
class Turn:
    conversation: Conversation
    user_message: Message
    reply: Message
    usage: Usage
    history: list[dict[str, str]]
    # A continued answer: its (content, reasoning) before this stream, which appends to them.
    prefix: tuple[str, str] | None = None


# The follow-up turn that asks for the rest of a cut answer (not stored; docs/websocket.md):
# the providers' documents (i14, api14, infyrence) describe no assistant prefill.
CONTINUE_PROMPT = "Continue exactly where your last message stopped. Do not repeat anything already written."


def begin_turn(
    user,
    entry: CatalogEntry,
    params: dict,
    *,
    conversation_id: int | None = None,
    content: str | None = None,
    edit: int | None = None,
    system_prompt: str | None = None,
    worker_id: int | None = None,
    attachments: list[int] | None = None,
    regenerate: int | None = None,
    continued: int | None = None,
) -> Turn:
    """Store the user's message (new, edited, or the last one again) and an empty streaming reply.

    content alone: a new message after the conversation's current one. edit=<id of any user
    message> with content: a sibling of it (same parent, same attachments) with a new reply.
    Neither: a sibling answer to the user message of `regenerate` (an answer or a user message;
    default the current one). continued=<id of the current answer, cut or stopped>: no new
    message; that answer streams again, appending (Turn.prefix), asked with CONTINUE_PROMPT.
    Old branches are kept; `current` becomes the new reply.
    Refused while a reply streams in the conversation: one stream per conversation,
    and over the user's limits (chat/limits.py) or budget (chat/budgets.py), before anything
    is stored; a refusal over budget leaves a `refused` usage row.
    worker_id: the process that will stream the reply (its lease keeps the reply alive).
    attachments: ids of the user's unsent uploads, sent with a new message (chat/models/attachments.py).
    """
    from .. import limits
    from ..budgets import BudgetExceeded, refuse

    try:
        return _begin_turn(
            user,
            entry,
            params,
            conversation_id,
            content,
            edit,
            system_prompt,
            worker_id,
            limits,
            attachments or [],
            regenerate,
            continued,
        )
    except BudgetExceeded as exc:
        refuse(user, source=Usage.Source.CHAT, provider_id=entry.provider.pk, model=entry.model,
               prompt_tokens=exc.prompt_tokens, detail=exc.detail)  # fmt: skip
        raise ChatError(exc.code, exc.detail) from None


def _begin_turn(
    user, entry, params, conversation_id, content, edit, system_prompt, worker_id, limits, attachment_ids,
    regenerate, continued,
) -> Turn:  # fmt: skip
    from ..budgets import BudgetExceeded, reserve
    from .attachments import Attachment, check_message

    images = entry.provider.accepts_images(entry.model)
    with transaction.atomic():
        limits.enforce(user, source=Usage.Source.CHAT)
        attachments = Attachment.objects.for_message(user, attachment_ids) if attachment_ids else []
        if attachments:
            check_message(attachments, content or "")
            if not images and any(a.kind == Attachment.Kind.IMAGE for a in attachments):
                raise ChatError(
                    "images_not_supported",
                    _("%(model)s does not accept images: remove the image, or pick a model that accepts them.")
                    % {"model": entry.model},
                )
        if conversation_id is None:
            title = Conversation.title_for(content or (attachments[0].name if attachments else ""))
            conversation = insert_row(Conversation(owner=user, title=title))
        else:
            conversation = Conversation.objects.owned_by(user).select_for_update().filter(pk=conversation_id).first()
            if conversation is None:
                raise ChatError("not_found", _("No such conversation."))
            if conversation.messages.streaming().exists():
                raise ChatError("busy", _("A reply is still streaming in this conversation; stop it first."))
        reply = prefix = None
        if continued is not None:
            reply = _continued_answer(conversation, continued)
            user_message, prefix = reply.parent, (reply.content, reply.reasoning)
        elif edit is not None:
            edited = conversation.messages.filter(pk=edit, role=Message.Role.USER).first()
            if edited is None:
                raise ChatError("not_found", _("No such message."))
            user_message = conversation.messages.create(role=Message.Role.USER, content=content, parent=edited.parent)
            Attachment.objects.copy_to(user_message, edited.attachments.all())
        elif content is None:
            user_message = _regenerated(conversation, regenerate)
        else:
            # A new conversation's path is this message and its answer: both are stamped as chosen
            # as they are written, instead of by show()'s query and update.
            user_message = insert_row(Message(
                conversation=conversation, role=Message.Role.USER, content=content,
                parent_id=conversation.current_id, chosen=timezone.now() if conversation_id is None else None,
            ))  # fmt: skip
            if attachments:
                Attachment.objects.attach_to(user_message, attachments)
        now = timezone.now()
        # In memory only for now (saved once, below, with the reply as current): the history ends with it.
        # The id, not the row: each message already refers to its conversation, and a reference
        # back would make a cycle that keeps every turn's rows until the garbage collector runs.
        conversation.current_id = (reply or user_message).pk
        conversation.model = entry.qualified
        conversation.updated = now
        if params:
            conversation.merge_params(params)
        if system_prompt is not None:
            conversation.system_prompt = system_prompt
        if conversation_id is None and not attachments:
            # Created just now, it holds only this message: its history needs no query.
            history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
            if content:
                history.append({"role": Message.Role.USER.value, "content": content})
        else:
            history = conversation.upstream_messages(images=images)
        if reply is not None:
            history.append({"role": Message.Role.USER, "content": CONTINUE_PROMPT})
        prompt_tokens = upstream.estimate_tokens(prompt_chars(history))  # chat/relay.py: text and images
        try:
            reservation = reserve(
                user,
                provider_id=entry.provider.pk,
                model=entry.model,
                prompt_tokens=prompt_tokens,
                max_tokens=conversation.params.get("max_tokens") or settings.UPSTREAM_MAX_TOKENS,
            )
        except BudgetExceeded as exc:
            exc.prompt_tokens = prompt_tokens
            raise
        if reply is None:
            reply = insert_row(
                Message(
                    conversation=conversation,
                    parent=user_message,
                    role=Message.Role.ASSISTANT,
                    status=Message.Status.STREAMING,
                    model=entry.model,
                    updated=now,
                    worker_id=worker_id,
                    chosen=user_message.chosen if conversation_id is None else None,
                )
            )
        else:
            reply.status, reply.model, reply.updated = Message.Status.STREAMING, entry.model, now
            reply.worker_id, reply.error, reply.finish_reason = worker_id, "", ""
            reply.save(update_fields=["status", "model", "updated", "worker", "error", "finish_reason"])
        conversation.current_id = reply.pk
        update_row(Conversation, conversation.pk, {
            "current": reply, "model": conversation.model, "updated": now, "params": conversation.params,
            "system_prompt": conversation.system_prompt,
        })  # fmt: skip
        if conversation_id is not None:  # an existing conversation: stamp the branch now shown
            conversation.messages.filter(pk__in=conversation.path_ids()).update(chosen=now)
        usage = insert_row(
            Usage(
                user=user,
                provider=entry.provider,
                message=reply,
                model=entry.model,
                status=Message.Status.STREAMING,
                prompt_tokens=prompt_tokens,
                reserved_usd=reservation.usd,
                reserved_tokens=reservation.tokens,
                worker_id=worker_id,
            )
        )
    return Turn(conversation, user_message, reply, usage, history, prefix)


def _regenerated(conversation: Conversation, pk: int | None) -> Message:
    """The user message a regenerated answer answers: of the answer `pk`, `pk` itself, or of the current one."""
    message = conversation.messages.filter(pk=pk or conversation.current_id).first()
    if pk is not None and message is None:
        raise ChatError("not_found", "No such message.")
    if message is not None and message.role == Message.Role.ASSISTANT:
        message = message.parent
    if message is None or message.role != Message.Role.USER:
        raise ChatError("nothing_to_regenerate", _("There is no message to answer again."))
    return message


def _continued_answer(conversation: Conversation, pk: int) -> Message:
    """The answer `continue` appends to: the current one, cut at the token limit, stopped or interrupted."""
    reply = conversation.messages.filter(pk=pk, role=Message.Role.ASSISTANT).select_related("parent").first()
    if reply is None:
        raise ChatError("not_found", "No such message.")
    if reply.pk != conversation.current_id:
        raise ChatError("not_current", _("Only the last answer of the branch shown can be continued."))
    if not reply.continuable:
        detail = _("Only an answer cut at the token limit, stopped or interrupted can go on.")
        raise ChatError("not_continuable", detail)
    return reply
