"""Redis cut mid-stream under two processes (PostgreSQL and Redis each behind a proxy the tests cut).

Tabs on a stream's own process go on through the cut; tabs on the other process get the rest
after Redis's return, as it streams, not in one frame at the end; nothing is lost; a stop and a
new message during the cut work; no reply is left streaming.
"""

import asyncio
import contextlib
import os
import signal

import msgpack
import pytest
import redis

from tests.cluster.test_scaleout import _cluster, row, sign_in, streamed, text
from tests.live import Tab, wait_until
from tests.services import REDIS_URL, postgres_database, redis_prefix

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(fake_server):
    with postgres_database("chat_blips", migrated=True) as database_url, redis_prefix("chat_blips") as prefix:
        yield from _cluster(fake_server, database_url, prefix)


async def frames_for(tab: Tab, seconds: float) -> list[dict]:
    """Every frame the tab gets in that many seconds (the length of the outage)."""
    frames = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                frames.append(await tab.frame(seconds + 5))
    return frames


def reading_from_redis(server) -> bool:
    """Whether the server's channel layer reads from Redis: it said so again after each failure to read.

    An outage the previous test ended may not be over for a reader still waiting to try again: one
    cut then in its failures logs no new line of its own."""
    output = server.output()
    return output.count("cannot read from Redis") == output.count("reading from Redis again")


@contextlib.asynccontextmanager
async def redis_cut(server):
    server.redis_proxy.cut()
    try:
        yield
    finally:
        server.redis_proxy.restore()


@pytest.mark.parametrize(
    "seconds", [5, pytest.param(60, marks=[pytest.mark.slow, pytest.mark.timeout(300)], id="60")], ids=str
)
async def test_a_redis_cut_mid_stream_freezes_no_tab_and_loses_nothing(cluster, seconds):
    first, second = cluster
    cookie = sign_in(first)
    # 20 ms a chunk: it outlasts the cut by about 15 s.
    prompt = f"[[delay:20]] [[chunks:{(seconds + 15) * 50}]]"
    async with contextlib.AsyncExitStack() as stack:
        one, two = [await stack.enter_async_context(Tab(server, cookie)) for server in (first, second)]
        await one.send(type="send", conversation=None, content=prompt)
        await two.send(type="send", conversation=None, content=prompt)
        seen = {one: await one.until("delta"), two: await two.until("delta")}
        # Each stream watched from the other process too: its frames cross Redis.
        watch_one, watch_two = [await stack.enter_async_context(Tab(server, cookie)) for server in (second, first)]
        for watcher, tab in ((watch_one, one), (watch_two, two)):
            await watcher.send(type="attach", conversation=seen[tab][0]["conversation"])
            seen[watcher] = await watcher.until("snapshot")
        tabs = (one, two, watch_one, watch_two)
        async with redis_cut(first):
            during = await asyncio.gather(*(frames_for(tab, seconds) for tab in tabs))
        for tab, frames in zip(tabs, during, strict=True):
            seen[tab] += frames
        # The tabs on each stream's own process went on during the cut.
        assert text(during[0]) and text(during[1])

        # After the return every tab gets deltas again as they stream: the stream has about 15 s left,
        # and at least two deltas come before its `done` (not the rest in one frame at the end).
        # Every tab is read at once: a tab left unread answers no ping, and the server closes it.
        async def two_deltas(tab: Tab) -> list[dict]:
            return await tab.until("delta", timeout=15) + await tab.until("delta", timeout=15)

        for tab, after in zip(tabs, await asyncio.gather(*(two_deltas(tab) for tab in tabs)), strict=True):
            assert all(f["type"] != "done" for f in after)
            seen[tab] += after
        for tab, rest in zip(tabs, await asyncio.gather(*(tab.until("done", timeout=60) for tab in tabs)), strict=True):
            seen[tab] += rest
    for tab, origin in ((one, one), (two, two), (watch_one, one), (watch_two, two)):
        done = seen[tab][-1]
        assert done["status"] == "complete" and done["message"] == seen[origin][-1]["message"]
        assert row(first, done["message"]) == ("complete", streamed(seen[tab]))
    for server in (first, second):
        log = server.output()
        assert "cannot send through Redis" in log or "cannot read from Redis" in log
        assert "Traceback" not in log


