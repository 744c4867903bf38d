"""The single-process channel layer keeps Channels' in-memory semantics; the Redis one loses nothing."""

import asyncio

import orjson
import pytest
import redis
from channels.exceptions import ChannelFull

from chat.runtime.channel_layers import LocalChannelLayer, RedisChannelLayer
from chat.streaming.frames import frame, merge_deltas
from tests.proxy import proxy_for, via
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
    monkeypatch.setattr(LocalChannelLayer, "clean_every", 0)
    layer._clean_expired()
    assert channel not in layer.channels and channel not in layer.groups.get("g", {})


# --- the Redis layer (real Redis, a key prefix of this test run) ----------------


@pytest.fixture
def prefix():
    with redis_prefix("chat_layers") as name:
        yield name


def redis_layer(prefix: str, **config) -> RedisChannelLayer:
    return RedisChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": 15}], prefix=prefix, **config)


async def cancelled_receives_lose_nothing(sender, layer) -> list[int]:
    """Messages from another process to one channel while another channel's receive is cancelled over and over."""
    listener, closer = await layer.new_channel(), await layer.new_channel()
    got: list[int] = []

    async def listen():
        while len(got) < 200:
            got.append((await layer.receive(listener))["n"])

    listening = asyncio.create_task(listen())
    for n in range(200):
        # A socket closing: Channels cancels its pending receive.
        waiting = asyncio.create_task(layer.receive(closer))
        await sender.send(listener, {"type": "x", "n": n})
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
    assert await cancelled_receives_lose_nothing(redis_layer(prefix), redis_layer(prefix)) == list(range(200))


async def test_a_socket_of_the_same_process_gets_group_messages_without_redis(prefix):
    layer, other = redis_layer(prefix), redis_layer(prefix)
    mine, theirs = await layer.new_channel(), await other.new_channel()
    await layer.group_add("g", mine)
    await other.group_add("g", theirs)
    await layer.group_send("g", {"type": "hello"})
    # No receive() has run, so no reader: only an in-process delivery can have put it there.
    assert layer._inboxes[mine].queue.get_nowait() == {"type": "hello"}
    assert await asyncio.wait_for(other.receive(theirs), 5) == {"type": "hello"}
    await layer.send(mine, {"type": "direct"})
    assert layer._inboxes[mine].queue.get_nowait() == {"type": "direct"}


async def test_50_streams_from_another_process_lose_no_message(prefix):
    """A burst larger than the process's Redis inbox capacity, read as fast as it is written."""
    sender, layer = redis_layer(prefix, capacity=1000), redis_layer(prefix, capacity=1000)
    channels = [await layer.new_channel() for _ in range(50)]
    for n, channel in enumerate(channels):
        await layer.group_add(f"stream{n}", channel)

    async def stream(n: int) -> None:
        for seq in range(60):
            await sender.group_send(f"stream{n}", {"type": "delta", "seq": seq})

    async def watch(channel: str) -> list[int]:
        return [(await layer.receive(channel))["seq"] for _ in range(60)]

    watching = [asyncio.create_task(watch(channel)) for channel in channels]
    await asyncio.gather(*map(stream, range(50)))
    _, pending = await asyncio.wait(watching, timeout=15)
    for task in pending:
        task.cancel()
    assert not pending and [task.result() for task in watching] == [list(range(60))] * 50


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


async def test_the_layers_loops_end_when_cancelled_even_if_redis_py_loses_the_cancellation(prefix):
    # On Python 3.11 asyncio.wait_for, under redis-py's writes, can return normally when cancelled
    # (python/cpython#86296): the reader went on and a test's event loop waited for it forever.
    layer = redis_layer(prefix)
    popping = asyncio.Event()

    async def pop_that_loses_a_cancellation(most: int) -> list[bytes]:
        popping.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass
        return []

    layer.pop_process_messages = pop_that_loses_a_cancellation
    await layer.new_channel()
    receiving = asyncio.create_task(layer.receive(await layer.new_channel()))  # starts the layer's tasks
    await popping.wait()
    loops = [layer._reader, layer._sender, layer._keeper]
    for task in [*loops, receiving]:
        task.cancel()
    done, pending = await asyncio.wait(loops, timeout=10)
    assert not pending and all(task.cancelled() for task in done)


