"""Scale-out: two daphne processes on PostgreSQL and Redis, each reached through a proxy the tests can cut.

Streams on one process are watched, attached to and stopped from the other; a killed
process's streams are ended by the survivor; outages of Redis and PostgreSQL lose nothing;
a session ended on one process closes its sockets on the other.
"""

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import time

import aiohttp
import httpx
import psycopg
import pytest
import redis

from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer, Tab
from tests.proxy import proxy_for, via
from tests.services import REDIS_URL, postgres_database, redis_prefix

pytestmark = pytest.mark.cluster

SLOW = "[[delay:20]] [[chunks:300]]"
LEASE = 6


@pytest.fixture(scope="module")
def cluster(fake_server):
    """Two server processes sharing a fresh PostgreSQL database and a Redis channel layer, each behind a proxy."""
    with postgres_database("chat_scaleout", migrated=True) as database_url, redis_prefix("chat_scaleout") as prefix:
        yield from _cluster(fake_server, database_url, prefix)


def _cluster(fake_server, database_url, prefix, **settings):
    pg_proxy, redis_proxy = proxy_for(database_url), proxy_for(REDIS_URL)
    env = {
        "DATABASE_URL": via(pg_proxy, database_url),
        "REDIS_URL": via(redis_proxy, REDIS_URL),
        "REDIS_PREFIX": prefix,
        "UPSTREAM_BASE_URL": fake_server.base_url("i14"),
        "UPSTREAM_API_KEY": FAKE_KEY,
        "UPSTREAM_NAME": "i14",
        "UPSTREAM_MODEL": MODELS["i14"],
        "CHAT_LEASE_SECONDS": str(LEASE),
        # carol runs 50 streams at once, 250 in a minute: the per-person chat limits are off here
        "CHAT_MAX_STREAMS": "0",
        "RATE_LIMIT_PER_MINUTE": "0",
        "CHAT_MAX_SOCKETS_PER_PERSON": "0",  # and 50 tabs of hers watch from each process
        "API_CHECKPOINT_SECONDS": "1",
        # A process's cached API tokens outlive every test: a deactivation elsewhere must be told, not waited out.
        "API_TOKEN_CACHE_SECONDS": "600",
        # And what a person may use: a change elsewhere must be told too (kept for 5 s outside the tests).
        "ACCESS_CACHE_SECONDS": "600",
        **settings,
    }
    setup = {**os.environ, **env, "DATABASE_URL": database_url, "DJANGO_SUPERUSER_PASSWORD": "carol-secret-pw"}
    for command in (["migrate", "--noinput"], ["createsuperuser", "--noinput", "--username", "carol", "--email", ""]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=setup, check=True, capture_output=True)
    servers = [LiveServer(env), LiveServer(env)]
    for server in servers:
        server.start()
    servers[0].database_url = database_url
    servers[0].redis_prefix = prefix
    servers[0].pg_proxy, servers[0].redis_proxy = pg_proxy, redis_proxy
    servers[0].setup_env = setup
    yield servers
    for server in servers:
        server.stop()
    pg_proxy.close()
    redis_proxy.close()


