"""The chat websocket (protocol in docs/websocket.md): validate a frame, then delegate."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

import orjson
from django.conf import settings
from django.utils import translation
from django.utils.translation import gettext as _

from chat.actions import branches, orphans
from chat.actions.turns import open_turn
from chat.auth import session_sockets
from chat.compat.channels import LeanJsonWebsocketConsumer
from chat.lib.channel_groups import user_group
from chat.lib.json_depth import without_nul
from chat.lib.request_fields import (
    parse_attachments,
    parse_content,
    parse_id,
    parse_params,
    parse_system_prompt,
    parse_tools,
)
from chat.metering.limits import FRAME_LIMIT_CLOSE_CODE, FrameLimiter
from chat.models import ChatError, Conversation, Message
from chat.runtime import channel_layers, control, db_busy, db_threads, metrics, process_loops, stopping
from chat.runtime.failures import FailureStreak
from chat.streaming import generation
from chat.streaming.catalog import with_catalog
from chat.streaming.frames import conversation_group, done_frame, frame, snapshot_frames
from chat.ws.language import language_from_scope
from chat.ws.overload import DATABASE_DOWN, DATABASE_UNAVAILABLE, TRY_AGAIN_LATER

# Frames that start a stream re-check the session first (cached for CHAT_SESSION_CHECK_SECONDS).
SESSION_CHECKED_FRAMES = frozenset({"send", "regenerate", "edit", "continue"})
SIGNED_OUT = 4401  # the close code the page answers by going to the sign-in page

log = logging.getLogger(__name__)
# Frames that could not reach Redis, this process's: logged once a streak, not with a traceback each.
REDIS_FRAMES = FailureStreak("websocket frames cannot reach Redis", "websocket frames reach Redis again")

# An attaching socket waits this long for the owner's snapshot, then shows the saved text:
# an owner killed a moment ago still holds its lease but will never answer.
SNAPSHOT_WAIT = 3.0
# Each person's frames on this process, all their sockets together (twice one socket's rate): hundreds of
# sockets, each within its own rate, kept a core busy. Over it a frame is refused, never a socket closed.
_person_frames: dict[int, FrameLimiter] = {}
# attaching[reply] when the snapshot came from the database: no delta lines up with it.
FROM_DATABASE = -1


class ChatConsumer(LeanJsonWebsocketConsumer):
    """One browser tab: it sends messages, stops and attaches to streams, and watches conversations.

    Its database work all runs on chat/runtime/db_threads.py's threads, which look after their
    own connections: nothing of it runs on Channels' shared sync thread, so the lean consumer
    closes no stale connections there before each message.
    """

    # The per-token events: dispatched without the handler lookup.
    fast_events = ("chat.started", "chat.delta", "chat.snapshot")

    async def connect(self) -> None:
        if self.scope.get(DATABASE_DOWN):
            await self.accept()  # then closed: a refused handshake reaches the page as 1006, not as a code
            await self.close(code=DATABASE_UNAVAILABLE)
            return
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accepted then closed: a refused handshake reaches the page as 1006, not as this code.
            await self.accept()
            await self.close(code=SIGNED_OUT)
            return
        most = settings.CHAT_MAX_SOCKETS_PER_PERSON
        if most and session_sockets.open_sockets(user.pk) >= most:
            # Thousands of one person's sockets held memory and, each within its own frame rate, the event loop.
            await self.accept()
            await self.close(code=TRY_AGAIN_LATER)
            return
        self.user = user
        self.language = language_from_scope(self.scope)
        self.session_key = self.scope["session"].session_key
        self.session_checked = time.monotonic()
        self.watching: set[int] = set()
        # reply id -> seq of the last delta (or snapshot) this socket got (None: waiting for a snapshot)
        self.attaching: dict[int, int | None] = {}
        self.waits: set[asyncio.Task] = set()
        now = asyncio.get_running_loop().time()
        self.frames = FrameLimiter(settings.CHAT_FRAME_RATE, settings.CHAT_FRAME_BURST, now)
        if user.pk not in _person_frames:
            _person_frames[user.pk] = FrameLimiter(2 * settings.CHAT_FRAME_RATE, 2 * settings.CHAT_FRAME_BURST, now)
        self.closing = False
        session_sockets.socket_opened(user.pk)
        try:
            await self.channel_layer.group_add(user_group(user.pk), self.channel_name)
        except Exception as exc:  # the socket still works; the per-frame session check still holds
            log.warning("could not add a socket of user %s to its user group: %r", user.pk, exc)
        await self.accept()
        self.counted = True
        metrics.websockets_open.inc()
        await process_loops.ensure_started()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            metrics.websockets_open.dec()
        for wait in getattr(self, "waits", ()):
            wait.cancel()
        if hasattr(self, "user"):
            session_sockets.socket_closed(self.user.pk)
            if not session_sockets.open_sockets(self.user.pk):
                _person_frames.pop(self.user.pk, None)
            try:
                await self.channel_layer.group_discard(user_group(self.user.pk), self.channel_name)
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
                content = orjson.loads(without_nul(text_data))  # stored text never holds NUL
            except orjson.JSONDecodeError:
                raise ChatError("bad_json", _("The frame is not valid JSON.")) from None
            await self.receive_json(content)
        except ChatError as exc:
            REDIS_FRAMES.over()  # answered: whatever failed before works again
            await self.send_error(exc.code, exc.detail)
        except db_busy.UNAVAILABLE as exc:
            # Nothing was stored (the transaction rolled back); the page retries after a pause.
            log.warning("database unavailable for a websocket frame: %s", exc)
            metrics.db_unavailable.labels("websocket").inc()
            await self.send_error("server_busy", _(db_busy.MESSAGE))
        except channel_layers.UNREACHABLE as exc:
            # An expected outage: one line when a streak of such frames begins, one when it ends.
            REDIS_FRAMES.failed(exc)
            await self.send_error("server_busy", _("The server is reconnecting; try again in a moment."))
        else:
            REDIS_FRAMES.over()

    async def within_frame_rate(self) -> bool:
        """Count the frame against this socket's bucket, before any parsing: a flood must stay cheap."""
        limiter = getattr(self, "frames", None)
        if limiter is None:
            return True
        if self.closing:
            return False  # closed for flooding: what is still queued is dropped unread
        now = asyncio.get_running_loop().time()
        verdict = limiter.take(now)
        if verdict == "ok":
            person = _person_frames.get(self.user.pk)
            if person is None or person.take(now) == "ok":
                return True
            if person.first_refusal:
                await self.send_error(
                    "rate_limited",
                    _("Too many frames from your tabs together: at most %(rate)s a second. Slow down.")
                    % {"rate": f"{person.rate:g}"},
                )
            return False
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
        if not isinstance(content, dict) or not isinstance(content.get("type"), str | None):
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
            "tool_approval": self.on_tool_approval,
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
            valid = await db_threads.run(session_sockets.session_is_valid)(self.session_key, self.user.pk)
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
            tools=parse_tools(fields.get("tools")),
        )

    async def on_tool_approval(self, fields: dict) -> None:
        """Approve or Deny a tool call that asks first: only the answer's owner, sent to the process streaming it."""
        message_id = parse_id(fields, "message")
        call = fields.get("call")
        if not isinstance(call, str) or not call or len(call) > 200 or not isinstance(fields.get("approve"), bool):
            raise ChatError("bad_field", _("`call` must name a call and `approve` be true or false."))
        reply = await self._own_reply(message_id)
        if reply.status != Message.Status.STREAMING:
            raise ChatError("not_streaming", _("That message is not streaming."))
        await control.send_control(reply, "approve", call=call, approve=fields["approve"])

    async def on_regenerate(self, fields: dict) -> None:
        regenerate = parse_id(fields, "message", optional=True)  # default: the current answer
        await self.start_turn(fields, conversation_id=parse_id(fields, "conversation"), regenerate=regenerate)

    async def on_continue(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        reply = await self._own_reply(message_id)
        await self.start_turn(fields, conversation_id=reply.conversation_id, continued=message_id)

    async def on_switch(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        conversation = await db_threads.run(branches.switch)(self.user, message_id)
        await self.tell_changed("switched", conversation, message_id)

    async def on_delete(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        conversation = await db_threads.run(branches.delete_pair)(self.user, message_id)
        await self.tell_changed("deleted", conversation, message_id)

    async def tell_changed(self, kind: str, conversation: Conversation, message_id: int) -> None:
        """The tree changed: every tab showing the conversation (this one too) reloads it."""
        await self.watch(conversation.pk)
        text = frame(type=kind, conversation=conversation.pk, message=message_id, current=conversation.current_id)
        # Never waits on Redis: this process's tabs at once, the others' whenever it answers.
        self.channel_layer.post_to_group(conversation_group(conversation.pk), {"type": "chat.changed", "text": text})

    async def on_edit(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        content = parse_content(fields.get("content"))
        edited = Message.objects.filter(pk=message_id, role=Message.Role.USER, conversation__owner=self.user)
        edited = await db_threads.run(edited.values_list("conversation_id", flat=True).first)()
        if edited is None:
            raise ChatError("not_found", _("No such message."))
        await self.start_turn(fields, conversation_id=edited, content=content, edit=message_id)

    async def start_turn(self, fields: dict, *, conversation_id: int | None, **turn) -> None:
        """Resolve the model, store the turn, watch the conversation and start its generation."""
        if stopping.draining():
            # Its stream would be cut when the grace ends: nothing is stored, the page sends it again once
            # its socket is back, on another process.
            await self.send_error("server_restarting", _("This server is restarting; your message goes out again."))
            await self.close(code=stopping.RESTART_CLOSE_CODE)
            return
        model = fields.get("model")
        if model is not None and not isinstance(model, str):
            raise ChatError("bad_field", _("`model` must be a string."))
        params = parse_params(fields.get("params"))
        await process_loops.ensure_started()

        def opening(catalog):
            # One trip to a database thread (chat/runtime/db_threads.py), with a short wait for SQLite's lock: this
            # runs on the thread every socket's database work shares.
            return db_threads.run(db_busy.waiting_briefly(open_turn))(
                self.user, model, params, catalog, conversation_id=conversation_id, worker_id=process_loops.worker_id(),
                **turn,
            )  # fmt: skip

        started, entry = await with_catalog(opening)
        try:
            await self.watch(started.conversation.pk)
            generation.start(started.job(entry.provider, entry.model, started.conversation.params))
        except Exception as exc:
            # Stored, but no stream runs it: failed now, with a sentence, rather than streaming forever.
            log.warning("the turn of reply %s could not start (%r); marked failed", started.reply.pk, exc)
            ended = await db_threads.run(orphans.end_unstarted)(started.reply.pk)
            await orphans.announce_recovered(ended)
            raise ChatError("not_started", _(orphans.NEVER_STARTED)) from None

    async def on_stop(self, fields: dict) -> None:
        message_id = parse_id(fields, "message")
        reply = await self._own_reply(message_id)
        if reply.status != Message.Status.STREAMING:
            raise ChatError("not_streaming", _("That message is not streaming."))
        # To the process streaming it, whichever socket started it; a dead owner's stream ends here.
        await control.send_control(reply, "stop")

    async def on_attach(self, fields: dict) -> None:
        conversation_id = parse_id(fields, "conversation")
        if not await db_threads.run(Conversation.objects.owned_by(self.user).filter(pk=conversation_id).exists)():
            raise ChatError("not_found", _("No such conversation."))
        await self.watch(conversation_id)
        streaming = Message.objects.streaming().filter(conversation_id=conversation_id).select_related("worker")
        streaming = await db_threads.run(streaming.first)()
        if streaming is None:
            await self.send(text_data=frame(type="attached", conversation=conversation_id, message=None))
            return
        self.attaching[streaming.pk] = None
        await self.send(text_data=frame(type="attached", conversation=conversation_id, message=streaming.pk))
        await self.ask_snapshot(streaming)

    async def ask_snapshot(self, streaming: Message) -> None:
        """The reply's text so far, from its stream (attaching[reply] is None until it comes).

        A live owner answers with a snapshot; a dead one's stream is ended now and its `done`
        (with the saved text as the snapshot, see chat_done) arrives through the group.
        """
        if await control.send_control(streaming, "snapshot", reply_to=self.channel_name):
            self.wait_for(self.snapshot_from_database(streaming.pk))

    def wait_for(self, waiting: Coroutine[Any, Any, None]) -> None:
        """Run `waiting` beside the socket's frames, kept in self.waits (cancelled when the socket closes)."""
        wait = asyncio.create_task(waiting)
        self.waits.add(wait)
        wait.add_done_callback(self.waits.discard)

    async def snapshot_again(self, message_id: int) -> None:
        """After a lost delta: the whole text again, which the page puts in place of its own."""
        streaming = Message.objects.streaming().filter(pk=message_id).select_related("worker")
        streaming = await db_threads.run(streaming.first)()
        if streaming is not None:  # else it has ended: its `done` sends the saved text (chat_done)
            await self.ask_snapshot(streaming)

    async def snapshot_from_database(self, message_id: int) -> None:
        """If the owner does not answer in time, the saved text; its own snapshot still replaces it."""
        await asyncio.sleep(SNAPSHOT_WAIT)
        if self.attaching.get(message_id, FROM_DATABASE) is not None:
            return
        reply = await db_threads.run(Message.objects.get)(pk=message_id)
        if self.attaching.get(message_id, FROM_DATABASE) is None:
            self.attaching[message_id] = FROM_DATABASE
            await self._send_saved(reply)

    async def _send_saved(self, reply: Message) -> None:
        """A reply's snapshot as saved (seq null): its text from the database, not from its stream."""
        for text in snapshot_frames(
            reply.conversation_id, reply.pk, reply.content, reply.reasoning, reply.status, reply.model, None,
            reply.tool_rounds,
        ):  # fmt: skip
            await self.send(text_data=text)

    async def _own_reply(self, message_id: int) -> Message:
        reply = Message.objects.filter(pk=message_id, role=Message.Role.ASSISTANT, conversation__owner=self.user)
        reply = await db_threads.run(reply.select_related("worker").first)()
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
        if event.get("conversation") in self.watching:
            self.attaching.setdefault(event["message"], 0)  # its deltas counted from the first (chat_delta)
        await self.send(text_data=event["text"])

    async def chat_delta(self, event: dict) -> None:
        conversation = event.get("conversation")
        if conversation is not None and conversation not in self.watching:
            return  # sent to the group as it was a moment ago (Generation._send_delta): no longer watched
        message = event["message"]
        if message in self.attaching:
            seen = self.attaching[message]
            if seen is None or seen == FROM_DATABASE or event["seq"] <= seen:
                return  # the snapshot carries it (or the owner's snapshot will), or it came twice
            if event.get("first", event["seq"]) > seen + 1:
                # One between was lost (a Redis cut took a popped message with it, or a full
                # channel dropped it): the page gets the whole text again instead of a hole.
                self.attaching[message] = None
                self.wait_for(self.snapshot_again(message))
                return
            self.attaching[message] = event["seq"]
        await self.frame_send({"type": "websocket.send", "text": event["text"]})

    async def chat_snapshot(self, event: dict) -> None:
        if event["message"] in self.attaching and self.attaching[event["message"]] in (None, FROM_DATABASE):
            self.attaching[event["message"]] = event["seq"]
            await self.send(text_data=event["text"])
            for text in event.get("parts", ()):  # a long reply's snapshot, frame by frame
                await self.send(text_data=text)

    async def chat_tool(self, event: dict) -> None:
        """A tool call's progress in a watched conversation's answer (chat/streaming/generation.py)."""
        await self.send(text_data=event["text"])

    async def chat_title(self, event: dict) -> None:
        """A model wrote the title of one of this user's conversations (chat/actions/titles.py)."""
        await self.send(text_data=event["text"])

    async def chat_conversations(self, event: dict) -> None:
        """This user's conversations changed over the JSON API (chat/actions/sidebar_events.py)."""
        await self.send(text_data=event["text"])

    async def chat_resync(self, event: dict) -> None:
        """Redis was away and this process's group memberships with it (channel_layers._resync_sockets): what was
        sent to them meanwhile is lost. A watched stream still running sends its whole text again; one that
        ended sends its stored text and its `done` (recovered: the page reads it again)."""
        for message_id in list(self.attaching):
            try:
                reply = await db_threads.run(Message.objects.filter(pk=message_id).select_related("worker").first)()
            except Exception as exc:  # the database away too: this one's own `done` or snapshot still comes
                log.warning("could not read reply %s again after the channel layer's outage: %r", message_id, exc)
                continue
            if reply is None or message_id not in self.attaching:
                continue  # deleted, or its `done` came meanwhile
            if reply.status == Message.Status.STREAMING:
                self.attaching[message_id] = None
                await self.ask_snapshot(reply)
                continue
            del self.attaching[message_id]
            await self._send_saved(reply)
            await self.send(text_data=done_frame(
                reply.conversation_id, reply.pk, reply.status, reply.finish_reason or None, None, reply.error,
                thinking_ms=reply.thinking_ms, tool_calls=reply.tool_calls, recovered=True,
            ))  # fmt: skip

    async def chat_done(self, event: dict) -> None:
        message_id = event["message"]
        if message_id in self.attaching and self.attaching.pop(message_id) in (None, FROM_DATABASE):
            # The stream ended before the owner's snapshot reached us: the saved text is final.
            try:
                reply = await db_threads.run(Message.objects.get)(pk=message_id)
            except Exception as exc:  # the database away: `done` still goes, and the page reads the answer again
                log.warning("could not read reply %s for its done frame: %r", message_id, exc)
                await self.send(text_data=orjson.dumps({**orjson.loads(event["text"]), "recovered": True}).decode())
                return
            await self._send_saved(reply)
        await self.send(text_data=event["text"])
