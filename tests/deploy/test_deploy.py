"""deploy/: the repo's nginx site in front of two daphne processes, exactly as docs/deploy.md installs it.

The site file is run as it is, with only its addresses, certificate and paths
replaced (each replacement must match, so an edit that breaks the test's
assumptions fails loudly). nginx runs as a child in a folder of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import httpx
import openai
import pytest

from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer
from tests.sites import Site, make_site

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
DEPLOY = ROOT / "deploy"
MODEL = MODELS["infyrence"]
SLOW = "[[chunks:3]] [[delay:2000]]"  # 2 s between chunks: buffering would show

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (tests/prepare.sh installs it)"),
]


class PortTaken(Exception):
    """nginx could not bind a port free_port() had found free a moment before."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def replace(text: str, old: str, new: str) -> str:
    assert old in text, f"deploy/nginx/chat.conf no longer contains {old!r}"
    return text.replace(old, new)


def render_site(ports: list[int], http_port: int, https_port: int, cert: Path, key: Path) -> str:
    """deploy/nginx/chat.conf with this test's ports, certificate and static folder."""
    site = (DEPLOY / "nginx" / "chat.conf").read_text()
    site = replace(
        site,
        "    server 127.0.0.1:8001 max_fails=0;\n    server 127.0.0.1:8002 max_fails=0;\n",
        "".join(f"    server 127.0.0.1:{port} max_fails=0;\n" for port in ports),
    )
    site = replace(site, "    listen 80;\n    listen [::]:80;\n", f"    listen 127.0.0.1:{http_port};\n")
    site = replace(
        site, "    listen 443 ssl http2;\n    listen [::]:443 ssl http2;\n", f"    listen 127.0.0.1:{https_port} ssl;\n"
    )
    site = replace(site, "/etc/letsencrypt/live/chat.example.com/fullchain.pem", str(cert))
    site = replace(site, "/etc/letsencrypt/live/chat.example.com/privkey.pem", str(key))
    return replace(site, "/srv/chat/staticfiles/", f"{ROOT}/staticfiles/")


class Nginx:
    """nginx in the foreground, in a prefix folder of its own (pid, logs, temp files), with the repo's site."""

    def error_log(self) -> str:
        return (self.folder / "error.log").read_text(errors="replace")

    def __init__(self, folder: Path, site: str, https_port: int, cert: Path, connections: int = 1024) -> None:
        self.folder = folder
        self.https_port = https_port
        for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (folder / temp).mkdir()
        user = "user root;\n" if os.geteuid() == 0 else ""  # its workers must read the test's files
        (folder / "nginx.conf").write_text(
            f"{user}daemon off;\nworker_processes 1;\npid {folder}/nginx.pid;\nerror_log {folder}/error.log info;\n"
            f"worker_rlimit_nofile {2 * connections};\nevents {{ worker_connections {connections}; }}\n"
            f"http {{\n  include /etc/nginx/mime.types;\n  access_log {folder}/access.log;\n"
            + "".join(f"  {temp}_temp_path {folder}/{temp};\n" for temp in ("fastcgi", "uwsgi", "scgi", "proxy"))
            + f"  client_body_temp_path {folder}/body;\n{site}\n}}\n"
        )
        command = [NGINX, "-p", str(folder), "-c", str(folder / "nginx.conf"), "-e", str(folder / "error.log")]
        checked = subprocess.run([*command, "-t"], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # nginx has no readiness signal of its own: wait (bounded) until it completes a TLS handshake with
        # this test's certificate. A bare connect is not enough: between free_port() and nginx's bind,
        # another worker's server can take the port, and nginx then exits while that server accepts.
        tls = ssl.create_default_context(cafile=str(cert))
        tls.check_hostname = False
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                log = (folder / "error.log").read_text()
                if "Address already in use" in log:
                    raise PortTaken(log)
                raise AssertionError(log)
            try:
                with socket.create_connection(("127.0.0.1", https_port), timeout=5) as raw:
                    tls.wrap_socket(raw, server_hostname="127.0.0.1").close()
                break
            except OSError:
                assert time.monotonic() < deadline, "nginx did not start serving TLS"
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.https_port}"

    def stop(self) -> None:
        self.process.send_signal(signal.SIGQUIT)  # graceful
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def stack(fake_server, tmp_path_factory):
    """Two daphne processes on one SQLite file, behind the repo's nginx site with a self-signed certificate."""
    folder = tmp_path_factory.mktemp("deploy")
    site = make_site(str(folder / "chat.sqlite3"), fake_server.base_url("infyrence"), FAKE_KEY)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    env = {
        "DATABASE_URL": site.database_url,
        "DJANGO_HTTPS": "1",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_TRUSTED_PROXIES": "127.0.0.1",  # nginx, as deploy/env.production.example has it
    }
    servers = [LiveServer(env), LiveServer(env)]
    for server in servers:
        server.start()
    nginx = None
    for attempt in range(5):  # a port taken by another worker between free_port() and nginx's bind
        http_port, https_port = free_port(), free_port()
        nginx_folder = folder / f"nginx-{attempt}"
        nginx_folder.mkdir()
        site_conf = render_site([s.port for s in servers], http_port, https_port, cert, key)
        try:
            nginx = Nginx(nginx_folder, site_conf, https_port, cert)
            break
        except PortTaken:
            continue
    assert nginx is not None, "nginx found its ports taken five times"
    try:
        yield site, nginx, servers, http_port
    finally:
        nginx.stop()
        for server in servers:
            server.stop()


