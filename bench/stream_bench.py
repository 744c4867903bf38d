"""Measure the upstream client's hot path: CPU per chunk and delivery latency, per transport.

Runs the project's fake upstream in a separate process (uvicorn), then opens N
concurrent streams through chat.streaming.upstream (open_stream, then UpstreamStream.read:
SSE decoding and orjson chunk parsing, the loop every stream is read with) with each httpx
transport; the bench's own callbacks count the events and take the stamps.
The fake stamps each content piece with its send time ([[stamp]]), so latency is
measured from the upstream writing a chunk to the client having parsed it.

    .venv/bin/python bench/stream_bench.py                 # 100 and 300 streams, both transports
    .venv/bin/python bench/stream_bench.py --streams 300 --chunks 400 --delay 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chat.streaming import upstream  # noqa: E402

KEY = "bench-key"
MODEL = "claude-sonnet-5"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_fake(port: int) -> subprocess.Popen:
    env = {**os.environ, "FAKE_UPSTREAM_KEY": KEY}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fakeupstream.app:app", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/infyrence/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the fake upstream did not start")


async def one_stream(client, base_url: str, prompt: str, latencies: list[float]) -> int:
    loop = asyncio.get_running_loop()
    payload = upstream.build_payload(MODEL, [{"role": "user", "content": prompt}])
    state = upstream.StreamState(started_at=loop.time())
    chunks = 0

    def counted(event, chunk) -> None:
        nonlocal chunks
        if event.data is not None:
            chunks += 1

    def stamped() -> None:
        content = state.content[-1] if state.content else ""
        if content.startswith("@"):
            latencies.append(time.time() - float(content[1:].split(" ", 1)[0]))

    async with upstream.open_stream(client, base_url, KEY, payload) as stream:
        await stream.read(state, on_text=stamped, forward=counted)
    return chunks


async def run(transport: str, streams: int, chunks: int, delay: int, base_url: str) -> dict:
    client = upstream.make_client(max(streams * 2, 100), transport)
    prompt = f"[[stamp]] [[chunks:{chunks}]] [[delay:{delay}]] [[reasoning:0]]"
    latencies: list[float] = []
    # warm the connection pool and the code paths first
    await asyncio.gather(*(one_stream(client, base_url, "[[chunks:5]]", []) for _ in range(min(streams, 50))))
    cpu, wall = time.process_time(), time.perf_counter()
    counts = await asyncio.gather(*(one_stream(client, base_url, prompt, latencies) for _ in range(streams)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await client.aclose()
    latencies.sort()
    total = sum(counts)
    return {
        "transport": transport,
        "streams": streams,
        "chunks": total,
        "wall_s": wall,
        "cpu_us_per_chunk": cpu / total * 1e6,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--chunks", type=int, default=300, help="content chunks per stream")
    parser.add_argument("--delay", type=int, default=20, help="ms between chunks, as a model would pace them")
    parser.add_argument("--transports", nargs="+", default=["httpx", "aiohttp"])
    args = parser.parse_args()

    port = free_port()
    fake = start_fake(port)
    base_url = f"http://127.0.0.1:{port}/infyrence/v1"
    try:
        print(f"{args.chunks} chunks a stream, {args.delay} ms apart; fake upstream in its own process\n")
        header = ("transport", "streams", "chunks", "wall s", "CPU µs/chunk", "p50 ms", "p99 ms")
        print("{:>9} {:>7} {:>8} {:>7} {:>13} {:>7} {:>7}".format(*header))
        for streams in args.streams:
            for transport in args.transports:
                r = asyncio.run(run(transport, streams, args.chunks, args.delay, base_url))
                print(
                    f"{r['transport']:>9} {r['streams']:>7} {r['chunks']:>8} {r['wall_s']:>7.1f} "
                    f"{r['cpu_us_per_chunk']:>13.1f} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}",
                    flush=True,
                )
    finally:
        fake.terminate()
        fake.wait()


if __name__ == "__main__":
    main()
