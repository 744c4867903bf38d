"""A turn's start: the user's message (new, edited, or the last one again) and a streaming reply, metered.

Four kinds of turn, one function each, ending with the same steps (_answer): a new message after
the conversation's current one (in a new conversation without one); an edit, a sibling of any
user message (same parent, same attachments); a regenerated answer, a sibling answer to a user
message; a continued answer, the current one cut or stopped, streaming again and appending. Old
branches are kept; `current` becomes the reply. One stream per conversation. The transaction
is a metered stream's start (chat/metering/metered_streams.py) with the turn's writes before (or,
with uploads, between) its two steps; a new chat's rows, their ids taken ahead on PostgreSQL, go
with its usage row instead, in the start's own transaction, made together with the person's other
starts of that moment. Over the person's limits or budget nothing is stored, and a refusal over budget
leaves a `refused` usage row. open_turn is what a websocket's turn runs on its one trip to a database
thread: the turn's reads (turn_inputs), its model resolved, then begin_turn.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from chat.actions.attachments import check_message, copy_within_quota
from chat.lib.model_params import one_token_limit, token_limit
from chat.metering import budgets, metered_streams
from chat.models import Attachment, ChatError, Conversation, Message, Provider, Usage, insert_row
from chat.models.base import Read, insert_read, update_read
from chat.runtime import id_blocks, kept_reads
from chat.streaming import upstream
from chat.streaming.catalog import CatalogEntry, catalog_of, resolve_in
from chat.streaming.generation import Job
from chat.streaming.history import upstream_messages
from chat.streaming.providers import provider_limit
from chat.streaming.relay import prompt_chars
from chat.streaming.tool_catalog import ToolSpec, tools_for

# The follow-up turn that asks for the rest of a cut answer (not stored; docs/websocket.md):
# the providers' documents (i14, api14, infyrence) describe no assistant prefill.
CONTINUE_PROMPT = "Continue exactly where your last message stopped. Do not repeat anything already written."


@dataclass(frozen=True)
class Turn:
    """A started turn: its conversation, the user's message, the streaming reply, its usage row, the history."""

    conversation: Conversation
    user_message: Message
    reply: Message
    usage: Usage
    history: list[dict[str, str]]
    # A continued answer: its (content, reasoning) before this stream, which appends to them.
    prefix: tuple[str, str] | None = None
    # The MCP tools the reply may call: the owner's, switched on in the conversation, for a model that takes them.
    tools: tuple[ToolSpec, ...] = ()

    def job(self, provider: Provider, model: str, params: dict) -> Job:
        """What the generation streaming the reply needs."""
        conversation, usage = self.conversation, self.usage
        # One token limit goes upstream, the one the reservation (open_row, below) covered.
        payload = upstream.build_payload(
            model, self.history, one_token_limit(params), max_tokens=settings.UPSTREAM_MAX_TOKENS
        )
        return Job(
            conversation_id=conversation.pk,
            message_id=self.reply.pk,
            user_message_id=self.user_message.pk,
            usage_id=usage.pk,
            title=conversation.title,
            provider_name=provider.name,
            base_url=provider.base_url,
            api_key=provider.api_key,
            model=model,
            payload=payload,
            prompt_chars=prompt_chars(self.history),
            max_connections=provider_limit(provider),
            user_id=conversation.owner_id,
            usage_key={"provider_id": usage.provider_id, "model": usage.model, "started": usage.started},
            prefix=self.prefix,
            tools=self.tools,
        )


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """What every kind of turn is asked with: by whom, to which model, in which conversation (None: a new one)."""

    user: Any
    entry: CatalogEntry
    params: dict[str, Any]
    conversation_id: int | None = None
    system_prompt: str | None = None  # None: the conversation keeps its own
    worker_id: int | None = None  # the process that will stream the reply (its lease keeps the reply alive)
    tools: list[str] | None = None  # the MCP tools switched on for the conversation (None: as it was)
    admitted: bool = False  # metered_streams.admit() ran at the transaction's start; else _answer runs it
    ids: tuple[int, int, int] | None = None  # a new chat's ids, taken ahead (begin_turn)

    @cached_property
    def images(self) -> bool:
        """Whether the model accepts images (else they are refused, and left out of the history)."""
        return self.entry.provider.accepts_images(self.entry.model)

    @cached_property
    def takes_tools(self) -> bool:
        """Whether the model takes tools (else earlier answers' calls reach it as text, not as tool messages)."""
        return self.entry.provider.takes_tools(self.entry.model)


