"""Channels' internals that the chat websocket, its sign-in and the in-memory channel layer rely on.

Written against Channels 4.3.2 (requirements.lock); tests/compat/test_compat_channels.py fails when
one of these changes.

* AsyncConsumer.__call__ and channels.utils.await_many_dispatch: LeanJsonWebsocketConsumer's
  __call__ is Channels' with dispatch_all() for await_many_dispatch, which waits on a task
  per source with asyncio.wait and makes a new task for every message: three task steps and
  the wait's callbacks per delta, for every socket watching a stream.
* AsyncConsumer.dispatch and AsyncWebsocketConsumer.websocket_disconnect: both close stale
  database connections on Channels' shared sync thread (aclose_old_connections, added by
  django/channels#2090), a thread hop per message that queued every socket behind a write
  waiting for SQLite's lock. A consumer whose database work never runs on that thread has
  nothing there to close, so here they do without it; the events a subclass names in
  `fast_events` also skip the handler lookup, their handlers found once by Channels' naming
  rule (get_handler_name: "chat.delta" -> chat_delta).
* InstanceSessionWrapper (channels/sessions.py): the send it hands the consumer is its bound
  `send`, which passes a message on to `real_send` after reading the lazy session and the
  settings, to act only on the types in `save_message_types`. `frame_send` is `real_send`
  when a websocket.send is not one of them.
* AuthMiddleware.resolve_scope and get_user (channels/auth.py): scope["user"] is a
  UserLazyObject filled by setting its `_wrapped` (set_scope_user); get_user is a
  database_sync_to_async wrapper whose `func` is the plain function (get_user_sync), so it
  can run on a thread of its own instead of the shared one.
* InMemoryChannelLayer (channels/layers.py): its `channels` (a bounded asyncio.Queue of
  (expiry time, message) per channel), its `groups` (channel -> join time per group) and its
  `_clean_expired`, which scans every channel and group on each receive and group_send.
  InMemoryLayer expires at most every `clean_every` seconds, sends to a group inline instead
  of through a task and a deep copy per member, and gives each message a shallow copy (the
  project's hold only strings and numbers): with a few hundred open sockets Channels' layer
  did quadratic work on every delta.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from channels.auth import get_user
from channels.consumer import get_handler_name
from channels.exceptions import ChannelFull, StopConsumer
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.sessions import InstanceSessionWrapper

# Channels' get_user without its database_sync_to_async wrapper (which runs it on the shared thread).
get_user_sync = get_user.func


def set_scope_user(scope: dict, user) -> None:
    """Fill the scope's lazy user (AuthMiddleware's populate_scope made it) with `user`, as resolve_scope does."""
    scope["user"]._wrapped = user


async def dispatch_all(receivers: list[Callable[[], Awaitable]], dispatch: Callable[[dict], Awaitable]) -> None:
    """channels.utils.await_many_dispatch, without a task and an asyncio.wait per message.

    One reader task per source dispatches what it reads itself, taking turns by a lock: still
    one message at a time in the order they came (the lock is fair), and a source reads its
    next message only once the last one was dispatched (so a layer's capacity still limits a
    socket that does not keep up). A delta costs one task step. A reader's error (StopConsumer
    included) is raised here, as Channels raises it; on the way out the readers are cancelled.
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


class LeanJsonWebsocketConsumer(AsyncJsonWebsocketConsumer):
    """Channels' JSON websocket consumer without its per-message costs, for one whose database work is its own.

    `fast_events` names the channel-layer event types dispatched without the handler lookup;
    `frame_send` sends a websocket.send past the session wrapper when that would do nothing.
    """

    fast_events: tuple[str, ...] = ()
    # event type -> handler function, from fast_events by Channels' naming rule
    fast_handlers: dict[str, Callable] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.fast_handlers = {kind: getattr(cls, get_handler_name({"type": kind})) for kind in cls.fast_events}

    async def __call__(self, scope, receive, send) -> None:
        # channels.consumer.AsyncConsumer.__call__ with dispatch_all for await_many_dispatch.
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        if self.channel_layer is not None:
            self.channel_name = await self.channel_layer.new_channel()
            self.channel_receive = functools.partial(self.channel_layer.receive, self.channel_name)
        self.base_send = send
        # A frame skips Channels' session wrapper, which acts on http.response.start only but
        # reads the (lazy) session and the settings on every message it passes on.
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

    async def dispatch(self, message: dict) -> None:
        # Channels' without closing stale database connections first (see the module's docstring).
        handler = self.fast_handlers.get(message["type"])
        if handler is not None:
            await handler(self, message)
            return
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict) -> None:
        # Channels' without closing stale database connections, and without discarding
        # self.groups: a subclass leaves its groups in its own disconnect().
        await self.disconnect(message["code"])
        raise StopConsumer()


class InMemoryLayer(InMemoryChannelLayer):
    """Channels' in-memory layer made cheap per message: the same semantics, its storage reached directly."""

    # Seconds between two scans for expired messages and memberships (Channels' scans every time).
    clean_every: float = 0.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cleaned_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._cleaned_at >= self.clean_every:
            self._cleaned_at = now
            super()._clean_expired()

    async def send(self, channel: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        self._put(channel, message)

    def _put(self, channel: str, message: dict) -> None:
        queue = self.channels.get(channel)
        if queue is None:
            queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
        try:
            queue.put_nowait((time.time() + self.expiry, dict(message)))
        except asyncio.QueueFull:
            raise ChannelFull(channel) from None

    async def group_send(self, group: str, message: dict) -> None:
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        await self.send_to_members(group, list(self.groups.get(group, ())), message)

    async def group_members(self, group: str) -> list[str]:
        """The channels in `group` now."""
        return list(self.groups.get(group, ()))

    async def send_to_members(self, group: str, members: list[str], message: dict) -> None:
        """group_send() to members read earlier by group_members()."""
        for channel in members:
            try:
                self._put(channel, message)
            except ChannelFull:
                pass  # as Channels does: a full socket misses the message, the others get it
