"""Measure the whole server under concurrent streams: the chat websocket and the /v1 relay.

Starts the fake upstream (uvicorn) and the real server (chatsite.server, i.e. daphne; a fresh SQLite
database in a temporary folder) as separate processes, then runs N concurrent
streams through each path and prints, per path: the server's CPU time per
upstream chunk (from /proc), delivery latency from the upstream writing a chunk
to the client having it (the fake stamps each piece with its send time), and for
the websocket the number of frames per stream (deltas are coalesced, 30 ms).

    .venv/bin/python bench/server_bench.py                  # 50 and 200 streams
    .venv/bin/python bench/server_bench.py --streams 300 --chunks 300 --delay 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
KEY = "bench-upstream-key"
MODEL = "claude-sonnet-5"
STAMP = re.compile(r"@(\d+\.\d+) ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env(database_url: str, fake_port: int, **more: str) -> dict[str, str]:
    """The server's environment in a benchmark: the fake upstream on `fake_port`, the per-person limits off.

    One person (or a few) runs every stream of a benchmark: the limits of chat/metering/limits.py would
    refuse most of them.
    """
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "UPSTREAM_BASE_URL": f"http://127.0.0.1:{fake_port}/infyrence/v1",
        "UPSTREAM_API_KEY": KEY,
        "UPSTREAM_MODEL": MODEL,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "LOG_LEVEL": "WARNING",
        "FAKE_UPSTREAM_KEY": KEY,
        "CHAT_MAX_STREAMS": "0",
        "CHAT_MAX_SOCKETS_PER_PERSON": "0",  # one person's hundreds of sockets are the load under test
        "API_MAX_STREAMS": "0",
        "API_TOKEN_MAX_STREAMS": "0",
        "RATE_LIMIT_PER_MINUTE": "0",
        "API_TOKEN_RATE_LIMIT_PER_MINUTE": "0",
        **more,
    }


def cpu_seconds(pid: int) -> float:
    """CPU time of a process and all its threads, living and ended, to the nanosecond."""
    # /proc/<pid>/stat counts in clock ticks (10 ms), too coarse for a short run: a handful of
    # stream starts can read as 0. Linux's process CPU clock for a pid (clock_getcpuclockid's
    # encoding: ~pid << 3 | CPUCLOCK_SCHED) is exact; fall back to ticks where it is refused.
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            httpx.get(url, timeout=5)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


class Stack:
    """The fake upstream and the server, each in its own process."""

    def __init__(self) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="chat-bench-")
        fake_port, self.port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = server_env(f"sqlite:///{self.folder.name}/bench.sqlite3", fake_port)
        self.fake = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "fakeupstream.app:app", "--port", str(fake_port), "--log-level",
             "warning"], cwd=ROOT, env=self.env,
        )  # fmt: skip
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=self.env, check=True)
        script = (
            "from django.contrib.auth.models import User; from chat.models import ApiToken;"
            "from django.test import Client; u = User.objects.create_user('bench', password='x');"
            "c = Client(); c.force_login(u); print(c.cookies['sessionid'].value);"
            "print(ApiToken.issue(u, 'bench')[1])"
        )
        out = subprocess.run([*manage, "shell", "-c", script], cwd=ROOT, env=self.env, check=True, capture_output=True)
        self.cookie, self.token = out.stdout.decode().split()[-2:]
        self.server = subprocess.Popen(
            [sys.executable, "-m", "chatsite.server", "-b", "127.0.0.1", "-p", str(self.port),
             "chatsite.asgi:application"],
            cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{fake_port}/", self.fake)
        wait_http(self.url + "/accounts/login/", self.server)

    def close(self) -> None:
        for process in (self.server, self.fake):
            process.terminate()
            process.wait()
        self.folder.cleanup()


def latencies_in(text: str, received: float, into: list[float]) -> None:
    for stamp in STAMP.findall(text):
        into.append(received - float(stamp))


async def api_stream(stack: Stack, session: aiohttp.ClientSession, prompt: str, latencies: list[float]) -> int:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    headers = {"Authorization": f"Bearer {stack.token}"}
    chunks = 0
    async with session.post(stack.url + "/v1/chat/completions", json=body, headers=headers) as response:
        if response.status != 200:
            print(f"  refused: {response.status} {(await response.read())[:300]!r}", flush=True)
            return 0
        async for line in response.content:
            if line.startswith(b"data: {"):
                chunks += 1
                content = orjson.loads(line[6:])["choices"]
                if content:
                    latencies_in(content[0]["delta"].get("content") or "", time.time(), latencies)
    return chunks


async def chat_stream(stack: Stack, session: aiohttp.ClientSession, prompt: str, latencies: list[float]) -> int:
    headers = {"Origin": stack.url, "Cookie": f"sessionid={stack.cookie}"}
    frames = 0
    async with session.ws_connect(stack.url.replace("http", "ws") + "/ws/chat/", headers=headers) as ws:
        await ws.send_str(orjson.dumps({"type": "send", "conversation": None, "content": prompt}).decode())
        async for message in ws:
            frame = orjson.loads(message.data)
            if frame["type"] == "delta":
                frames += 1
                # every stamp in a coalesced frame: the earliest pieces waited longest
                latencies_in(frame.get("content", ""), time.time(), latencies)
            elif frame["type"] in ("done", "error"):
                break
    return frames


async def run(stack: Stack, path: str, streams: int, chunks: int, delay: int) -> dict:
    prompt = f"[[stamp]] [[chunks:{chunks}]] [[delay:{delay}]] [[reasoning:0]]"
    one = api_stream if path == "api" else chat_stream
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(one(stack, session, "[[chunks:3]]", []) for _ in range(min(streams, 20))))
        cpu, wall = cpu_seconds(stack.server.pid), time.perf_counter()
        counts = await asyncio.gather(*(one(stack, session, prompt, latencies) for _ in range(streams)))
        cpu, wall = cpu_seconds(stack.server.pid) - cpu, time.perf_counter() - wall
    latencies.sort()
    return {
        "path": path,
        "streams": streams,
        "wall_s": wall,
        "server_cpu_us_per_chunk": cpu / (streams * chunks) * 1e6,
        "frames_per_stream": statistics.mean(counts),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--chunks", type=int, default=200, help="content chunks per stream")
    parser.add_argument("--delay", type=int, default=20, help="ms between chunks")
    parser.add_argument("--paths", nargs="+", default=["chat", "api"], choices=["chat", "api"])
    args = parser.parse_args()
    stack = Stack()
    try:
        print(f"{args.chunks} chunks a stream, {args.delay} ms apart; upstream, server and clients in 3 processes\n")
        header = ("path", "streams", "wall s", "server CPU µs/chunk", "frames/stream", "p50 ms", "p99 ms")
        print("{:>5} {:>7} {:>7} {:>20} {:>13} {:>7} {:>7}".format(*header))
        for streams in args.streams:
            for path in args.paths:
                r = asyncio.run(run(stack, path, streams, args.chunks, args.delay))
                print(
                    f"{r['path']:>5} {r['streams']:>7} {r['wall_s']:>7.1f} {r['server_cpu_us_per_chunk']:>20.1f} "
                    f"{r['frames_per_stream']:>13.1f} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}",
                    flush=True,
                )
    finally:
        stack.close()


if __name__ == "__main__":
    main()