def sdk(nginx: Nginx, site: Site) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=nginx.url + "/v1", api_key=site.secret, max_retries=0, http_client=httpx.Client(verify=False)
    )


def first_content_index(record) -> int:
    """Which of the fake's data events carried the first piece of the answer."""
    for index, data in enumerate(record.sent):
        try:
            chunk = json.loads(data.removeprefix(b"data: "))
        except ValueError:
            continue
        if any(choice.get("delta", {}).get("content") for choice in chunk.get("choices") or []):
            return index
    raise AssertionError("the fake sent no content")


def test_a_v1_stream_through_nginx_arrives_unbuffered(stack, fake):
    site, nginx, _, _ = stack
    stream = sdk(nginx, site).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"count {SLOW}"}], stream=True
    )
    first_at = None
    for chunk in stream:
        if first_at is None and chunk.choices and chunk.choices[0].delta.content:
            first_at = time.monotonic()
    record = fake.app.last()
    second_sent_at = record.sent_at[first_content_index(record) + 1]
    # The fake's own clock says when it wrote the next chunk, 2 s later; the first was here before that.
    assert first_at is not None and first_at < second_sent_at, (first_at, record.sent_at)


def test_a_websocket_stream_through_nginx_arrives_unbuffered(stack, fake):
    site, nginx, _, _ = stack

    async def chat() -> tuple[float, list[dict]]:
        insecure = ssl.create_default_context()
        insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
        async with aiohttp.ClientSession(cookies={"sessionid": site.session}) as http:
            url = nginx.url.replace("https://", "wss://") + "/ws/chat/"
            async with http.ws_connect(url, origin=nginx.url, ssl=insecure) as ws:
                await ws.send_json({"type": "send", "content": f"count {SLOW}", "model": MODEL})
                frames, first_at = [], None
                while not frames or frames[-1]["type"] not in ("done", "error"):
                    frames.append(json.loads((await ws.receive(timeout=30)).data))
                    if first_at is None and frames[-1]["type"] == "delta":
                        first_at = time.monotonic()
                return first_at, frames

    first_at, frames = asyncio.run(chat())
    assert frames[-1]["type"] == "done" and frames[-1]["status"] == "complete", frames
    record = fake.app.last()
    second_sent_at = record.sent_at[first_content_index(record) + 1]
    assert first_at is not None and first_at < second_sent_at, (first_at, record.sent_at)


def test_x_forwarded_proto_is_set_by_nginx_and_trusted_by_django(stack):
    _, nginx, servers, http_port = stack
    with httpx.Client(verify=False) as client:
        # Over TLS: Django (DJANGO_HTTPS=1) believes nginx's header and serves, with a secure cookie.
        page = client.get(nginx.url + "/accounts/login/")
        assert page.status_code == 200
        assert "secure" in page.headers["set-cookie"].lower()
        # A client cannot claim https over plain http: nginx overwrites the header, Django redirects.
        plain = client.get(f"http://127.0.0.1:{http_port}/accounts/login/", headers={"X-Forwarded-Proto": "https"})
        assert plain.status_code == 301 and plain.headers["location"].startswith("https://")
        # Straight to daphne without the header, Django does not take the request for https.
        direct = client.get(servers[0].url + "/accounts/login/")
        assert direct.status_code == 301 and direct.headers["location"].startswith("https://")


