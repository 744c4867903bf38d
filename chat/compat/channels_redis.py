"""channels-redis's internals that the Redis channel layer relies on.

Written against channels-redis 4.3.0 and redis-py 8.1.0 (requirements.lock);
tests/compat/test_compat_channels_redis.py fails when one of these changes.

* Its storage. Every channel of a process ("specific.<client_prefix>!<id>") is stored under
  one key, the layer's prefix and "specific.<client_prefix>!": a sorted set of serialized
  messages scored by their send time, each carrying the name of its channel in
  `__asgi_channel__` (a name when sent by send(), a list when sent by group_send()). A
  group is the sorted set prefix + ":group:" + its name, of channel names scored by the time
  they joined. pop_process_messages() and deliver() read a process's key; group_members()
  reads a group as group_send() does, dropping memberships past group_expiry first.
* group_send() does its member lookup and its delivery in one method. send_to_channels() is
  the delivery alone (_map_channel_keys_to_connection, then GROUP_SEND_LUA, a copy of its
  script), so a sender that read a group's members once can send it many messages.
* send_batch() is send_to_channels() for several messages in one round trip per shard (a
  pipeline of GROUP_SEND_LUA calls, in order): the layer's sender drains its queue with it.
* connection(index) and consistent_hash(name): the Redis connection of a name's shard.
* create_pool(index) builds a shard's pool from hosts[index] (its "address" and redis-py's
  keyword arguments). redis-py's ConnectionPool raises MaxConnectionsError at once when all
  its connections are in use, so a burst of sockets connecting together lost some of their
  group_add()s; here a BlockingConnectionPool waits for a free connection instead.
* BoundedQueue, the queue of channels-redis's receive buffer: at capacity it drops its oldest
  message instead of growing (django/channels_redis#212).

Why the layer reads its process's key itself: in channels-redis whichever receive() holds the
process's receive lock runs the BZPOPMIN for every local channel, and cancelling it after
Redis popped a message but before the reply was read drops that message, whoever it was for
(django/channels_redis#151 and #366, the rewrite proposed in #165, django/channels#1683).
Channels cancels a socket's receive() whenever the socket closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import channels_redis.core
import redis.asyncio

# channels-redis's group_send script: add the message to each key still under its capacity.
GROUP_SEND_LUA = """
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


class ChannelsRedisLayer(channels_redis.core.RedisChannelLayer):
    """channels-redis's layer, with what a layer of its own needs of its storage given names."""

    # A shard's pool: at most this many connections, a command waiting this many seconds for a
    # free one (None: channels-redis's own pool, which fails at once when all are in use).
    pool_max_connections: int | None = None
    pool_wait_seconds: float | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # What the names of this process's channels start with (new_channel's), and their key's.
        self.process_prefix = f"specific.{self.client_prefix}!"

    def create_pool(self, index: int):
        """channels-redis's pool, or one that waits for a free connection past pool_max_connections."""
        host = dict(self.hosts[index])
        if "address" not in host or self.pool_max_connections is None:
            return super().create_pool(index)
        host.setdefault("max_connections", self.pool_max_connections)
        host.setdefault("timeout", self.pool_wait_seconds)  # seconds a command waits for a free connection
        return redis.asyncio.BlockingConnectionPool.from_url(host.pop("address"), **host)

    def connection_for(self, name: str):
        """The Redis connection of the shard that holds `name` (a group, or a process's channels)."""
        return self.connection(self.consistent_hash(name))

    def new_buffer(self) -> channels_redis.core.BoundedQueue:
        """A queue like the one channels-redis buffers a channel's messages in: at capacity it drops the oldest."""
        return channels_redis.core.BoundedQueue(self.capacity)

    async def group_members(self, group: str) -> list[str]:
        """The channels in `group` now: one round trip to Redis, group_send()'s own lookup."""
        key = self._group_key(group)
        async with self.connection_for(group).pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
            pipe.zrange(key, 0, -1)
            _, members = await pipe.execute()
        return [member.decode() for member in members]

    async def send_to_channels(self, channels: list[str], message: dict) -> int:
        """group_send() after its member lookup: one capped ZADD per Redis key; how many channels were full."""
        keys_by_connection, message_by_key, capacity_by_key = self._map_channel_keys_to_connection(channels, message)
        over = 0
        for index, keys in keys_by_connection.items():
            args = [message_by_key[key] for key in keys] + [capacity_by_key[key] for key in keys]
            over += await self.connection(index).eval(GROUP_SEND_LUA, len(keys), *keys, *args, time.time(), self.expiry)
        return over

    async def send_batch(self, batch: list[tuple[list[str], dict]]) -> int:
        """send_to_channels() for each (channels, message) in order, one pipeline per shard; how many were full."""
        calls: dict[int, list[tuple]] = {}
        for channels, message in batch:
            by_connection, message_by_key, capacity_by_key = self._map_channel_keys_to_connection(channels, message)
            for index, keys in by_connection.items():
                args = [message_by_key[key] for key in keys] + [capacity_by_key[key] for key in keys]
                calls.setdefault(index, []).append((len(keys), *keys, *args, time.time(), self.expiry))
        over = 0
        for index, evals in calls.items():
            async with self.connection(index).pipeline(transaction=False) as pipe:
                for call in evals:
                    pipe.eval(GROUP_SEND_LUA, *call)
                over += sum(await pipe.execute())
        return over

    async def pop_process_messages(self, most: int) -> list[bytes]:
        """The messages waiting for this process's channels, oldest first: one blocking pop, then up to `most` more.

        No backup queue as in channels-redis's receive: the caller must never be cancelled
        between the pop and the use of what it returned. A Redis error after the blocking pop
        keeps what it popped (the error comes again at the next call); a reply lost in the cut
        itself is lost, which a socket sees as a gap in a reply's deltas (ChatConsumer.chat_delta).
        """
        key = self.prefix + self.process_prefix
        connection = self.connection_for(self.process_prefix)
        first = await connection.bzpopmin(key, timeout=self.brpop_timeout)
        if first is None:
            return []
        try:
            rest = await connection.zpopmin(key, most)
        except (redis.RedisError, OSError):
            return [first[1]]
        return [first[1], *(member for member, _ in rest)]

    def deliver(self, popped: list[bytes], inbox_of: Callable[[str], Any]) -> None:
        """Put each message popped from this process's key in `inbox_of(channel).queue` for each channel it is for."""
        for content in popped:
            message = self.deserialize(content)
            target = message.pop("__asgi_channel__")
            for name in target if isinstance(target, list) else [target]:
                inbox_of(name).queue.put_nowait(message)
