"""The single-process channel layer keeps Channels' in-memory semantics; the Redis one loses nothing."""

import asyncio

import pytest
import redis
from channels.exceptions import ChannelFull

from chat.layers import LocalChannelLayer, RedisChannelLayer
from tests.services import REDIS_URL, redis_prefix


async def test_group_send_reaches_every_member_once_with_its_own_copy():
    layer = LocalChannelLayer(capacity=10)
    a, b = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("g", a)
    await layer.group_add("g", b)
    message = {"type": "chat.delta", "text": "hi"}
    await layer.group_send("g", message)
    got_a, got_b = await layer.receive(a), await layer.receive(b)
    assert got_a == got_b == message and got_a is not message and got_a is not got_b
    await layer.group_discard("g", b)
    await layer.group_send("g", {"type": "x"})
    assert (await layer.receive(a))["type"] == "x" and b not in layer.channels


async def test_a_full_member_misses_a_group_message_and_others_still_get_it():
    layer = LocalChannelLayer(capacity=1)
    full, fine = await layer.new_channel(), await layer.new_channel()
    await layer.send(full, {"type": "first"})
    with pytest.raises(ChannelFull):
        await layer.send(full, {"type": "second"})
    await layer.group_add("g", full)
    await layer.group_add("g", fine)
    await layer.group_send("g", {"type": "to all"})
    assert (await layer.receive(fine))["type"] == "to all"
    assert (await layer.receive(full))["type"] == "first"


async def test_expired_messages_are_dropped(monkeypatch):
    layer = LocalChannelLayer(expiry=0)
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    await layer.send(channel, {"type": "stale"})
    monkeypatch.setattr("chat.layers.CLEAN_EVERY", 0)
    layer._clean_expired()
    assert channel not in layer.channels and channel not in layer.groups.get("g", {})


# --- the Redis layer (real Redis, a key prefix of this test run) ----------------


@pytest.fixture
def prefix():
    with redis_prefix("chat_layers") as name:
        yield name


def redis_layer(prefix: str, **config) -> RedisChannelLayer:
    return RedisChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": 15}], prefix=prefix, **config)


async def cancelled_receives_lose_nothing(layer) -> list[int]:
    """Messages to one channel while another channel's receive is cancelled over and over."""
    listener, closer = await layer.new_channel(), await layer.new_channel()
    got: list[int] = []

    async def listen():
        while len(got) < 200:
            got.append((await layer.receive(listener))["n"])

    listening = asyncio.create_task(listen())
    for n in range(200):
        # A socket closing: Channels cancels its pending receive.
        waiting = asyncio.create_task(layer.receive(closer))
        await layer.send(listener, {"type": "x", "n": n})
        await asyncio.sleep(0.002 * (n % 5))
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    try:
        await asyncio.wait_for(listening, 10)
    except TimeoutError:
        listening.cancel()
    return got


async def test_a_cancelled_receive_never_drops_another_channels_message(prefix):
    """channels-redis #151/#165: a receive cancelled just as BZPOPMIN popped dropped that message."""
    assert await cancelled_receives_lose_nothing(redis_layer(prefix)) == list(range(200))


async def test_live_group_memberships_are_renewed_and_dead_ones_expire(prefix):
    layer = redis_layer(prefix, group_expiry=4)
    member = await layer.new_channel()
    await layer.group_add("g", member)
    receiving = asyncio.create_task(layer.receive(member))
    await asyncio.sleep(6)  # past group_expiry: only the renewal keeps the socket in its group
    await layer.group_send("g", {"type": "still here"})
    assert (await asyncio.wait_for(receiving, 5))["type"] == "still here"
    client = redis.Redis.from_url(REDIS_URL)
    assert 0 < client.ttl(f"{prefix}:group:g") <= 4
    client.close()
