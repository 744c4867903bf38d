"""Channel layers: Channels' in-memory one made cheap per message, and channels-redis made lossless.

channels.layers.InMemoryChannelLayer scans every channel and group for expired
messages on each receive and group_send, and sends to a group through one task
and one deepcopy per member. With a few hundred open sockets that is quadratic
work on every delta. LocalChannelLayer keeps
its semantics but expires at most once a second and sends to a group inline.
Messages still get a shallow copy: ours hold only strings and numbers. What this
reaches of Channels' layer is in chat/compat/channels.py.
(RedisChannelLayer below says what it changes in channels-redis.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from channels.exceptions import ChannelFull
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chat.compat.channels import InMemoryLayer
from chat.compat.channels_redis import ChannelsRedisLayer
from chat.runtime import metrics
from chat.runtime.failures import stop_if_cancelled

CLEAN_EVERY = 1.0
POP_BATCH = 500
# How long the sender uses a group's members as it last read them from Redis.
MEMBERS_TTL = 1.0
# Messages the sender writes in one round trip.
SEND_BATCH = 100

log = logging.getLogger(__name__)

# What a call on the Redis layer raises while Redis cannot be reached: an outage, not a bug.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, ConnectionError, TimeoutError)


class LocalChannelLayer(InMemoryLayer):
    """Channels' in-memory layer, cheap per message (chat/compat/channels.py), expiring at most once a second."""

    clean_every = CLEAN_EVERY

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        metrics.channel_layer_up.set(1)  # in this process: always reached

    def post(self, channel: str, message: dict) -> None:
        """send() without waiting: at once, as everything is in this process."""
        try:
            self._put(channel, message)
        except ChannelFull:
            log.warning("channel layer: a message to %s was dropped, its queue is full", channel)

    def post_to_group(self, group: str, message: dict, merge: Merge | None = None) -> None:
        """group_send() without waiting (`merge` matters only to the Redis layer's backlog)."""
        self._clean_expired()
        for channel in list(self.groups.get(group, ())):
            try:
                self._put(channel, message)
            except ChannelFull:
                pass  # as Channels does: a full socket misses the message, the others get it

    def forget_members(self, group: str) -> None:
        """Nothing to forget: the members are read at each message."""


