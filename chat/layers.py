"""Channel layers: Channels' in-memory one made cheap per message, and channels-redis made lossless.

channels.layers.InMemoryChannelLayer scans every channel and group for expired
messages on each receive and group_send, and sends to a group through one task
and one deepcopy per member. With a few hundred open sockets that is quadratic
work on every delta (measured with bench/server_bench.py). This subclass keeps
its semantics but expires at most once a second and sends to a group inline.
Messages still get a shallow copy: ours hold only strings and numbers.
(RedisChannelLayer below says what it changes in channels-redis.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import channels_redis.core
import redis.asyncio
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

CLEAN_EVERY = 1.0
POP_BATCH = 500

# channels-redis's group_send script: add the message to each key still under its capacity.
_GROUP_SEND = """
local over_capacity = 0
local current_time = ARGV[#ARGV - 1]
local expiry = ARGV[#ARGV]
for i = 1, #KEYS do
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""

log = logging.getLogger(__name__)


class LocalChannelLayer(InMemoryChannelLayer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cleaned_at = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._cleaned_at >= CLEAN_EVERY:
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
        """The channels in `group` now (see RedisChannelLayer.group_members)."""
        return list(self.groups.get(group, ()))

    async def send_to_members(self, group: str, members: list[str], message: dict) -> None:
        """group_send() to members read earlier by group_members()."""
        for channel in members:
            try:
                self._put(channel, message)
            except ChannelFull:
                pass  # as Channels does: a full socket misses the message, the others get it


class RedisChannelLayer(channels_redis.core.RedisChannelLayer):
    """channels-redis with one never-cancelled reader per process, and groups kept alive while used.

    In channels-redis, whichever receive() holds the process's receive lock runs the
    BZPOPMIN for every local channel; cancelling it after Redis popped a message but
    before the reply was read drops that message, whoever it was for (channels-redis
    #151, #165). Channels cancels a socket's receive() whenever the socket closes, so
    any closing tab could lose another tab's delta or `done`. Here one reader task per
    process does every BZPOPMIN and is never cancelled; receive() on a local channel
    only waits on an in-process queue, which a cancel cannot lose. A Redis error stops
    nobody: the reader logs it and retries with backoff, and sockets simply wait.

    A message for a socket of this very process (the common case: the generation and
    the tab that started it share a process) is put in its inbox directly, with no
    round trip through Redis; only other processes' sockets are reached through it.
    The reader takes everything waiting in one round trip after each blocking pop, so
    a burst of deltas from 50 streams on another process does not queue up behind one
    pop per message (channels-redis's receive costs four round trips a message, and the
    process's one Redis key dropped messages past its capacity when the reader lagged).

    group_expiry is short so a crashed process's memberships vanish within minutes;
    the keeper re-adds this process's live memberships well before they expire.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._inboxes: dict[str, _Inbox] = {}
        self._memberships: dict[str, set[str]] = {}  # local channel -> its groups
        self._reader: asyncio.Task | None = None
        self._keeper: asyncio.Task | None = None

    def create_pool(self, index: int):
        """channels-redis's pool, but a burst past its size waits for a connection instead of failing.

        redis-py's pool raises MaxConnectionsError at once past 100 connections in use: 400
        sockets connecting together lost some of their group_add()s (bench/scaleout.py).
        """
        host = dict(self.hosts[index])
        if "address" not in host:
            return super().create_pool(index)
        host.setdefault("max_connections", 100)
        host.setdefault("timeout", 10)  # seconds a command waits for a free connection
        return redis.asyncio.BlockingConnectionPool.from_url(host.pop("address"), **host)

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
        if self._is_local(channel):
            self._inbox(channel).queue.put_nowait(dict(message))
            return
        await super().send(channel, message)

    async def group_send(self, group: str, message: dict) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        await self.send_to_members(group, await self.group_members(group), message)

    async def group_members(self, group: str) -> list[str]:
        """The channels in `group` now: one round trip to Redis.

        A sender of many messages to one group (a generation's deltas) may read them once and
        send several messages with send_to_members(), so a socket of its own process gets them
        without any round trip; it must read them again when a socket may have joined.
        """
        key = self._group_key(group)
        async with self.connection(self.consistent_hash(group)).pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
            pipe.zrange(key, 0, -1)
            _, members = await pipe.execute()
        return [member.decode() for member in members]

    async def send_to_members(self, group: str, members: list[str], message: dict) -> None:
        """group_send() to members read by group_members(): this process's directly, the others' via Redis."""
        remote = []
        for channel in members:
            if self._is_local(channel):
                self._inbox(channel).queue.put_nowait(dict(message))
            else:
                remote.append(channel)
        if remote:
            await self._send_to_channels(group, remote, message)

    async def _send_to_channels(self, group: str, channels: list[str], message: dict) -> None:
        """channels-redis's group_send after its member lookup: one capped ZADD per Redis key."""
        keys_by_connection, message_by_key, capacity_by_key = self._map_channel_keys_to_connection(channels, message)
        for index, keys in keys_by_connection.items():
            args = [message_by_key[key] for key in keys] + [capacity_by_key[key] for key in keys]
            over = await self.connection(index).eval(_GROUP_SEND, len(keys), *keys, *args, time.time(), self.expiry)
            if over:
                log.warning("channel layer: %d of %d sockets over capacity in group %s", over, len(channels), group)

    def _is_local(self, channel: str) -> bool:
        return channel.startswith(self._local)

    @property
    def _local(self) -> str:
        return f"specific.{self.client_prefix}!"

    async def new_channel(self, prefix: str = "specific") -> str:
        name = await super().new_channel(prefix)
        self._inbox(name)
        return name

    async def group_add(self, group: str, channel: str) -> None:
        await super().group_add(group, channel)
        if "!" in channel:
            self._memberships.setdefault(channel, set()).add(group)

    async def group_discard(self, group: str, channel: str) -> None:
        groups = self._memberships.get(channel)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._memberships[channel]
        await super().group_discard(group, channel)

    def _inbox(self, channel: str) -> _Inbox:
        inbox = self._inboxes.get(channel)
        if inbox is None:
            inbox = self._inboxes[channel] = _Inbox(channels_redis.core.BoundedQueue(self.capacity))
        return inbox

    def _ensure_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is None or self._reader.done() or self._reader.get_loop() is not loop:
            self._reader = loop.create_task(self._read_forever(), name="channel-layer-reader")
            self._keeper = loop.create_task(self._keep_forever(), name="channel-layer-keeper")

    async def _read_forever(self) -> None:
        """Every message for this process's channels, into their inboxes; survives Redis errors."""
        failures = 0
        while True:
            try:
                if failures:  # reachable again? say so now, not after a blocking pop's 5 s
                    await self.connection(self.consistent_hash(self._local)).ping()
                batch = await self._pop_waiting() if not failures else []
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.warning("channel layer: cannot read from Redis (%s); retrying", _describe(exc))
                await asyncio.sleep(min(0.2 * 2**failures, 5.0))
                continue
            if failures:
                log.warning("channel layer: reading from Redis again after %d failed attempt(s)", failures)
                failures = 0
            for content in batch:
                message = self.deserialize(content)
                target = message.pop("__asgi_channel__")
                for name in target if isinstance(target, list) else [target]:
                    self._inbox(name).queue.put_nowait(message)

    async def _pop_waiting(self) -> list[bytes]:
        """The messages waiting for this process, oldest first: one blocking pop, then the rest at once.

        No backup queue as in channels-redis's receive: this reader is never cancelled,
        and what a dying process had popped was for its own sockets, which die with it.
        """
        key = self.prefix + self._local
        connection = self.connection(self.consistent_hash(self._local))
        first = await connection.bzpopmin(key, timeout=self.brpop_timeout)
        if first is None:
            return []
        rest = await connection.zpopmin(key, POP_BATCH)
        return [first[1], *(member for member, _ in rest)]

    async def _keep_forever(self) -> None:
        """Drop inboxes nobody reads any more; renew the group memberships of the live ones."""
        every = max(1.0, min(self.group_expiry / 4, 30.0))
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for name, inbox in list(self._inboxes.items()):
                if inbox.waiters == 0 and now - inbox.touched > self.expiry:
                    del self._inboxes[name]
                    self._memberships.pop(name, None)
            try:
                for channel, groups in list(self._memberships.items()):
                    for group in list(groups):
                        await super().group_add(group, channel)
            except Exception as exc:
                log.warning("channel layer: cannot renew group memberships (%s); retrying", _describe(exc))


@dataclass
class _Inbox:
    queue: asyncio.Queue
    waiters: int = 0
    touched: float = field(default_factory=time.monotonic)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