def turn_inputs(user, conversation_id: int | None) -> tuple:
    """What a turn's start reads before it resolves its model.

    An existing conversation's model (None: not this user's), a new chat's defaults (None for an
    existing one), what the user may use, the enabled providers, and on PostgreSQL a new chat's
    ids taken ahead (its conversation's, its message's and its reply's; else None): begin_turn
    then sends their inserts with the lock, in one round trip.
    """
    # In one round trip (read_together): they do not depend on each other. What the user may use, the enabled
    # providers and the person's defaults are read only when this process does not keep them
    # (chat/runtime/kept_reads.py), and a new chat's ids only when its block is used up (chat/runtime/id_blocks.py):
    # a new chat's start often sends nothing here.
    if conversation_id is None:
        ids = id_blocks.take(Conversation, Message, Message)
        refill = id_blocks.refill(Conversation, Message, Message) if ids is None else None
        kept = kept_reads.start_inputs(user, [refill] if refill is not None else [], defaults=True)
        if refill is not None:
            ids = kept.made[0]
        return None, kept.defaults, kept.access, kept.providers, ids
    models = Conversation.objects.owned_by(user).filter(pk=conversation_id).values_list("model")
    first = Read(*models.query.sql_with_params(), make=lambda rows: rows[0][0] if rows else None)
    kept = kept_reads.start_inputs(user, [first])
    return kept.made[0], None, kept.access, kept.providers, None


def open_turn(user, model: str | None, params: dict, catalog: list | None, *, conversation_id: int | None,
              **turn) -> tuple:  # fmt: skip
    """A turn's whole start on the database, in one trip to a database thread: (Turn, CatalogEntry).

    The model asked for, else the conversation's, else (a new chat) the person's default, is
    resolved in `catalog`, or, without one, in the model lists this process holds (ModelListNotCached
    if one is missing: the caller fetches them and calls again with the catalog). Then
    begin_turn stores the turn; `turn` is its keyword arguments.
    """
    stored, defaults, access, providers, ids = turn_inputs(user, conversation_id)
    if conversation_id is not None:
        if stored is None:
            raise ChatError("not_found", _("No such conversation."))
        model = model or stored
    asked = model
    if defaults is not None:  # a new chat: what it does not set comes from the person's defaults
        model, params, turn["system_prompt"] = defaults.apply(model, params, turn.get("system_prompt"))
    catalog = catalog_of(providers, catalog)
    try:
        entry = resolve_in(catalog, model, access)
    except ChatError:
        if model == asked:
            raise
        entry = resolve_in(catalog, asked, access)  # a default model no longer offered
    if conversation_id is None and turn.get("system_prompt") is None and access.system_prompt:
        turn["system_prompt"] = access.system_prompt  # the group's default for a new chat
    if defaults is not None and turn.get("tools") is None:  # a new chat's tools: the person's, else the group's
        chosen = defaults.tools if defaults.tools is not None else access.tools
        turn["tools"] = list(chosen) if chosen is not None else None  # the kept defaults' list stays as it is
    return begin_turn(user, entry, params, conversation_id=conversation_id, ids=ids, **turn), entry


def begin_turn(user, entry: CatalogEntry, params: dict, *, conversation_id: int | None = None,
               content: str | None = None, edit: int | None = None, system_prompt: str | None = None,
               worker_id: int | None = None, attachments: list[int] | None = None, regenerate: int | None = None,
               continued: int | None = None, tools: list[str] | None = None,
               ids: tuple[int, int, int] | None = None) -> Turn:  # fmt: skip
    """Store the user's message and an empty streaming reply, in one transaction.

    content alone: a new message (`attachments`: ids of the user's unsent uploads, sent with it).
    edit=<id of a user message> with content: an edit. Neither: a regenerated answer to the user
    message of `regenerate` (an answer or a user message; default the current one).
    continued=<id of the current answer>: a continued answer, asked with CONTINUE_PROMPT.
    `ids`: a new chat's conversation, message and reply ids, taken ahead (chat/runtime/id_blocks.py), so that their
    inserts go with its usage row, in the metered start's last round trip.
    """
    # The person's row is locked (chat/metering/metered_streams.py: admit) for the start's last steps only,
    # just before its usage row, so that a person's turns starting together wait for each other's
    # start and not for their messages' writes (an existing conversation is locked by itself, below).
    # A turn with uploads takes it first: their quota and their unsent state are the person's.
    early = bool(attachments) or edit is not None
    # A new chat's message without uploads, its ids taken ahead: nothing is read or written before the
    # metered stream's start, whose own transaction writes its rows (_answer), made together with the
    # person's other starts of that moment. Elsewhere the ids go unused.
    ahead = ids is not None and conversation_id is None and not attachments and content is not None
    request = TurnRequest(user=user, entry=entry, params=params, conversation_id=conversation_id,
                          system_prompt=system_prompt, worker_id=worker_id, tools=tools, admitted=early,
                          ids=ids if ahead else None)  # fmt: skip
    try:
        with transaction.atomic() if not ahead else nullcontext():
            if early:
                # The metered stream's start, first step: the person's row locked and their limits checked
                # before anything is read or written. Otherwise in _answer; a refusal rolls back either way.
                metered_streams.admit(user, source=Usage.Source.CHAT)
            if continued is not None:
                turn = _continue(request, continued)
            elif edit is not None:
                turn = _edit(request, edit, content)
            elif content is None:
                turn = _regenerate(request, regenerate)
            else:
                turn = _new_message(request, content, attachments or [])
    except budgets.BudgetExceeded as exc:
        budgets.refuse(user, source=Usage.Source.CHAT, provider_id=entry.provider.pk, model=entry.model,
                       detail=exc.detail)  # fmt: skip
        raise ChatError(exc.code, exc.detail) from None
    # After the commit, which went with the usage row (metered_streams.open_row), not under the person's lock.
    # Checked here, on every kind of turn, for the conversation's owner: no frame names a tool.
    if entry.provider.takes_tools(entry.model):
        turn = replace(turn, tools=tools_for(user, turn.conversation.tools))
    return turn