class RedisChannelLayer(ChannelsRedisLayer):
    """channels-redis with one never-cancelled reader per process, one ordered sender, and groups kept alive.

    In channels-redis, whichever receive() holds the process's receive lock runs the
    BZPOPMIN for every local channel; cancelling it after Redis popped a message but
    before the reply was read drops that message, whoever it was for (channels-redis
    #151, #165). Channels cancels a socket's receive() whenever the socket closes, so
    any closing tab could lose another tab's delta or `done`. Here one reader task per
    process does every BZPOPMIN and is never cancelled; receive() on a local channel
    only waits on an in-process queue, which a cancel cannot lose. A Redis error stops
    nobody: the reader logs it and retries every half second at most, and sockets simply wait.

    A message for a socket of this very process (the common case: the generation and
    the tab that started it share a process) is put in its inbox directly, with no
    round trip through Redis: this process's memberships are known here, so a Redis
    outage stops no frame between a stream and the tabs on its own process. Only other
    processes' sockets are reached through Redis, by one sender task that takes whatever
    waits in its queue, in order, and writes it in one pipeline: a stream never waits on
    Redis. When Redis fails, what was posted waits in that queue (a stream's deltas merged
    into one per stream, see post_to_group) and goes out, in order, as soon as Redis
    answers again: nothing is lost and nothing freezes. A batch that reached Redis just
    before the cut took its reply is sent again: a socket may get a message twice, so a
    delta carries its seq and the page applies only those past the last. The reader takes everything
    waiting in one round trip after each blocking pop, so a burst of deltas from 50
    streams on another process does not queue up behind one pop per message.

    group_expiry is short so a crashed process's memberships vanish within minutes;
    the keeper re-adds this process's live memberships well before they expire, and
    all of them within a second of Redis's return (a Redis restarted without persistence has lost them).
    What this reaches of channels-redis is in chat/compat/channels_redis.py.
    """

    # redis-py's pool raises MaxConnectionsError at once past 100 connections in use, and a burst of
    # sockets connecting together would lose some of their group_add()s. A burst waits instead.
    pool_max_connections = 100
    pool_wait_seconds = 10
    # A group_add() or group_discard() waits this long for Redis; then the keeper finishes it.
    membership_wait = 2.0
    # The longest pause between two tries of the reader and the sender while Redis is away.
    retry_cap = 0.5

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._inboxes: dict[str, _Inbox] = {}
        self._memberships: dict[str, set[str]] = {}  # local channel -> its groups
        self._local_groups: dict[str, set[str]] = {}  # group -> its local channels
        self._unsynced: set[tuple[str, str]] = set()  # (group, local channel) not yet added in Redis
        self._outbox: deque[_Post] = deque()
        self._mergeable: dict[str, _Post] = {}  # group -> its last post in the outbox, while Redis fails
        self._failing = False  # the sender's last write failed: posts wait, merged
        self._members: dict[str, tuple[float, list[str]]] = {}  # group -> (read at, its remote channels)
        self._posted: asyncio.Event | None = None
        self._reader: asyncio.Task | None = None
        self._keeper: asyncio.Task | None = None
        self._sender: asyncio.Task | None = None
        self.redis_ok = True  # the reader's last round trip worked
        self._renew_now = False  # Redis is back after an outage: the keeper renews every membership at once

    async def receive(self, channel: str) -> dict:
        if "!" not in channel:
            return await super().receive(channel)
        self._ensure_tasks()
        inbox = self._inbox(channel)
        inbox.waiters += 1
        try:
            return await inbox.queue.get()
        finally:
            inbox.waiters -= 1
            inbox.touched = time.monotonic()

    async def send(self, channel: str, message: dict) -> None:
        """To one channel now: raises when Redis cannot be reached (the control channel's stop falls back on it)."""
        if self._is_local(channel):
            self._inbox(channel).queue.put_nowait(dict(message))
            return
        await super().send(channel, message)

    def post(self, channel: str, message: dict) -> None:
        """To one channel without waiting: after everything posted before it, whenever Redis answers."""
        if self._is_local(channel):
            self._inbox(channel).queue.put_nowait(dict(message))
            return
        self._mergeable.clear()  # nothing posted before this one may change after it
        self._enqueue(_Post(None, [channel], message))

    async def group_send(self, group: str, message: dict) -> None:
        """Channels' group_send: sent when it returns (raises when Redis cannot be reached).

        For code outside a serving process's loop too (a management command's async_to_sync, whose
        loop ends with the call); a serving process's own messages use post_to_group(), which never waits.
        """
        assert self.require_valid_group_name(group), "Group name not valid"
        for channel in self._local_groups.get(group, ()):
            self._inbox(channel).queue.put_nowait(dict(message))
        remote = [name for name in await self.group_members(group) if not self._is_local(name)]
        if remote and (over := await self.send_to_channels(remote, message)):
            log.warning("channel layer: %d of %d sockets over capacity in group %s", over, len(remote), group)

    def post_to_group(self, group: str, message: dict, merge: Merge | None = None) -> None:
        """group_send() without waiting: this process's members now, the others' through the sender.

        While Redis fails, a post with `merge` is merged into the group's last waiting post when
        merge(last, this) gives a message (a stream's deltas: one delta with everything), so an
        outage of a minute leaves one message per stream waiting, not two thousand.
        """
        for channel in self._local_groups.get(group, ()):
            self._inbox(channel).queue.put_nowait(dict(message))
        if self._failing and merge is not None:
            last = self._mergeable.get(group)
            if last is not None and last.merge is merge:
                merged = merge(last.message, message)
                if merged is not None:
                    last.message = merged
                    return
        post = _Post(group, None, message, merge)
        self._enqueue(post)
        if self._failing:
            self._mergeable[group] = post

    def forget_members(self, group: str) -> None:
        """Read the group's members from Redis again for the next post (a socket has just joined it)."""
        self._members.pop(group, None)

    def _enqueue(self, post: _Post) -> None:
        self._ensure_tasks()
        self._outbox.append(post)
        self._posted.set()

    async def ping(self) -> None:
        """A round trip to Redis (GET /readyz)."""
        await self.connection_for(self.process_prefix).ping()

    def _is_local(self, channel: str) -> bool:
        return channel.startswith(self.process_prefix)

    async def new_channel(self, prefix: str = "specific") -> str:
        name = await super().new_channel(prefix)
        self._inbox(name)
        return name

    async def group_add(self, group: str, channel: str) -> None:
        if "!" not in channel:
            await super().group_add(group, channel)
            return
        # Known here first: this process's messages reach it whatever Redis does.
        self._memberships.setdefault(channel, set()).add(group)
        self._local_groups.setdefault(group, set()).add(channel)
        self.forget_members(group)
        try:
            await asyncio.wait_for(super().group_add(group, channel), self.membership_wait)
        except Exception as exc:
            if not self._unsynced:
                log.warning("channel layer: cannot add to a group in Redis (%s); retrying", _describe(exc))
            self._ensure_tasks()
            self._unsynced.add((group, channel))
            return
        self._unsynced.discard((group, channel))

    async def group_discard(self, group: str, channel: str) -> None:
        groups = self._memberships.get(channel)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._memberships[channel]
        self._leave_local(group, channel)
        self._unsynced.discard((group, channel))
        if "!" not in channel:
            await super().group_discard(group, channel)
            return
        try:
            await asyncio.wait_for(super().group_discard(group, channel), self.membership_wait)
        except Exception as exc:  # the membership expires with group_expiry; a message to it is dropped
            log.info("channel layer: cannot leave a group in Redis (%s)", _describe(exc))

    def _leave_local(self, group: str, channel: str) -> None:
        members = self._local_groups.get(group)
        if members is not None:
            members.discard(channel)
            if not members:
                del self._local_groups[group]

    def _inbox(self, channel: str) -> _Inbox:
        inbox = self._inboxes.get(channel)
        if inbox is None:
            inbox = self._inboxes[channel] = _Inbox(self.new_buffer())
        return inbox

    def _ensure_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is None or self._reader.done() or self._reader.get_loop() is not loop:
            self._posted = asyncio.Event()
            if self._outbox:
                self._posted.set()
            self._reader = loop.create_task(self._read_forever(), name="channel-layer-reader")
            self._keeper = loop.create_task(self._keep_forever(), name="channel-layer-keeper")
            self._sender = loop.create_task(self._send_forever(), name="channel-layer-sender")

    async def _read_forever(self) -> None:
        """Every message for this process's channels, into their inboxes; survives Redis errors."""
        failures = 0
        metrics.channel_layer_up.set(1)  # from the start, not only after an outage: ChatRedisDown alerts on 0
        while True:
            stop_if_cancelled()
            try:
                if failures:  # reachable again? say so now, not after a blocking pop's 5 s
                    await self.connection_for(self.process_prefix).ping()
                batch = await self.pop_process_messages(POP_BATCH) if not failures else []
            except Exception as exc:
                failures += 1
                self.redis_ok = False
                if failures == 1:
                    log.warning("channel layer: cannot read from Redis (%s); retrying", _describe(exc))
                    metrics.channel_layer_up.set(0)
                await asyncio.sleep(min(0.05 * 2**failures, self.retry_cap))
                continue
            if failures:
                log.warning("channel layer: reading from Redis again after %d failed attempt(s)", failures)
                metrics.channel_layer_up.set(1)
                metrics.channel_layer_reconnects.inc()
                failures = 0
                self.redis_ok = True
                await self._sync_memberships()
                # A Redis restarted without persistence lost every membership, not only those added while it was
                # away: the keeper renews them all at its next tick rather than at its next turn, up to 30 s away.
                self._renew_now = True
            self.deliver(batch, self._inbox)

    async def _send_forever(self) -> None:
        """Write what was posted for other processes, in order; on a Redis error keep it and try again."""
        waiting: list[_Post] = []
        failures = 0
        while True:
            stop_if_cancelled()
            if not waiting:
                if not self._outbox:
                    self._posted.clear()
                    await self._posted.wait()
                    continue
                # A bounded batch a round trip: the receiving processes' readers keep up with the writes.
                waiting = [self._outbox.popleft() for _ in range(min(len(self._outbox), SEND_BATCH))]
                self._mergeable.clear()
            try:
                over = await self.send_batch(await self._addressed(waiting))
            except Exception as exc:
                failures += 1
                self._failing = True
                if failures == 1:
                    log.warning("channel layer: cannot send through Redis (%s); %d message(s) wait",
                                _describe(exc), len(waiting))  # fmt: skip
                await asyncio.sleep(min(0.05 * 2**failures, self.retry_cap))
                self._mergeable.clear()  # what waits now is only added after `waiting`, in order
                continue
            if failures:
                log.warning("channel layer: sending through Redis again after %d failed attempt(s)", failures)
                failures = 0
            self._failing = False
            if over:
                log.warning("channel layer: %d message(s) to sockets over capacity were dropped", over)
            waiting = []

    async def _addressed(self, posts: list[_Post]) -> list[tuple[list[str], dict]]:
        """(other processes' channels, message) of each post: a group's members read at most every MEMBERS_TTL."""
        now = time.monotonic()
        batch = []
        for post in posts:
            channels = post.channels
            if channels is None:
                read = self._members.get(post.group)
                if read is None or now - read[0] > MEMBERS_TTL:
                    members = [name for name in await self.group_members(post.group) if not self._is_local(name)]
                    read = self._members[post.group] = (now, members)
                channels = read[1]
            if channels:
                batch.append((channels, post.message))
        return batch

    async def _keep_forever(self) -> None:
        """Drop inboxes nobody reads any more; renew the group memberships of the live ones."""
        every = max(1.0, min(self.group_expiry / 4, 30.0))
        renewed = time.monotonic()
        while True:
            stop_if_cancelled()
            await asyncio.sleep(1.0)
            if self._unsynced:
                await self._sync_memberships()
            now = time.monotonic()
            if now - renewed < every and not self._renew_now:
                continue
            renewed, after_outage, self._renew_now = now, self._renew_now, False
            for group, (read, _) in list(self._members.items()):
                if now - read > MEMBERS_TTL:
                    del self._members[group]  # read again at the group's next post
            for name, inbox in list(self._inboxes.items()):
                if inbox.waiters == 0 and now - inbox.touched > self.expiry:
                    del self._inboxes[name]
                    for group in self._memberships.pop(name, ()):
                        self._leave_local(group, name)
            try:
                for channel, groups in list(self._memberships.items()):
                    for group in list(groups):
                        await super().group_add(group, channel)
            except Exception as exc:
                log.warning("channel layer: cannot renew group memberships (%s); retrying", _describe(exc))
                self._renew_now = self._renew_now or after_outage
            else:
                if after_outage:
                    log.info("channel layer: every group membership renewed after the outage")
                    self._resync_sockets()

    def _resync_sockets(self) -> None:
        """Tell this process's sockets in groups to read again what they watch (`chat.resync`).

        What other processes sent to a group while this one's memberships were gone from Redis (a
        Redis restarted without persistence) reached none of them: a stream's last deltas, its `done`.
        """
        for channel in list(self._memberships):
            self._inbox(channel).queue.put_nowait({"type": "chat.resync"})

    async def _sync_memberships(self) -> None:
        """Add in Redis the memberships a Redis error kept from it (the others are renewed by the keeper)."""
        if not self._unsynced:
            return
        for group, channel in list(self._unsynced):
            try:
                await super().group_add(group, channel)
            except Exception:
                return  # still away: the keeper tries again in a second
            self._unsynced.discard((group, channel))
            self.forget_members(group)
        log.info("channel layer: group memberships written to Redis again")


# Merges a waiting message with the next one for the same group into one (None: they do not merge).
Merge = Callable[[dict, dict], "dict | None"]


@dataclass
class _Post:
    """A message waiting for the sender: to a group's members (channels None) or to channels."""

    group: str | None
    channels: list[str] | None
    message: dict
    merge: Merge | None = None


@dataclass
class _Inbox:
    queue: asyncio.Queue
    waiters: int = 0
    touched: float = field(default_factory=time.monotonic)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