async def test_a_redis_error_after_the_blocking_pop_keeps_what_it_popped(prefix, monkeypatch):
    sender, layer = redis_layer(prefix), redis_layer(prefix)
    channel = await layer.new_channel()
    await sender.send(channel, {"type": "one"})
    await sender.send(channel, {"type": "two"})

    async def cut(*args):
        raise redis.ConnectionError("Connection reset by peer")

    monkeypatch.setattr(redis.asyncio.Redis, "zpopmin", cut)
    layer.deliver(await layer.pop_process_messages(10), layer._inbox)
    monkeypatch.undo()
    layer.deliver(await layer.pop_process_messages(10), layer._inbox)
    assert [layer._inbox(channel).queue.get_nowait()["type"] for _ in range(2)] == ["one", "two"]


async def test_posts_read_a_groups_members_once_a_second_not_once_a_message(prefix):
    sender, layer = redis_layer(prefix), redis_layer(prefix)
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    reads: list[str] = []
    read_members = sender.group_members

    async def counted(group: str) -> list[str]:
        reads.append(group)
        return await read_members(group)

    sender.group_members = counted
    loop = asyncio.get_running_loop()
    started = loop.time()
    for seq in range(30):
        sender.post_to_group("g", {"type": "delta", "seq": seq})
        await asyncio.sleep(0.01)
    got = [(await asyncio.wait_for(layer.receive(channel), 5))["seq"] for _ in range(30)]
    assert got == list(range(30))
    # Once a second of posting however long it took here, not once a message.
    assert 1 <= len(reads) <= 2 + (loop.time() - started), reads


def delta(seq: int, content: str) -> dict:
    text = frame(type="delta", message=7, seq=seq, content=content)
    return {"type": "chat.delta", "message": 7, "seq": seq, "text": text, "conversation": 1}


async def test_posts_during_a_redis_outage_wait_merged_and_arrive_in_order_after_it(prefix):
    proxy = proxy_for(REDIS_URL)
    hosts = [{"address": via(proxy, REDIS_URL), "socket_timeout": 15}]
    sender = RedisChannelLayer(hosts=hosts, prefix=prefix, capacity=1000)
    layer = redis_layer(prefix)
    mine, theirs = await sender.new_channel(), await layer.new_channel()
    await sender.group_add("g", mine)
    await layer.group_add("g", theirs)
    sender.post_to_group("g", delta(1, "a"), merge_deltas)
    assert orjson.loads((await asyncio.wait_for(layer.receive(theirs), 5))["text"])["content"] == "a"
    proxy.cut()
    try:
        for seq in range(2, 202):
            sender.post_to_group("g", delta(seq, f"{seq},"), merge_deltas)
            await asyncio.sleep(0.005)
        sender.post_to_group("g", {"type": "chat.done", "message": 7, "text": "{}"}, merge_deltas)
        # This process's own socket got every message at once, one by one, Redis or not.
        local = [sender._inboxes[mine].queue.get_nowait() for _ in range(202)]
        assert [m.get("seq") for m in local] == [*range(1, 202), None]
    finally:
        proxy.restore()
    got = [await asyncio.wait_for(layer.receive(theirs), 10)]
    while got[-1]["type"] != "chat.done":
        got.append(await asyncio.wait_for(layer.receive(theirs), 10))
    # A batch whose reply the cut lost is sent again (at least once): seq 1, already received above,
    # may come twice, and the page applies a delta only when its seq is past the last one it applied
    # (static/chat/messages.js).
    deltas, applied = [], 1
    for message in got[:-1]:
        frame = orjson.loads(message["text"])
        if frame["seq"] > applied:
            # A merged delta says where its text starts: right after the last one applied, no gap.
            assert message.get("first", frame["seq"]) == applied + 1
            deltas.append(frame)
            applied = frame["seq"]
    # Nothing lost, in order, and merged while Redis was away: far fewer messages than were posted.
    assert "".join(d["content"] for d in deltas) == "".join(f"{seq}," for seq in range(2, 202))
    assert deltas[-1]["seq"] == 201 and len(deltas) < 20
    proxy.close()
