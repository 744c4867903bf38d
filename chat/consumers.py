"""The chat websocket (protocol in docs/websocket.md): validate a frame, then delegate."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import orjson
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from channels.sessions import InstanceSessionWrapper
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _

from . import busy, db, generation, process, sessions
from .fields import parse_attachments, parse_content, parse_id, parse_params, parse_system_prompt
from .generation import Job, conversation_group, frame, snapshot_frames
from .language import language_from_scope
from .limits import FRAME_LIMIT_CLOSE_CODE, FrameLimiter
from .models import (
    ChatDefaults,
    ChatError,
    Conversation,
    Message,
    Provider,
    access_of,
    begin_turn,
    branches,
    cached_catalog,
    resolve_in,
    with_catalog,
)

# Frames that start a stream re-check the session first (cached for CHAT_SESSION_CHECK_SECONDS).
SESSION_CHECKED_FRAMES = frozenset({"send", "regenerate", "edit", "continue"})
SIGNED_OUT = 4401  # the close code the page answers by going to the sign-in page

log = logging.getLogger(__name__)

# An attaching socket waits this long for the owner's snapshot, then shows the saved text:
# an owner killed a moment ago still holds its lease but will never answer.
SNAPSHOT_WAIT = 3.0
# attaching[reply] when the snapshot came from the database: no delta lines up with it.
FROM_DATABASE = -1


def turn_inputs(user, conversation_id: int | None) -> tuple:
    """What a turn's start reads before it resolves its model.

    An existing conversation's model (None: not this user's), a new chat's defaults (None for an
    existing one), what the user may use, and the enabled providers.
    """
    stored = defaults = None
    if conversation_id is None:
        defaults = ChatDefaults.of(user)
    else:
        models = Conversation.objects.owned_by(user).filter(pk=conversation_id).values_list("model", flat=True)
        stored = models.first()
    return stored, defaults, access_of(user), Provider.objects.enabled_list()


def open_turn(user, model: str | None, params: dict, catalog: list | None, *, conversation_id: int | None,
              **turn) -> tuple:  # fmt: skip
    """A turn's whole start on the database, in one trip to a database thread: (Turn, CatalogEntry).

    The model asked for, else the conversation's, else (a new chat) the person's default, is
    resolved in `catalog`, or, without one, in the model lists this process holds (CatalogCold
    if one is missing: the caller fetches them and calls again with the catalog). Then
    begin_turn stores the turn; `turn` is its keyword arguments.
    """
    stored, defaults, access, providers = turn_inputs(user, conversation_id)
    if conversation_id is not None:
        if stored is None:
            raise ChatError("not_found", _("No such conversation."))
        model = model or stored
    asked = model
    if defaults is not None:  # a new chat: what it does not set comes from the person's defaults
        model, params, turn["system_prompt"] = defaults.apply(model, params, turn.get("system_prompt"))
    if catalog is None:
        catalog = cached_catalog(providers)
    try:
        entry = resolve_in(catalog, model, access)
    except ChatError:
        if model == asked:
            raise
        entry = resolve_in(catalog, asked, access)  # a default model no longer offered
    if conversation_id is None and turn.get("system_prompt") is None and access.system_prompt:
        turn["system_prompt"] = access.system_prompt  # the group's default for a new chat
    return begin_turn(user, entry, params, conversation_id=conversation_id, **turn), entry


async def dispatch_all(receivers, dispatch) -> None:
    """channels.utils.await_many_dispatch, without a task and an asyncio.wait per message.

    Channels waits on one task per source with asyncio.wait and makes a new task for every
    message (a delta costs three task steps and the wait's callbacks). Here one reader task
    per source dispatches what it reads itself, taking turns by a lock: still one message at
    a time in the order they came (the lock is fair), and a source reads its next message
    only once the last one was dispatched (so a layer's capacity still limits a socket that
    does not keep up). A delta costs one task step. A reader's error (StopConsumer included)
    is raised here, as Channels raises it; on the way out the readers are cancelled.
    """
    turn = asyncio.Lock()

    async def read(receive) -> None:
        while True:
            message = await receive()
            async with turn:
                await dispatch(message)

    readers = [asyncio.ensure_future(read(receive)) for receive in receivers]
    try:
        done, _ = await asyncio.wait(readers, return_when=asyncio.FIRST_EXCEPTION)
        for reader in done:
            reader.result()
    finally:
        for reader in readers:
            reader.cancel()
        # Their endings (cancelled, or the error raised above) are not raised again.
        await asyncio.gather(*readers, return_exceptions=True)
        # The error raised above keeps this frame (in its traceback), and the frame the readers,
        # one of which keeps the error: a cycle that held a closed socket's consumer, its session
        # and all they refer to until the garbage collector's next full pass.
        readers = done = reader = None


class ChatConsumer(AsyncJsonWebsocketConsumer):
    """One browser tab: it sends messages, stops and attaches to streams, and watches conversations."""

    async def __call__(self, scope, receive, send) -> None:
        # channels.consumer.AsyncConsumer.__call__ with dispatch_all for await_many_dispatch.
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        self.base_send = send
        # A delta frame skips Channels' session wrapper, which acts on http.response.start only
        # but reads the (lazy) session and the settings on every message it passes on.
        wrapper = getattr(send, "__self__", None)
        saves_on = getattr(wrapper, "save_message_types", None)
        self.frame_send = (
            wrapper.real_send
            if isinstance(wrapper, InstanceSessionWrapper) and "websocket.send" not in (saves_on or ())
            else send
        )
        try:
            await dispatch_all([receive, self.channel_receive] if self.channel_layer is not None else [receive],
                               self.dispatch)  # fmt: skip
        except StopConsumer:
            pass

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accepted then closed: a refused handshake reaches the page as 1006, not as this code.
            await self.accept()
            await self.close(code=SIGNED_OUT)
            return
        self.user = user
        self.language = language_from_scope(self.scope)
        self.session_key = self.scope["session"].session_key
        self.session_checked = time.monotonic()
        self.watching: set[int] = set()
        # reply id -> seq of the snapshot this socket got (None: waiting for it)
        self.attaching: dict[int, int | None] = {}
        self.waits: set[asyncio.Task] = set()
        self.frames = FrameLimiter(
            settings.CHAT_FRAME_RATE, settings.CHAT_FRAME_BURST, asyncio.get_running_loop().time()
        )
        self.closing = False
        sessions.socket_opened(user.pk)
        try:
            await self.channel_layer.group_add(sessions.user_group(user.pk), self.channel_name)
        except Exception as exc:  # the socket still works; the per-frame session check still holds
            log.warning("could not add a socket of user %s to its user group: %r", user.pk, exc)
        await self.accept()
        await process.ensure_started()

    async def dispatch(self, message: dict) -> None:
        # Channels closes stale database connections on its shared sync thread before every
        # message (and at disconnect): a thread hop per message, which could queue every socket
        # behind a write waiting for SQLite's lock. This consumer's database work all runs on
        # chat/db.py's threads, which look after their own connections, so there is nothing
        # for it to close; the per-token events skip even the handler's lookup.
        if message["type"] in FAST_EVENTS:
            await FAST_EVENTS[message["type"]](self, message)
            return
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict) -> None:
        # Channels' own also discards self.groups (none here) and closes stale connections (see dispatch).
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code: int) -> None:
        for wait in getattr(self, "waits", ()):
            wait.cancel()
        if hasattr(self, "user"):
            sessions.socket_closed(self.user.pk)
            try:
                await self.channel_layer.group_discard(sessions.user_group(self.user.pk), self.channel_name)
            except Exception as exc:  # the membership expires with the layer's group expiry
                log.warning("could not remove a socket of user %s from its user group: %r", self.user.pk, exc)
        for conversation_id in getattr(self, "watching", ()):
            await self.channel_layer.group_discard(conversation_group(conversation_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        # Errors in the page's language; a stream started here keeps it (its task copies the context).
        with translation.override(getattr(self, "language", None)):
            await self.receive_frame(text_data)

    async def receive_frame(self, text_data: str | None) -> None:
        if not await self.within_frame_rate():
            return
        try:
            if text_data is None:
                raise ChatError("bad_frame", _("Frames must be JSON text, not binary."))
            try:
                content = orjson.loads(text_data)
            except orjson.JSONDecodeError:
                raise ChatError("bad_json", _("The frame is not valid JSON.")) from None
            await self.receive_json(content)
        except ChatError as exc:
            await self.send_error(exc.code, exc.detail)
        except busy.UNAVAILABLE as exc:
            # Nothing was stored (the transaction rolled back); the page retries after a pause.
            log.warning("database unavailable for a websocket frame: %s", exc)
            await self.send_error("server_busy", _(busy.MESSAGE))

    async def within_frame_rate(self) -> bool:
        """Count the frame against this socket's bucket, before any parsing: a flood must stay cheap."""
        limiter = getattr(self, "frames", None)
        if limiter is None:
            return True
        if self.closing:
            return False  # closed for flooding: what is still queued is dropped unread
        verdict = limiter.take(asyncio.get_running_loop().time())
        if verdict == "ok":
            return True
        if verdict == "close":
            self.closing = True
            await self.send_error("rate_limited", _("Too many frames; the connection is closed."))
            await self.close(code=FRAME_LIMIT_CLOSE_CODE)
        elif limiter.first_refusal:
            await self.send_error(
                "rate_limited",
                _("Too many frames: at most %(rate)s a second. Slow down.") % {"rate": f"{settings.CHAT_FRAME_RATE:g}"},
            )
        return False

    async def receive_json(self, content: Any, **kwargs) -> None:
        if not isinstance(content, dict):
            raise ChatError("bad_frame", _("A frame must be a JSON object with a `type`."))
        if content.get("type") in SESSION_CHECKED_FRAMES and not await self.session_still_valid():
            await self.close_signed_out()
            return
        handler = {
            "send": self.on_send,
            "regenerate": self.on_regenerate,
            "edit": self.on_edit,
            "stop": self.on_stop,
            "attach": self.on_attach,
            "continue": self.on_continue,
            "switch": self.on_switch,
            "delete": self.on_delete,
        }.get(content.get("type"))
        if handler is None:
            raise ChatError("unknown_type", _("Unknown frame type %(type)r.") % {"type": content.get("type")})
        await handler(content)

    async def close_signed_out(self) -> None:
        """Close with 4401 (the page goes to sign in); frames still queued are dropped unread."""
        self.closing = True
        await self.close(code=SIGNED_OUT)

    async def session_still_valid(self, *, fresh: bool = False) -> bool:
        """Whether this socket's session still signs its user in; a recent answer is reused unless `fresh`."""
        now = time.monotonic()
        if not fresh and now - self.session_checked < settings.CHAT_SESSION_CHECK_SECONDS:
            return True
        try:
            valid = await db.run(sessions.session_is_valid)(self.session_key, self.user.pk)
        except Exception as exc:  # a database blip must not sign everyone out; the next frame asks again
            log.warning("could not check the session of user %s's socket: %r", self.user.pk, exc)
            return True
        if valid:
            self.session_checked = now
        return valid

    async def send_error(self, code: str, detail: str, message: int | None = None) -> None:
        await self.send(text_data=frame(type="error", code=code, detail=detail, message=message))

    async def watch(self, conversation_id: int) -> None:
        """Follow one conversation: a tab shows one at a time, so the previous one is dropped."""
        for previous in self.watching - {conversation_id}:
            await self.channel_layer.group_discard(conversation_group(previous), self.channel_name)
        if conversation_id not in self.watching:
            await self.channel_layer.group_add(conversation_group(conversation_id), self.channel_name)
        self.watching = {conversation_id}

    # --- client frames --------------------------------------------------------

    async def on_send(self, fields: dict) -> None:
        attachments = parse_attachments(fields.get("attachments"))
        await self.start_turn(
            fields,
            conversation_id=parse_id(fields, "conversation", optional=True),
            content=parse_content(fields.get("content"), blank=bool(attachments)),
            system_prompt=parse_system_prompt(fields.get("system_prompt")),
            attachments=attachments,
        )

    async def on_regenerate(self, fields: dict) -> None:
        regenerate = parse_id(fields, "message", optional=True)  # default: the current answer
        await self.start_turn(fields, conversation_id=parse_id(fields, "conversation"), regenerate=regenerate)

    async def on_continue(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        reply = await self._own_reply(message_id)
        await self.start_turn(fields, conversation_id=reply.conversation_id, continued=message_id)

    async def on_switch(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        conversation = await db.run(branches.switch)(self.user, message_id)
        await self.tell_changed("switched", conversation, message_id)

    async def on_delete(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        conversation = await db.run(branches.delete_pair)(self.user, message_id)
        await self.tell_changed("deleted", conversation, message_id)

    async def tell_changed(self, kind: str, conversation: Conversation, message_id: int) -> None:
        """The tree changed: every tab showing the conversation (this one too) reloads it."""
        await self.watch(conversation.pk)
        text = frame(type=kind, conversation=conversation.pk, message=message_id, current=conversation.current_id)
        await self.channel_layer.group_send(conversation_group(conversation.pk), {"type": "chat.changed", "text": text})

    async def on_edit(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        content = parse_content(fields.get("content"))
        edited = Message.objects.filter(pk=message_id, role=Message.Role.USER, conversation__owner=self.user)
        edited = await db.run(edited.values_list("conversation_id", flat=True).first)()
        if edited is None:
            raise ChatError("not_found", _("No such message."))
        await self.start_turn(fields, conversation_id=edited, content=content, edit=message_id)

    async def start_turn(self, fields: dict, *, conversation_id: int | None, **turn) -> None:
        """Resolve the model, store the turn, watch the conversation and start its generation."""
        model = fields.get("model")
        if model is not None and not isinstance(model, str):
            raise ChatError("bad_field", _("`model` must be a string."))
        params = parse_params(fields.get("params"))
        await process.ensure_started()

        def opening(catalog):
            # One trip to a database thread (chat/db.py), with a short wait for SQLite's lock: this
            # runs on the thread every socket's database work shares.
            return db.run(busy.waiting_briefly(open_turn))(
                self.user, model, params, catalog, conversation_id=conversation_id, worker_id=process.worker_id(),
                **turn,
            )  # fmt: skip

        started, entry = await with_catalog(opening)
        await self.watch(started.conversation.pk)
        generation.start(Job.for_turn(started, entry.provider, entry.model, started.conversation.params))

    async def on_stop(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        reply = await self._own_reply(message_id)
        if reply.status != Message.Status.STREAMING:
            raise ChatError("not_streaming", _("That message is not streaming."))
        # To the process streaming it, whichever socket started it; a dead owner's stream ends here.
        await process.send_control(reply, "stop")

    async def on_attach(self, fields: dict) -> None:
        conversation_id = parse_id(fields, "conversation")
        if not await db.run(Conversation.objects.owned_by(self.user).filter(pk=conversation_id).exists)():
            raise ChatError("not_found", _("No such conversation."))
        await self.watch(conversation_id)
        streaming = Message.objects.streaming().filter(conversation_id=conversation_id).select_related("worker")
        streaming = await db.run(streaming.first)()
        if streaming is None:
            await self.send(text_data=frame(type="attached", conversation=conversation_id, message=None))
            return
        self.attaching[streaming.pk] = None
        await self.send(text_data=frame(type="attached", conversation=conversation_id, message=streaming.pk))
        # A live owner answers with a snapshot; a dead one's stream is ended now and its `done`
        # (with the saved text as the snapshot, see chat_done) arrives through the group.
        if await process.send_control(streaming, "snapshot", reply_to=self.channel_name):
            wait = asyncio.create_task(self.snapshot_from_database(streaming.pk))
            self.waits.add(wait)
            wait.add_done_callback(self.waits.discard)

    async def snapshot_from_database(self, message_id: int) -> None:
        """If the owner does not answer in time, the saved text; its own snapshot still replaces it."""
        await asyncio.sleep(SNAPSHOT_WAIT)
        if self.attaching.get(message_id, FROM_DATABASE) is not None:
            return
        reply = await db.run(Message.objects.get)(pk=message_id)
        if self.attaching.get(message_id, FROM_DATABASE) is None:
            self.attaching[message_id] = FROM_DATABASE
            for text in snapshot_frames(
                reply.conversation_id, reply.pk, reply.content, reply.reasoning, reply.status, reply.model, None
            ):
                await self.send(text_data=text)

    async def _own_reply(self, message_id: int) -> Message:
        reply = Message.objects.filter(pk=message_id, role=Message.Role.ASSISTANT, conversation__owner=self.user)
        reply = await db.run(reply.select_related("worker").first)()
        if reply is None:
            raise ChatError("not_found", _("No such message."))
        return reply

    # --- channel-layer events -------------------------------------------------

    async def session_check(self, event: dict) -> None:
        """A session of this user ended somewhere (sign-out, password change, deactivation): is it ours?"""
        if event.get("ended") == self.session_key or not await self.session_still_valid(fresh=True):
            await self.close_signed_out()

    async def chat_changed(self, event: dict) -> None:
        await self.send(text_data=event["text"])

    async def chat_started(self, event: dict) -> None:
        await self.send(text_data=event["text"])

    async def chat_delta(self, event: dict) -> None:
        conversation = event.get("conversation")
        if conversation is not None and conversation not in self.watching:
            return  # sent to the group as it was a moment ago (Generation._send_delta): no longer watched
        if event["message"] in self.attaching:
            seen = self.attaching[event["message"]]
            if seen is None or seen == FROM_DATABASE or event["seq"] <= seen:
                return  # the snapshot carries it (or the owner's snapshot will)
        await self.frame_send({"type": "websocket.send", "text": event["text"]})

    async def chat_snapshot(self, event: dict) -> None:
        if event["message"] in self.attaching and self.attaching[event["message"]] in (None, FROM_DATABASE):
            self.attaching[event["message"]] = event["seq"]
            await self.send(text_data=event["text"])
            for text in event.get("parts", ()):  # a long reply's snapshot, frame by frame
                await self.send(text_data=text)

    async def chat_title(self, event: dict) -> None:
        """A model wrote the title of one of this user's conversations (chat/titles.py)."""
        await self.send(text_data=event["text"])

    async def chat_done(self, event: dict) -> None:
        message_id = event["message"]
        if message_id in self.attaching and self.attaching.pop(message_id) in (None, FROM_DATABASE):
            # The stream ended before the owner's snapshot reached us: the saved text is final.
            reply = await db.run(Message.objects.get)(pk=message_id)
            for text in snapshot_frames(
                reply.conversation_id, reply.pk, reply.content, reply.reasoning, reply.status, reply.model, None
            ):
                await self.send(text_data=text)
        await self.send(text_data=event["text"])


FAST_EVENTS = {
    "chat.started": ChatConsumer.chat_started,
    "chat.delta": ChatConsumer.chat_delta,
    "chat.snapshot": ChatConsumer.chat_snapshot,
}