def test_a_body_over_client_max_body_size_is_refused_by_nginx(stack):
    """/v1/ takes 28 MiB (an image as a data: URL, API_MAX_BODY_BYTES); more is refused by nginx."""
    site, nginx, _, _ = stack
    huge = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 30_000_000}]})
    with httpx.Client(verify=False) as client:
        response = client.post(
            nginx.url + "/v1/chat/completions",
            content=huge,
            headers={"Authorization": f"Bearer {site.secret}", "Content-Type": "application/json"},
        )
    assert response.status_code == 413


def test_attachment_uploads_alone_may_be_larger_through_nginx(stack):
    """3 MB reach the server at /api/attachments (which then wants a session); 22 MB are refused by nginx."""
    _, nginx, _, _ = stack
    with httpx.Client(verify=False, timeout=60) as client:
        upload = client.post(nginx.url + "/api/attachments", files={"file": ("a.bin", b"x" * 3_000_000)})
        assert upload.status_code == 401 and upload.json()["error"]["code"] == "unauthenticated"
        assert client.post(nginx.url + "/api/attachments", content=b"x" * 22_000_000).status_code == 413


def restart(server: LiveServer, while_down, logs=lambda: "") -> None:
    """SIGTERM one process (graceful), run `while_down`, then start it again on the same port.

    A failure names the servers' warnings in its first line: CI shows that line, not the logs.
    """
    server.sock.close()  # only the process's own copy listens now: it closes it at SIGTERM
    server.process.terminate()
    try:
        while_down()
        server.process.wait(60)
    except Exception as exc:
        lines = (server.output() + logs()).splitlines()
        warned = [line[:200] for line in lines if any(word in line for word in (" WARNING ", " ERROR ", "[error]"))]
        raise AssertionError(f"{exc!r:.300} | warnings: {' || '.join(warned[-6:])}") from exc
    server.sock = socket.socket()
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.sock.bind(("127.0.0.1", server.port))
    server.sock.listen(1024)
    server.start()


def test_rolling_restart_loses_no_stream_and_fails_no_request(stack, fake):
    site, nginx, servers, _ = stack
    api = sdk(nginx, site)
    complete_before = site.count("chat_usage", "status = 'complete'")
    for server in servers:
        # Two streams at once: nginx's round robin puts one on each process, so one of
        # them is on the process being stopped, and must still finish whole.
        streams = [
            api.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "[[chunks:8]] [[delay:250]]"}], stream=True
            )
            for _ in range(2)
        ]
        firsts = [next(iter(stream)) for stream in streams]  # both are running

        def meanwhile(streams=streams, firsts=firsts):
            # New requests go to the other process while this one drains.
            for _ in range(3):
                answer = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
                assert answer.choices[0].message.content
            for first, stream in zip(firsts, streams, strict=True):
                chunks = [first, *stream]
                assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
                assert len("".join(c.choices[0].delta.content or "" for c in chunks if c.choices).split()) == 8

        others = [s for s in servers if s is not server]
        restart(server, meanwhile, lambda others=others: "".join(s.output() for s in others) + nginx.error_log())
    assert site.count("chat_usage", "status = 'complete'") == complete_before + 2 * (2 + 3)