def sign_in(server, username: str = "carol", password: str = "carol-secret-pw") -> str:
    with httpx.Client(base_url=server.url) as browser:
        browser.get("/accounts/login/")
        form = {"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        assert browser.post("/accounts/login/", data=form).status_code == 302
        return browser.cookies["sessionid"]


def text(frames, field="content"):
    return "".join(f.get(field, "") for f in frames if f["type"] == "delta")


def streamed(frames: list[dict]) -> str:
    """The text a tab shows, applied as the page applies it (static/chat/messages.js): a snapshot's
    text (if it attached), then each delta whose `seq` is past the last one applied. Delivery across
    Redis is at least once: a delta whose send was cut before Redis acknowledged it comes again."""
    shown, last = "", 0
    for frame in frames:
        if frame["type"] == "snapshot":
            shown, last = frame["content"], frame["seq"]
        elif frame["type"] == "snapshot_part":  # a long reply's snapshot goes on
            shown += frame.get("content", "")
        elif frame["type"] == "delta" and frame["seq"] > last:
            shown, last = shown + frame.get("content", ""), frame["seq"]
    return shown


async def test_attach_from_another_process_gets_snapshot_then_the_rest(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab:
        await tab.send(type="send", conversation=None, content=SLOW)
        before = await tab.until("delta")
    async with Tab(second, cookie) as other:
        await other.send(type="attach", conversation=before[0]["conversation"])
        frames = await other.until("done")
    attached, snapshot, *rest = frames
    assert attached["message"] == before[0]["message"] and snapshot["type"] == "snapshot"
    assert snapshot["content"].startswith(text(before)) and frames[-1]["status"] == "complete"
    assert all(f["seq"] > snapshot["seq"] for f in rest if f["type"] == "delta")
    with psycopg.connect(first.database_url) as db:
        (content,) = db.execute("SELECT content FROM chat_message WHERE id = %s", [snapshot["message"]]).fetchone()
    assert content == snapshot["content"] + text(rest)


async def test_stop_from_another_process(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab, Tab(second, cookie) as other:
        await tab.send(type="send", conversation=None, content=SLOW)
        started = (await tab.until("delta"))[0]
        await other.send(type="attach", conversation=started["conversation"])
        await other.until("snapshot")
        await other.send(type="stop", message=started["message"])
        mine, theirs = await tab.until("done"), await other.until("done")
    assert mine[-1]["status"] == theirs[-1]["status"] == "stopped"


def row(server, message_id: int) -> tuple[str, str]:
    with psycopg.connect(server.database_url) as db:
        return db.execute("SELECT status, content FROM chat_message WHERE id = %s", [message_id]).fetchone()


async def test_an_idle_socket_stays_open_for_30_seconds(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as one, Tab(second, cookie) as two:
        # Redis's blocking read lasts 5 s: an idle socket used to be closed (1011) every 5-6 s.
        await asyncio.gather(one.silent_for(32), two.silent_for(32))
        await one.send(type="send", conversation=None, content="[[chunks:5]]")
        assert (await one.until("done"))[-1]["status"] == "complete"
    assert "Traceback" not in first.output() + second.output()


async def test_attach_and_stop_after_the_sending_tab_closed(cluster):
    first, second = cluster
    cookie = sign_in(first)
    for where in (first, second):  # the same process as the stream's, then the other one
        async with Tab(first, cookie) as sender:
            await sender.send(type="send", conversation=None, content=SLOW)
            started = (await sender.until("delta"))[0]
        async with Tab(where, cookie) as tab:
            await tab.send(type="attach", conversation=started["conversation"])
            attached, snapshot = await tab.frame(), await tab.frame(5)
            assert attached["message"] == started["message"]
            # the owner's own snapshot (with a seq), not the database fallback
            assert snapshot["type"] == "snapshot" and snapshot["seq"] is not None
            await tab.send(type="stop", message=started["message"])
            rest = await tab.until("done")
        assert rest[-1]["status"] == "stopped"
        assert row(first, started["message"]) == ("stopped", snapshot["content"] + text(rest))


async def test_group_memberships_expire_in_minutes_not_a_day(cluster):
    first, _ = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab:
        await tab.send(type="send", conversation=None, content="[[chunks:3]]")
        done = (await tab.until("done"))[-1]
        client = redis.Redis.from_url(REDIS_URL)
        ttl = client.ttl(f"{first.redis_prefix}:group:chat.conversation.{done['conversation']}")
        client.close()
    assert 0 < ttl <= 300


async def test_a_killed_process_is_swept_with_its_text_saved(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as tab:
        await tab.send(type="send", conversation=None, content="[[delay:50]] [[chunks:2000]]")
        started = (await tab.until("delta"))[0]
    try:
        async with Tab(second, cookie) as other:
            await other.send(type="attach", conversation=started["conversation"])
            seen = await other.until("snapshot")
            # The owner saves the text about once a second: a save made after this attach is awaited
            # (polled: no event tells the test), then the owner dies; nobody saves its text any more.
            checkpoint = await saved_beyond(first, started["message"], seen[1]["content"])
            first.process.kill()
            async with Tab(second, cookie) as late:  # attaching now: the saved text, no hang
                await late.send(type="attach", conversation=started["conversation"])
                await late.until("snapshot", timeout=30)
                # At once, from the database: not after the sweep, which waits out the dead one's lease.
                assert (await asyncio.to_thread(row, first, started["message"]))[0] == "streaming"
                seen += await other.until("done", timeout=60)
                assert (await late.until("done", timeout=60))[-1]["status"] == "interrupted"
            done = seen[-1]
            # A new message in the conversation is not refused as `busy`.
            await other.send(type="send", conversation=started["conversation"], content="[[chunks:3]]")
            assert (await other.until("done"))[-1]["status"] == "complete"
    finally:
        if first.process.poll() is not None:
            first.start()  # the next test gets a working pair again
    assert done["status"] == "interrupted" and "server stopped" in done["error"]
    assert done["recovered"] is True  # the tabs read the stored text again: the tail after the last save is lost
    assert done["usage"]["estimated"] and done["usage"]["completion_tokens"] > 0
    status, saved = row(first, started["message"])
    shown = seen[1]["content"] + text(seen[2:])
    assert status == "interrupted" and shown.startswith(saved) and saved.startswith(checkpoint)


async def saved_beyond(server, message_id: int, content: str) -> str:
    """The message's saved text once it is longer than `content` (60 s at most)."""
    for _ in range(600):
        status, saved = await asyncio.to_thread(row, server, message_id)
        if len(saved) > len(content):
            return saved
        await asyncio.sleep(0.1)
    raise AssertionError(f"not saved again: {status}, {len(saved)} characters")


def streaming_api_tokens(database_url: str) -> int:
    """The completion tokens checkpointed so far for the /v1 stream under way (0 before the first)."""
    with psycopg.connect(database_url) as db:
        found = db.execute(
            "SELECT completion_tokens FROM chat_usage WHERE source = 'api' AND status = 'streaming'"
            " ORDER BY id DESC LIMIT 1"
        ).fetchone()
    return (found[0] or 0) if found else 0


async def test_a_killed_processes_api_stream_is_swept_with_the_tokens_it_had_streamed(cluster):
    first, second = cluster
    # A new second process, which has served no socket and no /v1 request: it sweeps from its start.
    await asyncio.to_thread(second.restart)
    token = await asyncio.to_thread(create_token, first.database_url)
    asked = [{"role": "user", "content": "[[delay:50]] [[chunks:2000]]"}]
    request = {"model": MODELS["i14"], "stream": True, "messages": asked}
    received = []  # characters of content of each chunk read
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        try:
            async with client.stream("POST", first.url + "/v1/chat/completions", json=request) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        received.append(len(delta.get("content") or ""))
                        # Checkpointed (API_CHECKPOINT_SECONDS, 1 s) at least once: then the process dies.
                        checkpointed = await asyncio.to_thread(streaming_api_tokens, first.database_url)
                        if checkpointed:
                            first.process.kill()
                            first.process.wait()
                            break
        finally:
            if first.process.poll() is not None:
                first.start()  # the next test gets a working pair again
    with psycopg.connect(first.database_url) as db:
        for _ in range(600):  # the second process sweeps the dead one's rows within a lease or two
            row = db.execute(
                "SELECT status, completion_tokens, total_tokens - prompt_tokens, estimated, error FROM chat_usage "
                "WHERE source = 'api' ORDER BY id DESC LIMIT 1"
            ).fetchone()
            if row[0] != "streaming":
                break
            await asyncio.sleep(0.1)
    status, completion, total_less_prompt, estimated, error = row
    assert status == "interrupted" and estimated and "server stopped" in error
    read = sum(received)
    # What was checkpointed before the kill: at least the checkpoint seen, at most what was read in
    # all (about four characters a token).
    assert checkpointed <= completion <= math.ceil(read / 4) + 20, (checkpointed, completion, read)
    assert completion > 0 and total_less_prompt == completion


@pytest.mark.timeout(240)
async def test_50_concurrent_streams_deliver_every_delta_and_done(cluster):
    """Every delta in order and `done`, to the sending tab (same process) and to a watcher on the other one."""
    first, second = cluster
    cookie = sign_in(first)
    conversations = []
    for _ in range(50):
        async with Tab(first, cookie) as tab:
            await tab.send(type="send", conversation=None, content="[[chunks:2]]")
            conversations.append((await tab.until("done"))[-1]["conversation"])

    async def one_stream(conversation: int, watcher: Tab) -> tuple[list[dict], list[dict]]:
        async with Tab(first, cookie) as tab:
            await tab.send(type="send", conversation=conversation, content="[[delay:15]] [[chunks:40]]")
            return await asyncio.gather(tab.until("done", timeout=60), watcher.until("done", timeout=60))

    async def churn(stop: asyncio.Event) -> int:
        # Sockets closing mid-stream cancel their layer receive: that must not lose others' messages.
        opened = 0
        while not stop.is_set():
            try:
                async with Tab(first, cookie):
                    opened += 1
                    await asyncio.sleep(0.1)
            except aiohttp.ClientError:
                pass  # a handshake slowed past daphne's 5 s by the 50 streams' database work
        return opened

    async with contextlib.AsyncExitStack() as stack:
        # Watchers on the other process: every frame reaches them through Redis.
        watchers = [await stack.enter_async_context(Tab(second, cookie)) for _ in conversations]
        for watcher, conversation in zip(watchers, conversations, strict=True):
            await watcher.send(type="attach", conversation=conversation)
            assert (await watcher.frame())["type"] == "attached"
        for _ in range(5):
            stop = asyncio.Event()
            churner = asyncio.create_task(churn(stop))
            results = await asyncio.gather(*map(one_stream, conversations, watchers))
            stop.set()
            assert await churner > 0
            for frames, watched in results:
                deltas = [f["seq"] for f in frames if f["type"] == "delta"]
                assert deltas == list(range(1, len(deltas) + 1)) and deltas
                assert frames[-1]["status"] == watched[-1]["status"] == "complete"
                assert [f["seq"] for f in watched if f["type"] == "delta"] == deltas
                assert row(first, frames[-1]["message"]) == ("complete", text(frames)) == ("complete", text(watched))


async def test_a_redis_outage_closes_no_socket_and_streams_resume(cluster):
    first, second = cluster
    cookie = sign_in(first)
    conversations = []
    for server in (first, second):
        async with Tab(server, cookie) as tab:
            await tab.send(type="send", conversation=None, content="[[chunks:2]]")
            conversations.append((await tab.until("done"))[-1]["conversation"])
    async with contextlib.AsyncExitStack() as stack:
        one, two = [await stack.enter_async_context(Tab(server, cookie)) for server in (first, second)]
        # Each conversation also watched from the other process: its frames cross Redis.
        watchers = [await stack.enter_async_context(Tab(server, cookie)) for server in (second, first)]
        for watcher, conversation in zip(watchers, conversations, strict=True):
            await watcher.send(type="attach", conversation=conversation)
            assert (await watcher.frame())["type"] == "attached"
        first.redis_proxy.cut()
        try:
            await asyncio.gather(*(tab.silent_for(4) for tab in (one, two, *watchers)))
        finally:
            first.redis_proxy.restore()
        # Pooled connections broken by the outage are replaced, not handed to a socket's frame.
        for tab, watcher, conversation in zip((one, two), watchers, conversations, strict=True):
            await tab.send(type="send", conversation=conversation, content="[[chunks:5]]")
            sent, watched = await tab.until("done", timeout=30), await watcher.until("done", timeout=30)
            assert sent[-1]["status"] == watched[-1]["status"] == "complete"
            # A delta the first send after the outage lost is made good by a snapshot, as the page applies it.
            assert streamed(sent) == streamed(watched) != "", (sent, watched)
    for server in (first, second):
        assert "cannot read from Redis" in server.output() and "reading from Redis again" in server.output()


async def test_a_postgresql_outage_mid_stream_loses_nothing(cluster):
    first, second = cluster
    cookie = sign_in(first)
    async with Tab(first, cookie) as one, Tab(second, cookie) as two:
        await one.send(type="send", conversation=None, content="[[delay:50]] [[chunks:100]]")
        await two.send(type="send", conversation=None, content="[[delay:50]] [[chunks:100]]")
        mine, theirs = await one.until("delta"), await two.until("delta")
        first.pg_proxy.cut()  # ~5 s of stream left; the database is back only after they end
        try:
            more = await asyncio.gather(one.until("delta"), two.until("delta"))
            await asyncio.sleep(LEASE + 2)  # longer than a lease: nobody may take the other for dead
        finally:
            first.pg_proxy.restore()
        restored = time.monotonic()
        mine += more[0] + await one.until("done", timeout=60)
        theirs += more[1] + await two.until("done", timeout=60)
    for frames in (mine, theirs):
        assert frames[-1]["status"] == "complete" and frames[-1]["at"] >= restored  # told only once stored
        assert row(first, frames[-1]["message"]) == ("complete", text(frames))
    log = first.output() + second.output()
    assert "cannot save the partial answer" in log and "final save failed" in log
    assert "final save landed after" in log


async def test_api_stream_cap_holds_for_simultaneous_requests_to_both_processes(cluster):
    """Twelve requests at once, six to each process: the user's row lock lets exactly API_MAX_STREAMS (8) in."""
    first, second = cluster
    token = await asyncio.to_thread(create_token, first.database_url)
    request = {"model": MODELS["i14"], "stream": True, "messages": [{"role": "user", "content": SLOW}]}
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        opened = [
            client.stream("POST", server.url + "/v1/chat/completions", json=request) for server in (first, second) * 6
        ]
        responses = await asyncio.gather(*(stream.__aenter__() for stream in opened))
        statuses = sorted(response.status_code for response in responses)
        for stream in opened:
            await stream.__aexit__(None, None, None)
    assert statuses == [200] * 8 + [429] * 4


def create_token(database_url: str) -> str:
    env = {**os.environ, "DATABASE_URL": database_url}
    made = subprocess.run(
        [sys.executable, "manage.py", "createtoken", "carol"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    return made.stdout.decode().strip().splitlines()[-1]


def sign_out(server, cookie: str) -> None:
    with httpx.Client(base_url=server.url, cookies={"sessionid": cookie}) as browser:
        assert browser.get("/").status_code == 200
        form = {"csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        assert browser.post("/accounts/logout/", data=form).status_code == 302


async def test_signing_out_on_one_process_closes_that_sessions_sockets_on_the_other(cluster):
    first, second = cluster
    leaving, staying = sign_in(first), sign_in(first)
    async with Tab(second, leaving) as tab, Tab(first, staying) as other:
        await tab.send(type="send", conversation=None, content=SLOW)
        started = (await tab.until("delta"))[0]
        sign_out(first, leaving)
        assert await tab.closed() == 4401
        assert await other.still_open()
        # The stream the signed-out tab started goes on, on its process, to the end.
        await other.send(type="attach", conversation=started["conversation"])
        frames = await other.until("done")
    assert frames[-1]["status"] == "complete"
    with psycopg.connect(first.database_url) as db:
        (content,) = db.execute("SELECT content FROM chat_message WHERE id = %s", [started["message"]]).fetchone()
        (tokens,) = db.execute(
            "SELECT completion_tokens FROM chat_usage WHERE message_id = %s", [started["message"]]
        ).fetchone()
    assert content == frames[1]["content"] + text(frames[2:]) and tokens > 0


USER = "from django.contrib.auth.models import User"


def manage_shell(server, code: str) -> None:
    """Python in `manage.py shell`: a process of its own, on the same database and Redis."""
    run = [sys.executable, "manage.py", "shell", "-c", code]
    subprocess.run(run, cwd=ROOT, env=server.setup_env, check=True, capture_output=True, timeout=60)


async def test_set_password_and_save_anywhere_closes_the_users_sockets_on_every_process(cluster):
    first, second = cluster
    manage_shell(first, f"{USER}; User.objects.create_user('dave', password='dave-secret-pw')")
    cookies = sign_in(first, "dave", "dave-secret-pw"), sign_in(second, "dave", "dave-secret-pw")
    async with Tab(first, cookies[0]) as one, Tab(second, cookies[1]) as two, Tab(first, sign_in(first)) as carol:
        assert await one.still_open() and await two.still_open()
        manage_shell(first, f"{USER}; u = User.objects.get(username='dave'); u.set_password('new-one-42'); u.save()")
        assert await one.closed() == 4401 and await two.closed() == 4401
        assert await carol.still_open()  # another user's sockets are not touched


def manage(server, *command: str) -> str:
    """`manage.py COMMAND …` as a process of its own on the cluster's database and Redis; its output."""
    run = [sys.executable, "manage.py", *command]
    done = subprocess.run(run, cwd=ROOT, env=server.setup_env, check=True, capture_output=True, timeout=60)
    return done.stdout.decode()


async def test_deactivate_signs_out_everywhere_and_stops_streams_on_every_process(cluster):
    first, second = cluster
    manage_shell(first, f"{USER}; User.objects.create_user('erin', password='erin-secret-pw')")
    cookies = sign_in(first, "erin", "erin-secret-pw"), sign_in(second, "erin", "erin-secret-pw")
    token = manage(first, "createtoken", "erin").strip().splitlines()[-1]
    api = httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"})
    # A minute of chunks: the deactivation, a management command starting Django, must find both streams
    # running however busy the machine is; it ends them long before.
    endless = "[[delay:20]] [[chunks:3000]]"
    request = {"model": MODELS["i14"], "stream": True, "messages": [{"role": "user", "content": endless}]}
    short = {"model": MODELS["i14"], "messages": [{"role": "user", "content": "[[chunks:2]]"}]}
    assert (await api.post(second.url + "/v1/chat/completions", json=short)).status_code == 200  # cached there
    async with Tab(first, cookies[0]) as one, Tab(second, cookies[1]) as two, Tab(first, sign_in(first)) as carol:
        await two.send(type="send", conversation=None, content=endless)  # a chat stream on the second process
        started = (await two.until("delta"))[0]
        async with api.stream("POST", first.url + "/v1/chat/completions", json=request) as relayed:
            events = relayed.aiter_lines()
            assert (await anext(events)).startswith(":")  # the /v1 stream on the first process is running
            assert "erin deactivated" in await asyncio.to_thread(manage, first, "deactivate", "erin")
            codes = await one.closed(30), await two.closed(30)
            assert codes == (4401, 4401), f"{codes}\n{first.output()[-3000:]}\n{second.output()[-3000:]}"
            rest = [line async for line in events]
        assert await carol.still_open()
    # The /v1 stream was ended, not left to finish: an error event, then [DONE].
    assert "data: [DONE]" in rest and any("deactivated" in line for line in rest), rest[-5:]
    assert (await api.get(first.url + "/v1/models")).status_code == 401  # the token, from the next request
    with psycopg.connect(first.database_url) as db:
        for _ in range(100):  # the stop travels to the second process and is saved there
            (status,) = db.execute("SELECT status FROM chat_message WHERE id = %s", [started["message"]]).fetchone()
            if status != "streaming":
                break
            await asyncio.sleep(0.1)
        assert status == "stopped"
        # The second process was told (it stopped the stream): its cached token is forgotten, not waited out.
        refused = await api.post(second.url + "/v1/chat/completions", json=short)
        assert refused.status_code == 401, refused.text
        sessions = db.execute("SELECT count(*) FROM django_session WHERE session_key = ANY(%s)", [list(cookies)])
        assert sessions.fetchone() == (0,)
        kept = db.execute(
            "SELECT (SELECT count(*) FROM chat_conversation c JOIN auth_user u ON u.id = c.owner_id"
            " WHERE u.username = 'erin'), (SELECT count(*) FROM chat_usage s JOIN auth_user u ON u.id = s.user_id"
            " WHERE u.username = 'erin')"
        ).fetchone()
    assert kept[0] >= 1 and kept[1] == 3  # the chat's and the API requests' usage rows stay
    await api.aclose()


async def test_a_model_limit_set_in_another_process_holds_at_once_on_every_process(cluster):
    """Each process keeps who may use which model (chat/runtime/kept_reads.py), here for 600 s: a limit
    set by another process (a management shell) reaches both through Redis, and so does its removal."""
    first = cluster[0]
    manage_shell(first, f"{USER}; User.objects.create_user('fay', password='fay-secret-pw')")
    token = manage(first, "createtoken", "fay").strip().splitlines()[-1]
    short = {"model": MODELS["i14"], "messages": [{"role": "user", "content": "[[chunks:2]]"}]}

    async def statuses(wanted: int) -> list[int]:
        """Each process's answer, asked again (up to 10 s) until it is `wanted`: the tell is on its way."""
        found = []
        async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as api:
            for server in cluster:
                for _ in range(100):
                    status = (await api.post(server.url + "/v1/chat/completions", json=short)).status_code
                    if status == wanted:
                        break
                    await asyncio.sleep(0.1)
                found.append(status)
        return found

    assert await statuses(200) == [200, 200]  # both processes now keep what fay may use
    rules = "from chat.models import ModelAccess, Provider; provider = Provider.objects.get(name='i14')"
    manage_shell(first, f"{rules}; ModelAccess.objects.create(provider=provider, model='{MODELS['i14']}')")
    try:
        assert await statuses(403) == [403, 403]  # a limit with no group: no one but superusers
    finally:
        manage_shell(first, f"{rules}; ModelAccess.objects.filter(provider=provider).delete()")
    assert await statuses(200) == [200, 200]
