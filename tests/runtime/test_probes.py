"""GET /healthz, /readyz and /metrics on two server processes; PostgreSQL and Redis behind proxies the test cuts."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import httpx
import openai
import pytest

from tests.conftest import FAKE_KEY, MODELS
from tests.live import LiveServer, wait_until
from tests.proxy import TcpProxy
from tests.services import REDIS_URL, postgres_database, redis_prefix
from tests.sites import make_site

MODEL = MODELS["infyrence"]
TOKEN = "metrics-secret-for-tests"

pytestmark = pytest.mark.cluster


def proxy_for(url: str) -> tuple[TcpProxy, str]:
    """A proxy in front of the service at `url`, and the URL through it."""
    netloc = url.split("//", 1)[1].split("/", 1)[0]
    _userinfo, _, hostport = netloc.rpartition("@")
    host, port = hostport.split(":")
    proxy = TcpProxy(host, int(port))
    return proxy, url.replace(f"{hostport}/", f"127.0.0.1:{proxy.port}/", 1)


@pytest.fixture(scope="module")
def cluster(fake_server, tmp_path_factory):
    """Two processes on PostgreSQL and Redis (each through a proxy), sharing a metrics folder."""
    folder = tmp_path_factory.mktemp("metrics")
    with postgres_database("probes", migrated=True) as database_url, redis_prefix("probes") as prefix:
        database, database_url = proxy_for(database_url)
        redis, redis_url = proxy_for(REDIS_URL)
        site = make_site("", fake_server.base_url("infyrence"), FAKE_KEY, database_url=database_url)
        env = {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "REDIS_PREFIX": prefix,
            "METRICS_TOKEN": TOKEN,
            "PROMETHEUS_MULTIPROC_DIR": str(folder),
            # Every connect reads its session: one cached a moment before would connect through a cut.
            "WS_SESSION_CACHE_SECONDS": "0",
        }
        servers = [LiveServer(env), LiveServer(env)]
        try:
            for server in servers:
                server.start()
            yield site, servers, database, redis
        finally:
            for server in servers:
                server.stop()
            database.close()
            redis.close()


def readyz(server: LiveServer) -> httpx.Response:
    return httpx.get(server.url + "/readyz", timeout=10)


@pytest.mark.timeout(300)  # the first test pays for the module's setup: a PostgreSQL site migrated, two servers
def test_healthz_and_readyz_answer_with_each_part_and_its_latency(cluster):
    _, servers, _, _ = cluster
    assert httpx.get(servers[0].url + "/healthz").json() == {"status": "ok"}
    ready = readyz(servers[0])
    assert ready.status_code == 200, ready.text
    report = ready.json()
    assert report["status"] == "ready" and report["failing"] == []
    checks = report["checks"]
    assert checks["database"]["ok"] and checks["database"]["engine"] == "postgresql"
    assert checks["channel_layer"]["ok"] and checks["channel_layer"]["backend"] == "redis"
    assert checks["provider"]["providers"]["infyrence"]["ok"]
    for part in (checks["database"], checks["channel_layer"], checks["provider"]["providers"]["infyrence"]):
        assert part["ms"] >= 0
    # Unauthenticated, and no access line (nor any line naming the probes) in the log.
    log = servers[0].output()
    assert "/readyz" not in log and "/healthz" not in log
    assert "chat server 2026.12" in log and re.search(r"database PostgreSQL [\w.]+:\d+/\w+;", log), log[-2000:]


def test_readyz_names_the_database_while_it_is_cut_and_is_ready_at_once_when_it_returns(cluster):
    _, servers, database, _ = cluster
    for server in servers:  # each has read its providers (what it checks while the database is away)
        assert readyz(server).status_code == 200
    database.cut()
    try:
        # No caching and no retries: the first probe after the cut already says so, on both processes.
        for server in servers:
            cut = readyz(server)
            assert cut.status_code == 503, cut.text
            assert cut.json()["failing"] == ["database"], cut.text
            assert not cut.json()["checks"]["database"]["ok"]
    finally:
        database.restore()
    for server in servers:
        back = readyz(server)
        assert back.status_code == 200, back.text
    assert "not ready: database:" in servers[0].output()
    assert "Traceback" not in servers[0].output()


def test_readyz_names_the_channel_layer_while_redis_is_cut_and_is_ready_at_once_when_it_returns(cluster):
    _, servers, _, redis = cluster
    assert readyz(servers[1]).status_code == 200
    redis.cut()
    try:
        cut = readyz(servers[1])
        assert cut.status_code == 503, cut.text
        assert cut.json()["failing"] == ["channel_layer"], cut.text
    finally:
        redis.restore()
    back = readyz(servers[1])
    assert back.status_code == 200, back.text


def test_a_new_websocket_while_postgresql_is_cut_is_refused_with_4503_in_one_log_line(cluster):
    site, servers, database, _ = cluster
    server = servers[0]

    async def connect() -> int | None:
        async with aiohttp.ClientSession(cookies={"sessionid": site.session}) as http:
            async with http.ws_connect(server.url.replace("http", "ws") + "/ws/chat/", origin=server.url) as ws:
                message = await ws.receive(timeout=20)
                assert message.type == aiohttp.WSMsgType.CLOSE, message
                return message.data

    database.cut()
    try:
        codes = [asyncio.run(connect()) for _ in range(3)]
    finally:
        database.restore()
    assert codes == [4503, 4503, 4503]
    log = server.output()
    assert log.count("websocket connects refused with 4503: the database is unavailable") == 1, log[-3000:]
    assert "Traceback" not in log and "Internal Server Error" not in log


def metric(text: str, name: str, **labels: str) -> float:
    """A sample's value in Prometheus's text format (0 if absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        found = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if found and found.group(1) == name:
            have = ",".join(sorted((found.group(2) or "").split(","))) if found.group(2) else ""
            if have == wanted:
                return float(found.group(3))
    return 0.0


def scrape(server: LiveServer) -> str:
    response = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def test_metrics_need_the_token(cluster):
    _, servers, _, _ = cluster
    assert httpx.get(servers[0].url + "/metrics").status_code == 403
    assert httpx.get(servers[0].url + "/metrics", headers={"Authorization": "Bearer nope"}).status_code == 403


def test_metrics_add_up_the_processes_and_count_a_stream_once_it_ended(cluster, fake):
    site, servers, _, _ = cluster
    before = scrape(servers[1])
    # A /v1 stream on the first process (its own URL, not a balancer's) ...
    api = openai.OpenAI(base_url=servers[0].url + "/v1", api_key=site.secret, max_retries=0)
    chunks = list(
        api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "[[chunks:5]]"}], stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    # ... is counted by the other one (the usage row is settled before the last event is sent).
    after = scrape(servers[1])
    labels = {"path": "api", "provider": "infyrence"}
    assert (
        metric(after, "chat_streams_started_total", **labels)
        == metric(before, "chat_streams_started_total", **labels) + 1
    )
    ended = {**labels, "status": "complete"}
    assert metric(after, "chat_streams_ended_total", **ended) == metric(before, "chat_streams_ended_total", **ended) + 1
    assert metric(after, "chat_streams_running", path="api") == 0
    assert metric(after, "chat_stream_first_token_seconds_count", path="api") >= 1
    assert metric(after, "chat_stream_duration_seconds_count", path="api") >= 1
    completion = {**labels, "kind": "completion"}
    assert metric(after, "chat_tokens_total", **completion) > metric(before, "chat_tokens_total", **completion)
    assert metric(after, "chat_ready", part="database") == 1
    assert metric(after, "chat_channel_layer_up") == 1  # from the start, not only after an outage
    # Counters without labels are there from the start (labelled ones once they count something).
    # A reconnect is counted by the layer's reader only when it was running through the cut:
    # tests/runtime/test_layers.py covers the reader's healing.
    assert "chat_streams_interrupted_after_crash_total 0.0" in after
    assert "chat_channel_layer_reconnects_total" in after