# --- the four kinds of turn ----------------------------------------------------


def _new_message(request: TurnRequest, content: str, attachment_ids: list[int]) -> Turn:
    """A new message after the conversation's current one, with the uploads `attachment_ids`."""
    attachments = _attachments(request, content, attachment_ids)
    new = request.conversation_id is None
    # A new chat's rows with their ids taken ahead are written with its usage row (_answer).
    ahead = [] if request.ids is not None else None
    if new:
        title = Conversation.title_for(content or (attachments[0].name if attachments else ""))
        conversation = _written(Conversation(owner=request.user, title=title), ahead, request, 0)
    else:
        conversation = _conversation(request)
    # A new conversation's path is this message and its answer: both are stamped as chosen
    # as they are written, instead of by show()'s query and update.
    user_message = _written(Message(
        conversation=conversation, role=Message.Role.USER, content=content,
        parent_id=conversation.current_id, chosen=timezone.now() if new else None,
    ), ahead, request, 1)  # fmt: skip
    if attachments:
        Attachment.objects.attach_to(user_message, attachments)
    return _answer(request, conversation, user_message, alone=new and not attachments, ahead=ahead)


def _written(row, ahead: list | None, request: TurnRequest, index: int):
    """`row` inserted now, or (`ahead` a list) given its id taken ahead and kept in `ahead` for the usage row."""
    if ahead is None:
        return insert_row(row)
    row.pk = request.ids[index]
    ahead.append(row)
    return row


def _edit(request: TurnRequest, pk: int, content: str | None) -> Turn:
    """A sibling of the user message `pk`: same parent, same attachments, the new content."""
    conversation = _conversation(request)
    edited = conversation.messages.filter(pk=pk, role=Message.Role.USER).first()
    if edited is None:
        raise ChatError("not_found", _("No such message."))
    user_message = conversation.messages.create(role=Message.Role.USER, content=content, parent=edited.parent)
    copy_within_quota(request.user, user_message, list(edited.attachments.all()))
    return _answer(request, conversation, user_message)


def _regenerate(request: TurnRequest, pk: int | None) -> Turn:
    """A sibling answer to the user message of `pk` (an answer or a user message; default the current one)."""
    conversation = _conversation(request)
    return _answer(request, conversation, _regenerated(conversation, pk))


def _continue(request: TurnRequest, pk: int) -> Turn:
    """No new message: the answer `pk` streams again, appending (Turn.prefix)."""
    conversation = _conversation(request)
    reply = _continued_answer(conversation, pk)
    return _answer(request, conversation, reply.parent, continued=reply)


# --- their steps ------------------------------------------------------------------


def _conversation(request: TurnRequest) -> Conversation:
    """The person's conversation, locked; not_found for anyone else's, busy while a reply streams in it."""
    owned = Conversation.objects.owned_by(request.user).select_for_update()
    conversation = owned.filter(pk=request.conversation_id).first()
    if conversation is None:
        raise ChatError("not_found", _("No such conversation."))
    if conversation.messages.streaming().exists():
        raise ChatError("busy", _("A reply is still streaming in this conversation; stop it first."))
    return conversation


def _attachments(request: TurnRequest, content: str, ids: list[int]) -> list[Attachment]:
    """The person's unsent uploads `ids`, checked against the per-message limits and the model."""
    attachments = Attachment.objects.for_message(request.user, ids) if ids else []
    if attachments:
        check_message(attachments, content or "")
        if not request.images and any(a.kind == Attachment.Kind.IMAGE for a in attachments):
            raise ChatError(
                "images_not_supported",
                _("%(model)s does not accept images: remove the image, or pick a model that accepts them.")
                % {"model": request.entry.model},
            )
    return attachments


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


