"""400 streams on two server processes sharing PostgreSQL and Redis, against the floor (straight to the upstream).

Makes a PostgreSQL database and a Redis key prefix of its own (tests/services.py: named after
this process, dropped and deleted at the end; TEST_POSTGRES_URL and TEST_REDIS_URL say where),
starts the fake upstream and two of our server processes on them, and runs --streams streams
(--chunks chunks --delay ms apart) spread evenly over the two processes, on /v1 and then on
the websocket, with the same number straight to the upstream before each. It prints and writes
(bench/results/scaleout-latest.json) time to first token and chunk latency p50/p95/p99 and what
they add over the floor, the two processes' CPU per chunk, their RSS per stream, failed
streams and lost chunks.

    .venv/bin/python bench/scaleout.py                    # 400 streams, 100 chunks 20 ms apart
    .venv/bin/python bench/scaleout.py --streams 20 --chunks 10
    .venv/bin/python bench/scaleout.py --users 40           # the streams of 40 people, 10 each
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import orjson
from compare import (
    RESULTS,
    ROOT,
    Run,
    Stack,
    added,
    machine,
    ms,
    openai_stream,
    percentile,
    rss_bytes,
    websocket_stream,
)
from server_bench import cpu_seconds

sys.path.insert(0, str(ROOT))
from tests.services import REDIS_URL, postgres_database, redis_prefix


async def measure(stack: Stack, path: str, streams: int, chunks: int, delay: int) -> dict:
    """`streams` concurrent streams on one path, the i-th on process i mod 2 (`direct`: to the upstream)."""
    prompt = f"[[stamp]] [[chunks:{chunks}]] [[delay:{delay}]] [[reasoning:0]]"
    pids = [server.pid for server in stack.servers]
    run = Run()
    key = {"Authorization": f"Bearer {stack.env['FAKE_UPSTREAM_KEY']}"}

    def one(session, index: int):
        url = stack.urls[index % len(stack.urls)]
        person = index % stack.users
        if path == "direct":
            return openai_stream(session, stack.upstream, key, prompt, chunks, run)
        if path == "/v1":
            auth = {"Authorization": f"Bearer {stack.tokens[person]}"}
            return openai_stream(session, url + "/v1", auth, prompt, chunks, run)
        socket = SimpleNamespace(url=url, cookie=stack.cookies[person])
        return websocket_stream(session, socket, prompt, chunks, run)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        before = sum(rss_bytes(pid) for pid in pids)
        peak = before
        cpu, wall = sum(cpu_seconds(pid) for pid in pids), time.perf_counter()
        work = asyncio.gather(*(one(session, i) for i in range(streams)))
        while not work.done():
            await asyncio.wait([work], timeout=0.1)
            peak = max(peak, sum(rss_bytes(pid) for pid in pids))
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu
        wall = time.perf_counter() - wall
    delivered = (streams - run.failed) * chunks - run.lost
    return {
        "path": path,
        "streams": streams,
        "wall_s": wall,
        "cpu_s": None if path == "direct" else cpu,
        # The whole run's CPU (stream starts too) over the chunks delivered, both processes.
        "cpu_us_per_chunk": None if path == "direct" or delivered <= 0 else cpu / delivered * 1e6,
        "rss_per_stream_kib": None if path == "direct" else (peak - before) / streams / 1024,
        "failed": run.failed,
        "lost_chunks": run.lost,
        "errors": run.errors,
        **{f"ttft_p{p}_ms": ms(percentile(run.ttft, p / 100)) for p in (50, 95, 99)},
        **{f"chunk_p{p}_ms": ms(percentile(run.latencies, p / 100)) for p in (50, 95, 99)},
    }


async def run_all(stack: Stack, args) -> dict:
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "processes": len(stack.servers),
        "users": stack.users,
        "chunks": args.chunks,
        "delay_ms": args.delay,
        "results": [],
    }
    for path in ("/v1", "websocket"):
        await measure(stack, path, 4, 2, 1)  # warm up: imports, connections
    for path in ("/v1", "websocket"):
        floor = await measure(stack, "direct", args.streams, args.chunks, args.delay)
        added(floor, floor)
        result = await measure(stack, path, args.streams, args.chunks, args.delay)
        added(result, floor)
        report["results"] += [floor, result]
        for row in (floor, result):
            print(
                f"{row['path']:>10} {row['streams']} streams: TTFT p50/p99 {row['ttft_p50_ms']:.1f}/"
                f"{row['ttft_p99_ms']:.1f} ms, chunk p50/p95/p99 {row['chunk_p50_ms']:.1f}/{row['chunk_p95_ms']:.1f}/"
                f"{row['chunk_p99_ms']:.1f} ms (+{row['added_chunk_p99_ms']:.1f} p99), "
                f"CPU {row['cpu_us_per_chunk'] or 0:.0f} µs/chunk, "
                f"RSS {row['rss_per_stream_kib'] or 0:.0f} KiB/stream, "
                f"failed {row['failed']}, lost {row['lost_chunks']} {row['errors'][:1]}",
                flush=True,
            )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--delay", type=int, default=20, help="ms between chunks (20: 50 a second)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--pool", type=int, default=0, help="DATABASE_POOL_SIZE of each process (0: off, the default)")
    parser.add_argument("--users", type=int, default=1, help="people the streams are spread over (one by default)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with postgres_database("chat_bench") as database_url, redis_prefix("chat_bench") as prefix:
        env = {"REDIS_URL": REDIS_URL, "REDIS_PREFIX": prefix, "DATABASE_POOL_SIZE": str(args.pool)}
        stack = Stack(database_url, litellm=False, servers=args.processes, env=env, users=args.users)
        try:
            report = asyncio.run(run_all(stack, args))
        finally:
            stack.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaleout-latest.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    failed = sum(row["failed"] for row in report["results"])
    print(f"results: {args.out / 'scaleout-latest.json'}; failed streams: {failed}")


if __name__ == "__main__":
    main()