async def test_metrics_are_404_without_a_token_setting(settings):
    from chat.views import probes

    settings.METRICS_TOKEN = ""
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": [(b"authorization", b"Bearer x")]}
    await probes.app(scope, None, send)
    assert sent[0]["status"] == 404


def test_a_killed_processes_streams_are_counted_and_its_gauges_leave_the_sums(cluster, fake):
    site, servers, _, _ = cluster

    async def start_a_long_answer() -> None:
        async with aiohttp.ClientSession(cookies={"sessionid": site.session}) as http:
            url = servers[0].url.replace("http", "ws") + "/ws/chat/"
            async with http.ws_connect(url, origin=servers[0].url) as ws:
                await ws.send_json({"type": "send", "content": "[[chunks:300]] [[delay:100]]", "model": MODEL})
                while (await ws.receive_json(timeout=30))["type"] != "delta":
                    pass  # the stream runs on without the socket: it is the process's

    asyncio.run(start_a_long_answer())
    running = scrape(servers[1])
    assert metric(running, "chat_streams_running", path="chat") == 1
    crashed_before = metric(running, "chat_streams_interrupted_after_crash_total")
    servers[0].process.kill()
    servers[0].process.wait()
    # The other process sweeps it (its lease expired) and counts it.
    assert wait_until(
        lambda: metric(scrape(servers[1]), "chat_streams_interrupted_after_crash_total") == crashed_before + 1, 60
    )
    assert metric(scrape(servers[1]), "chat_streams_running", path="chat") == 1  # the dead one's gauge, until ...
    servers[0].start()  # ... a process starts on the machine and drops the live gauges of dead ones
    assert metric(scrape(servers[1]), "chat_streams_running", path="chat") == 0


@pytest.mark.browser
def test_the_page_explains_a_socket_refused_while_the_database_is_away(cluster):
    from playwright.sync_api import expect

    from tests import page_helpers

    site, servers, database, _ = cluster
    server = servers[1]
    with page_helpers.chromium() as browser:
        context = browser.new_context(base_url=server.url)
        context.add_cookies([{"name": "sessionid", "value": site.session, "url": server.url}])
        page = context.new_page()
        page_helpers.control_sockets(page)
        page_helpers.open_chat(page)
        database.cut()
        try:
            page.evaluate("() => window.__sockets.drop()")  # a network blip: the page reconnects, and is refused
            expect(page.locator("html")).to_have_attribute("data-socket", "down")
            explained = "The server cannot reach its database; your conversations are safe. Retrying…"
            expect(page.locator("#reconnecting-text")).to_have_text(explained, timeout=20_000)
            expect(page.locator("#reconnecting")).to_be_visible()
        finally:
            database.restore()
        expect(page.locator("html")).to_have_attribute("data-socket", "open", timeout=30_000)
        context.close()