def _answer(request: TurnRequest, conversation: Conversation, user_message: Message, *,
            continued: Message | None = None, alone: bool = False, ahead: list | None = None) -> Turn:  # fmt: skip
    """Every turn's end: the conversation's settings, the history, the streaming reply, its reserved usage row.

    `alone`: the conversation was created with this message and holds nothing else. `ahead`: rows
    with ids taken ahead, not yet written (_written): the reply joins them, and they go with the usage row.
    """
    entry = request.entry
    now = timezone.now()
    # In memory only for now (saved once, below, with the reply as current): the history ends with it.
    # The id, not the row: each message already refers to its conversation, and a reference
    # back would make a cycle that keeps every turn's rows until the garbage collector runs.
    conversation.current_id = (continued or user_message).pk
    conversation.model = entry.qualified
    conversation.updated = now
    if request.params:
        conversation.merge_params(request.params)
    if request.system_prompt is not None:
        conversation.system_prompt = request.system_prompt
    if request.tools is not None:
        conversation.tools = request.tools
    history = _history(request, conversation, user_message if alone else None)
    if continued is not None:
        history.append({"role": Message.Role.USER, "content": CONTINUE_PROMPT})
    reply = _streaming_reply(request, conversation, user_message, continued, now, ahead)
    conversation.current_id = reply.pk

    def saved() -> Read:
        return update_read(Conversation, conversation.pk, {
            "current": reply, "model": conversation.model, "updated": now, "params": conversation.params,
            "system_prompt": conversation.system_prompt, "tools": conversation.tools,
        })  # fmt: skip

    if request.conversation_id is not None:  # an existing conversation: stamp the branch now shown
        conversation.messages.filter(pk__in=conversation.path_ids()).update(chosen=now)
    metered = dict(
        source=Usage.Source.CHAT, provider=entry.provider, model=entry.model,
        prompt_tokens=upstream.estimate_tokens(prompt_chars(history)),  # chat/streaming/relay.py: text and images
        max_tokens=token_limit(one_token_limit(conversation.params), settings.UPSTREAM_MAX_TOKENS),
        message=reply, worker_id=request.worker_id, started=now,
    )  # fmt: skip
    if ahead is not None:  # nothing written yet: the rows go with the usage row, if the start is admitted
        # The new conversation's insert carries what saved() sets (its reply as current, whose foreign
        # key is checked at the commit, and its settings): a statement less.
        usage = metered_streams.start(request.user, before=[insert_read(row) for row in ahead], **metered)
    else:
        read = None
        if request.admitted:
            saved().get()
        else:  # the turn's writes go with the lock and the start's reads, in one round trip on PostgreSQL
            read = metered_streams.admit(request.user, source=Usage.Source.CHAT, provider=entry.provider,
                                         model=entry.model, now=now, before=[saved()])  # fmt: skip
        # The metered stream's start, last step (after admit()): reservation, usage row.
        usage = metered_streams.open_row(request.user, read=read, **metered)
    prefix = (continued.content, continued.reasoning) if continued is not None else None
    return Turn(conversation, user_message, reply, usage, history, prefix)


def _history(request: TurnRequest, conversation: Conversation, alone: Message | None) -> list[dict]:
    """What goes upstream: the system prompt and the chosen branch; `alone`, a new conversation's only message."""
    if alone is None:
        return upstream_messages(conversation, images=request.images, tools=request.takes_tools)
    # Created just now, the conversation holds only this message: its history needs no query.
    history = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    if alone.content:
        history.append({"role": Message.Role.USER.value, "content": alone.content})
    return history


def _streaming_reply(request: TurnRequest, conversation: Conversation, user_message: Message,
                     continued: Message | None, now, ahead: list | None = None) -> Message:  # fmt: skip
    """The reply, streaming: a new answer to `user_message`, or the `continued` one again."""
    entry = request.entry
    if continued is None:
        return _written(Message(
            conversation=conversation, parent=user_message, role=Message.Role.ASSISTANT,
            status=Message.Status.STREAMING, model=entry.model, updated=now, worker_id=request.worker_id,
            chosen=user_message.chosen if request.conversation_id is None else None,
        ), ahead, request, 2)  # fmt: skip
    continued.status, continued.model, continued.updated = Message.Status.STREAMING, entry.model, now
    continued.worker_id, continued.error, continued.finish_reason = request.worker_id, "", ""
    continued.stop_requested = False  # an earlier stream's stop is not this one's
    continued.save(update_fields=["status", "model", "updated", "worker", "error", "finish_reason", "stop_requested"])
    return continued