def waiting_deltas(prefix: str) -> list[tuple[bytes, bytes]]:
    """(key, member) of each `chat.delta` waiting in Redis for a process that does not read it now."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        found = []
        for key in client.scan_iter(match=f"{prefix}specific.*", _type="zset"):
            for member in client.zrange(key, 0, -1):
                # channels-redis's storage: 12 random bytes, then the message in msgpack
                if msgpack.unpackb(member[12:]).get("type") == "chat.delta":
                    found.append((key, member))
        return found
    finally:
        client.close()


async def test_a_delta_lost_on_its_way_through_redis_is_made_good_by_a_snapshot(cluster):
    """A message Redis had popped when its connection broke is gone: the tab sees the gap in the
    deltas' seq and gets the whole text again, not a reply with a hole in it. (The watcher's process
    is paused so that its deltas wait in Redis, where the test takes one away.)"""
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(second, cookie) as owner, Tab(first, cookie) as watcher:
        await owner.send(type="send", conversation=None, content="[[delay:20]] [[chunks:1000]]")
        started = (await owner.until("delta"))[0]
        await watcher.send(type="attach", conversation=started["conversation"])
        seen = await watcher.until("snapshot")
        os.kill(first.process.pid, signal.SIGSTOP)  # the watcher's deltas wait in Redis for its process
        try:
            assert await asyncio.to_thread(wait_until, lambda: len(waiting_deltas(first.redis_prefix)) >= 3, 20)
            key, lost = waiting_deltas(first.redis_prefix)[1]
            with redis.Redis.from_url(REDIS_URL) as client:
                assert client.zrem(key, lost) == 1  # as if popped by a pop whose reply a cut took
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        seen += await watcher.until("done", timeout=60)
        await owner.until("done", timeout=60)
    attached, again = [f for f in seen if f["type"] == "snapshot"]
    assert again["seq"] > attached["seq"]
    assert row(first, started["message"]) == ("complete", streamed(seen))


async def test_a_stop_during_a_redis_cut_ends_the_stream_from_either_process(cluster):
    first, second = cluster
    cookie = sign_in(first)
    for stopper_on in (second, first):  # the other process (through the database), then the owner's own
        async with Tab(first, cookie) as owner, Tab(stopper_on, cookie) as stopper:
            await owner.send(type="send", conversation=None, content="[[delay:20]] [[chunks:3000]]")
            started = (await owner.until("delta"))[0]
            await stopper.send(type="attach", conversation=started["conversation"])
            await stopper.until("snapshot")
            async with redis_cut(first):
                await stopper.send(type="stop", message=started["message"])
                # Ended while Redis is still away: the owner's tab, on the stream's process, is told.
                ended = await owner.until("done", timeout=30)
            assert ended[-1]["status"] == "stopped"
            # The stopping tab is not closed, and gets the `done` too.
            assert (await stopper.until("done", timeout=30))[-1]["status"] == "stopped"
            assert await stopper.still_open()
        assert row(first, started["message"])[0] == "stopped"


async def test_a_message_sent_during_a_redis_cut_streams_on_its_process_and_leaves_nothing_streaming(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with redis_cut(first):
        for server in (first, second):
            async with Tab(server, cookie) as tab:
                await tab.send(type="send", conversation=None, content="[[chunks:5]]")
                frames = await tab.until("done", timeout=30)
                assert frames[-1]["status"] == "complete"
                assert row(first, frames[-1]["message"]) == ("complete", text(frames))
                # The conversation is not blocked: a second message in it is answered too.
                await tab.send(type="send", conversation=frames[-1]["conversation"], content="[[chunks:3]]")
                assert (await tab.until("done", timeout=30))[-1]["status"] == "complete"


async def test_a_redis_back_empty_after_a_restart_has_every_membership_written_again(cluster):
    """Redis restarted without persistence has forgotten every group membership, not only those of the
    outage: each process writes all of its own again once it reads from Redis, so a tab watching from
    another process gets the next answer, rather than nothing until the keeper's renewal (up to 30 s)."""
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as owner:
        await owner.send(type="send", conversation=None, content="[[chunks:2]]")
        conversation = (await owner.until("done"))[-1]["conversation"]
        async with Tab(second, cookie) as watcher:
            await watcher.send(type="attach", conversation=conversation)
            assert (await watcher.frame())["type"] == "attached"
            line, cut = "every group membership renewed after the outage", "cannot read from Redis"
            for server in (first, second):
                assert await asyncio.to_thread(wait_until, lambda s=server: reading_from_redis(s))
            before = [(server.output().count(line), server.output().count(cut)) for server in (first, second)]
            async with redis_cut(first):
                with redis.Redis.from_url(REDIS_URL) as client:  # the restart: nothing of the cluster's is left
                    for key in client.scan_iter(match=f"{first.redis_prefix}*", count=1000):
                        client.delete(key)
                for server, (_, cuts) in zip((first, second), before, strict=True):
                    assert await asyncio.to_thread(wait_until, lambda s=server, c=cuts: s.output().count(cut) > c)
            for server, (renewals, _) in zip((first, second), before, strict=True):
                assert await asyncio.to_thread(wait_until, lambda s=server, c=renewals: s.output().count(line) > c)
            await owner.send(type="send", conversation=conversation, content="[[chunks:5]]")
            sent, watched = await owner.until("done", timeout=30), await watcher.until("done", timeout=30)
            assert sent[-1]["status"] == watched[-1]["status"] == "complete"
            assert text(sent) == streamed(watched) != ""


async def test_a_stream_that_ends_while_redis_is_back_empty_still_ends_on_the_other_process(cluster):
    """Redis restarted without persistence: the stream's `done`, sent as it comes back, may reach the group before
    the other process has written its memberships again, and then reaches nobody there. That process's sockets
    read again what they watch once their memberships are back: the watcher gets the stored answer and `done`."""
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as owner, Tab(second, cookie) as watcher:
        await owner.send(type="send", conversation=None, content="[[delay:20]] [[chunks:150]]")
        sent = await owner.until("delta")
        started = sent[0]
        await watcher.send(type="attach", conversation=started["conversation"])
        watched = await watcher.until("snapshot")
        async with redis_cut(first):
            with redis.Redis.from_url(REDIS_URL) as client:  # the restart: nothing of the cluster's is left
                for key in client.scan_iter(match=f"{first.redis_prefix}*", count=1000):
                    client.delete(key)
            sent += await owner.until("done", timeout=30)  # ended during the cut, told on its own process
        watched += await watcher.until("done", timeout=30)
    assert sent[-1]["status"] == watched[-1]["status"] == "complete"
    stored = row(first, started["message"])
    assert stored == ("complete", text(sent)) and streamed(watched) == stored[1]
