"""A reconnect storm against the real server: many websocket connects a second, and how long it stalls.

Starts daphne (a fresh SQLite database in a temporary folder) on 127.0.0.1 only,
signs in `--users` sessions, then opens `--rate` websocket connects a second for
`--seconds` seconds (bounded: at most 20,000 connects, 60 s), each with one of
those session cookies, holding the accepted ones open like browser tabs. Meanwhile
a probe asks for the sign-in page every 0.25 s. Prints: connects accepted,
refused with 4013, failed; handshake latency; the probe's worst latency during
the storm; and how long after the storm the probe took to answer within 0.5 s
again (the stall).

    .venv/bin/python bench/connect_storm.py                        # 1000/s for 10 s
    .venv/bin/python bench/connect_storm.py --rate 100 --seconds 10
    .venv/bin/python bench/connect_storm.py --no-guard             # WS_CONNECTS_PER_SECOND=0, WS_MAX_CONNECTING=0
    .venv/bin/python bench/connect_storm.py --nginx                # through deploy/nginx/chat.conf (TLS, limit_req)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.live import LiveServer  # noqa: E402

MAX_CONNECTS = 20_000
MAX_SECONDS = 60

SETUP = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
keys = []
for n in range(int(sys.argv[1])):
    user = get_user_model().objects.create_user(f"user{n}")
    client = Client()
    client.force_login(user)  # a session exactly as signing in makes one
    keys.append(client.cookies[settings.SESSION_COOKIE_NAME].value)
print(json.dumps(keys))
"""


def sessions(database_url: str, users: int) -> list[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    out = subprocess.check_output([sys.executable, "-c", SETUP, str(users)], cwd=ROOT, env=env, text=True)
    return json.loads(out.splitlines()[-1])


@contextmanager
def behind_nginx(daphne_port: int, folder: Path):
    """The repo's nginx site (as tests/deploy/test_deploy.py runs it) in front of one daphne."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    django.setup()  # tests.deploy.test_deploy imports the tests' shared fixtures, which need Django
    from tests.deploy.test_deploy import Nginx, free_port, render_site

    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    http_port, https_port = free_port(), free_port()
    (folder / "nginx").mkdir()
    nginx = Nginx(folder / "nginx", render_site([daphne_port], http_port, https_port, cert, key), https_port, 30_000)
    try:
        yield nginx.url, https_port
    finally:
        nginx.stop()


class Storm:
    def __init__(self, port: int, keys: list[str], tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.tls = tls
        self.keys = keys
        self.accepted = self.refused = self.failed = 0
        self.latencies: list[float] = []
        self.open: list[asyncio.StreamWriter] = []
        self.tasks: set[asyncio.Task] = set()
        self.reasons: dict[str, int] = {}

    def fail(self, reason: str) -> None:
        self.failed += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    async def connect(self, n: int) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(30):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls)
                key = base64.b64encode(os.urandom(16)).decode()
                writer.write(
                    (
                        f"GET /ws/chat/ HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                        f"Origin: {'https' if self.tls else 'http'}://127.0.0.1:{self.port}\r\n"
                        f"Cookie: sessionid={self.keys[n % len(self.keys)]}\r\n\r\n"
                    ).encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                self.fail(head.split(b"\r\n", 1)[0].decode(errors="replace"))
                writer.close()
                return
            self.latencies.append(time.monotonic() - started)
            # A refused connect is closed at once with 4013; an accepted one stays quiet.
            try:
                frame = await asyncio.wait_for(reader.readexactly(4), 2)
            except TimeoutError:
                self.accepted += 1
                self.open.append(writer)
                return
            code = struct.unpack("!H", frame[2:4])[0] if frame[0] & 0x0F == 8 else 0
            if code == 4013:
                self.refused += 1
                # Answer the close as a browser does (masked, echoing the code), so the server is done with it.
                mask = os.urandom(4)
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(frame[2:4]))
                writer.write(bytes([0x88, 0x82]) + mask + payload)
                await writer.drain()
            else:
                self.fail(f"closed with {code}")
            writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            self.fail(type(exc).__name__)

    async def run(self, rate: int, seconds: float) -> None:
        total = min(int(rate * seconds), MAX_CONNECTS)
        start = time.monotonic()
        for n in range(total):
            # Paced against the clock so a slow loop catches up instead of drifting.
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self.connect(n))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def finish(self) -> None:
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=60)
        for writer in self.open:
            writer.close()


async def probe(url: str, results: list[tuple[float, float]], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=120, verify=False) as client:
        while not stop.is_set():
            started = time.monotonic()
            try:
                await client.get(url + "/accounts/login/")
            except httpx.HTTPError:
                pass
            results.append((started, time.monotonic() - started))
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except TimeoutError:
                pass


async def main(args: argparse.Namespace, url: str, port: int, keys: list[str], tls=None) -> None:
    storm = Storm(port, keys, tls)
    results: list[tuple[float, float]] = []
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(url, results, stop))
    started = time.monotonic()
    await storm.run(args.rate, args.seconds)
    ended = time.monotonic()
    await storm.finish()
    # Wait until the probe answers within 0.5 s again (the server caught up), at most a minute.
    recovered = None
    while time.monotonic() - ended < MAX_SECONDS:
        late = [(at, took) for at, took in results if at + took > ended]
        if late and late[-1][1] < 0.5:
            recovered = late[-1][0] + late[-1][1] - ended
            break
        await asyncio.sleep(0.25)
    stop.set()
    await prober
    during = [took for at, took in results if started <= at <= ended]
    lat = sorted(storm.latencies) or [0.0]
    caught_up = f"after {recovered:.1f} s" if recovered is not None else "NOT within 60 s"
    print(
        f"{args.rate}/s for {args.seconds:g} s, guard {'off' if args.no_guard else 'on'}"
        f"{' behind nginx' if tls else ''}: "
        f"accepted {storm.accepted}, refused (4013) {storm.refused}, failed {storm.failed} {storm.reasons or ''}; "
        f"handshake p50 {statistics.median(lat) * 1000:.0f} ms, p99 {lat[int(len(lat) * 0.99) - 1] * 1000:.0f} ms; "
        f"probe worst during {max(during, default=0):.2f} s; "
        f"answers within 0.5 s again {caught_up}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=1000, help="connects a second")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--users", type=int, default=200, help="distinct sessions")
    parser.add_argument("--no-guard", action="store_true", help="turn the overload guard off")
    parser.add_argument("--nginx", action="store_true", help="through deploy/nginx/chat.conf (needs nginx, openssl)")
    args = parser.parse_args()
    args.seconds = min(args.seconds, MAX_SECONDS)
    folder = tempfile.mkdtemp(prefix="storm-")
    database = f"sqlite:///{folder}/storm.sqlite3"
    keys = sessions(database, args.users)
    # The storm's sockets are spread over --users sessions, tens each: the per-person cap would refuse them too.
    env = {"DATABASE_URL": database, "CHAT_MAX_SOCKETS_PER_PERSON": "0"}
    if args.no_guard:
        env.update(WS_CONNECTS_PER_SECOND="0", WS_MAX_CONNECTING="0")
    with LiveServer(env) as live:
        if args.nginx:
            with behind_nginx(live.port, Path(folder)) as (url, port):
                tls = ssl.create_default_context()
                tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
                asyncio.run(main(args, url, port, keys, tls))
        else:
            asyncio.run(main(args, live.url, live.port, keys))
        errors = [line for line in live.output().splitlines() if "ERROR" in line or "WARNING" in line]
        print(f"server log: {len(errors)} warnings/errors", *errors[:5], sep="\n  ")