def test_rolling_restart_finishes_the_websocket_streams_of_the_stopped_process(stack, fake):
    site, nginx, servers, _ = stack
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    url = nginx.url.replace("https://", "wss://") + "/ws/chat/"

    async def read(ws, frames: list[dict], until: tuple[str, ...]) -> list[dict]:
        while not frames or frames[-1]["type"] not in until:
            message = await ws.receive(timeout=60)
            if message.type != aiohttp.WSMsgType.TEXT:
                break  # closed (1012 once the stopped process has sent its `done`)
            frames.append(json.loads(message.data))
        return frames

    async def two_streams_across_a_restart(server: LiveServer) -> list[list[dict]]:
        async with aiohttp.ClientSession(cookies={"sessionid": site.session}) as http:
            # Two sockets: nginx's round robin puts one on each process, so one stream runs on
            # the process being stopped, and must still finish whole before it exits.
            sockets = [await http.ws_connect(url, origin=nginx.url, ssl=insecure) for _ in range(2)]
            frames: list[list[dict]] = [[], []]
            for ws in sockets:
                await ws.send_json({"type": "send", "content": "[[chunks:8]] [[delay:250]]", "model": MODEL})
            for ws, seen in zip(sockets, frames, strict=True):
                await read(ws, seen, ("delta", "error"))  # both are streaming
            readers = [
                asyncio.create_task(read(ws, seen, ("done", "error"))) for ws, seen in zip(sockets, frames, strict=True)
            ]
            await asyncio.to_thread(restart, server, lambda: None)
            await asyncio.gather(*readers)
            for ws in sockets:
                await ws.close()
            return frames

    complete_before = site.count("chat_message", "role = 'assistant' AND status = 'complete'")
    for server in servers:
        for frames in asyncio.run(two_streams_across_a_restart(server)):
            assert frames[-1]["type"] == "done" and frames[-1]["status"] == "complete", frames[-3:]
            text = "".join(f.get("content", "") for f in frames if f["type"] == "delta")
            assert len(text.split()) == 8
    assert site.count("chat_message", "role = 'assistant' AND status = 'complete'") == complete_before + 4


def test_every_static_file_comes_through_nginx_with_the_type_the_app_gives_it(stack):
    """Whatever /etc/nginx/mime.types says (Debian 12's has no .mjs): the site's own `types` decide."""
    from django.conf import settings
    from whitenoise.media_types import MediaTypes

    _, nginx, _, _ = stack
    types = MediaTypes(extra_types=settings.WHITENOISE_MIMETYPES)
    root = ROOT / "staticfiles"
    # One file of each extension (WhiteNoise's precompressed copies are never linked to).
    by_extension = {path.suffix: path for path in sorted(root.rglob("*")) if path.is_file()}
    by_extension.pop(".gz", None)
    by_extension.pop(".br", None)
    assert {".mjs", ".js", ".css", ".woff2", ".svg"} <= set(by_extension)
    with httpx.Client(verify=False) as client:
        for path in by_extension.values():
            response = client.get(f"{nginx.url}/static/{path.relative_to(root)}")
            assert response.status_code == 200, path
            served = response.headers["content-type"].split(";")[0]
            assert served == types.get_type(str(path)), (path.name, served)


def test_the_page_behind_nginx_sends_a_message_and_shows_the_answer_in_chromium(stack, fake):
    from playwright.sync_api import expect

    from tests import page_helpers

    site, nginx, _, _ = stack
    errors: list[str] = []
    with page_helpers.chromium() as browser:
        context = browser.new_context(base_url=nginx.url, ignore_https_errors=True)
        context.add_cookies([{"name": "sessionid", "value": site.session, "url": nginx.url}])
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page_helpers.open_chat(page)  # the models listed: the modules, DOMPurify's too, loaded
        reply = page_helpers.send(page, "hello through nginx")
        page_helpers.wait_done(reply)
        expect(reply.locator(".answer")).not_to_be_empty()
        context.close()
    assert not errors, errors


def test_the_servers_log_the_clients_real_address_and_nginxs_request_id(stack):
    """Behind nginx, the client's address (not nginx's, not one the client claims) and nginx's $request_id."""
    _, nginx, servers, _ = stack
    transport = httpx.HTTPTransport(local_address="127.0.0.2", verify=False)  # a client that is not the proxy
    with httpx.Client(transport=transport, verify=False) as client:
        for _ in range(2):  # one on each process (round robin)
            page = client.get(nginx.url + "/accounts/login/?who", headers={"X-Forwarded-For": "6.6.6.6"})
            assert page.status_code == 200
    logs = servers[0].output() + servers[1].output()
    lines = [line for line in logs.splitlines() if "GET /accounts/login/" in line and "127.0.0.2" in line]
    assert len(lines) == 2, logs[-3000:]
    assert "6.6.6.6" not in logs
    # nginx's $request_id: 32 hex digits, in the line's brackets.
    assert all(re.search(r"\[[0-9a-f]{32}\]: 127\.0\.0\.2 GET", line) for line in lines), lines
