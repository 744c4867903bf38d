"""What chat/compat/channels_redis.py relies on in channels-redis still holds: these fail when an upgrade changes it."""

from __future__ import annotations

import asyncio
import inspect
import re

import channels_redis.core
import pytest
import redis.asyncio
from channels.layers import BaseChannelLayer

from chat.compat.channels_redis import GROUP_SEND_LUA, ChannelsRedisLayer
from tests.services import REDIS_URL, redis_prefix
from tests.upstream_source import assert_unchanged

RELIED_ON_BY = "chat/compat/channels_redis.py"
UPSTREAM = channels_redis.core.RedisChannelLayer


def test_the_group_send_script_is_channels_redis_own():
    source = inspect.getsource(UPSTREAM.group_send)
    theirs = re.search(r'group_send_lua = """(.*?)"""', source, re.DOTALL).group(1)
    assert re.sub(r"\s+", "", GROUP_SEND_LUA) == re.sub(r"\s+", "", theirs)
    # ...and the arguments it is called with: the messages, the capacities, the time and the expiry.
    assert_unchanged(UPSTREAM.group_send, "c9623ea6ccfa7308", RELIED_ON_BY)
    assert_unchanged(UPSTREAM._map_channel_keys_to_connection, "789f9193b4536625", RELIED_ON_BY)


def test_the_storage_and_its_helpers_are_the_ones_read():
    assert_unchanged(UPSTREAM.__init__, "d0550cf4bccb9a90", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.send, "1b2ad54990702acb", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.receive, "158a09895d9a7c8e", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.new_channel, "339845a6686b40a5", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.group_add, "85ed67999d94bb85", RELIED_ON_BY)
    assert_unchanged(UPSTREAM._group_key, "7e89938e1cb20f26", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.connection, "d975ed8505cf7594", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.consistent_hash, "ba115e0235516e21", RELIED_ON_BY)
    assert_unchanged(UPSTREAM.create_pool, "078b4e157f6e27bc", RELIED_ON_BY)
    assert_unchanged(BaseChannelLayer.non_local_name, "1c760aa27cf174c5", RELIED_ON_BY)
    assert_unchanged(channels_redis.core.BoundedQueue.put_nowait, "e24e2d2b5723c1f0", RELIED_ON_BY)


class Inbox:
    def __init__(self) -> None:
        self.queue = asyncio.Queue()


def layer(**config) -> ChannelsRedisLayer:
    return ChannelsRedisLayer(hosts=[{"address": REDIS_URL}], prefix="pre", **config)


async def test_a_processs_channels_share_the_key_its_reader_pops():
    local = layer()
    first, second = await local.new_channel(), await local.new_channel()
    assert first.startswith(local.process_prefix) and second.startswith(local.process_prefix)
    # send() stores a process-local channel's message under prefix + non_local_name...
    assert local.non_local_name(first) == local.non_local_name(second) == local.process_prefix
    # ...and group_send() too, one message for both, naming them in __asgi_channel__.
    keys, messages, capacities = local._map_channel_keys_to_connection([first, second], {"type": "x"})
    key = "pre" + local.process_prefix
    assert [*keys.values()] == [[key]] and capacities == {key: local.capacity}
    inboxes = {first: Inbox(), second: Inbox()}
    local.deliver([messages[key]], inboxes.__getitem__)
    assert inboxes[first].queue.get_nowait() == inboxes[second].queue.get_nowait() == {"type": "x"}


def test_a_group_is_its_own_sorted_set_key():
    assert layer()._group_key("g") == b"pre:group:g"


def test_a_pool_waits_for_a_free_connection_only_when_sized():
    assert not isinstance(layer().create_pool(0), redis.asyncio.BlockingConnectionPool)
    sized = layer()
    sized.pool_max_connections, sized.pool_wait_seconds = 7, 3
    pool = sized.create_pool(0)
    assert isinstance(pool, redis.asyncio.BlockingConnectionPool)
    assert pool.max_connections == 7 and pool.timeout == 3


async def test_the_buffer_queue_drops_its_oldest_message_when_full():
    queue = layer(capacity=2).new_buffer()
    for n in range(3):
        queue.put_nowait(n)
    assert [queue.get_nowait(), queue.get_nowait()] == [1, 2]


# --- against Redis (a key prefix of this test run) ---------------------------------------


@pytest.fixture
def prefix():
    with redis_prefix("chat_compat") as name:
        yield name


async def test_what_channels_redis_stores_is_what_is_popped_and_read(prefix):
    ours = ChannelsRedisLayer(hosts=[{"address": REDIS_URL}], prefix=prefix)
    channel = await ours.new_channel()
    # channels-redis's own send and group_add write; this module's reads find it.
    await UPSTREAM.send(ours, channel, {"type": "direct"})
    await UPSTREAM.group_add(ours, "g", channel)
    assert await ours.group_members("g") == [channel]
    assert await ours.send_to_channels([channel], {"type": "grouped"}) == 0
    inboxes = {channel: Inbox()}
    ours.deliver(await ours.pop_process_messages(10), inboxes.__getitem__)
    assert [inboxes[channel].queue.get_nowait() for _ in range(2)] == [{"type": "direct"}, {"type": "grouped"}]
    # Several messages in one pipeline, in order, each where send_to_channels would put it.
    assert await ours.send_batch([([channel], {"type": "one"}), ([channel], {"type": "two"})]) == 0
    ours.deliver(await ours.pop_process_messages(10), inboxes.__getitem__)
    assert [inboxes[channel].queue.get_nowait()["type"] for _ in range(2)] == ["one", "two"]
    await ours.close_pools()
