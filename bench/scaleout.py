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
    .venv/bin/python bench/scaleout.py --clients 4 --upstreams 4   # load and upstream in 4 processes each

On a machine with many cores one client process and one upstream process become the bottleneck
before the server does: --clients N runs the load in N processes (the streams dealt out among
them, all starting at the same moment) and --upstreams N the fake upstream in N (uvicorn's
workers). Each path's line also says where the starts waited: PostgreSQL's lock waits (its
backends seen waiting on a lock, sampled every 10 ms, in seconds per start) and the waits for a
database thread and for a busy database (the servers' /metrics, in ms per start).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import secrets
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import httpx
import orjson
import psycopg
from compare import (
    RESULTS,
    ROOT,
    Run,
    Stack,
    added,
    fmt,
    machine,
    ms,
    openai_stream,
    percentile,
    rss_bytes,
    websocket_answer,
    websocket_stream,
)
from server_bench import cpu_seconds

sys.path.insert(0, str(ROOT))
from tests.services import REDIS_URL, postgres_database, redis_prefix

_pools: dict[int, concurrent.futures.ProcessPoolExecutor] = {}


def client_pool(clients: int) -> concurrent.futures.ProcessPoolExecutor:
    """The load client's processes, made once a run: spawned (not forked from the running loop), all up."""
    if clients not in _pools:
        spawn = multiprocessing.get_context("spawn")
        _pools[clients] = concurrent.futures.ProcessPoolExecutor(clients, mp_context=spawn)
        list(_pools[clients].map(time.sleep, [0.5] * clients))
    return _pools[clients]


def target(stack: Stack) -> dict:
    """What a client process needs of the stack (picklable)."""
    return {"urls": stack.urls, "upstream": stack.upstream, "key": stack.env["FAKE_UPSTREAM_KEY"],
            "tokens": stack.tokens, "cookies": stack.cookies, "users": stack.users}  # fmt: skip


async def streams_of(where: dict, path: str, indexes: list[int], chunks: int, delay: int, at: float) -> Run:
    """The streams `indexes` on one path, the i-th on process i mod processes, started at the moment `at`."""
    prompt = f"[[stamp]] [[chunks:{chunks}]] [[delay:{delay}]] [[reasoning:0]]"
    run = Run()
    key = {"Authorization": f"Bearer {where['key']}"}

    def one(session, index: int):
        url = where["urls"][index % len(where["urls"])]
        person = index % where["users"]
        if path == "direct":
            return openai_stream(session, where["upstream"], key, prompt, chunks, run)
        if path == "/v1":
            auth = {"Authorization": f"Bearer {where['tokens'][person]}"}
            return openai_stream(session, url + "/v1", auth, prompt, chunks, run)
        socket = SimpleNamespace(url=url, cookie=where["cookies"][person])
        return websocket_stream(session, socket, prompt, chunks, run)

    async def answer(ws):
        await asyncio.sleep(max(0.0, at - time.time()))
        await websocket_answer(ws, prompt, chunks, run)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        if path != "websocket":
            await asyncio.sleep(max(0.0, at - time.time()))  # every client process starts its streams together
            await asyncio.gather(*(one(session, i) for i in indexes))
            return run
        # The tabs are open before the burst (bench/connect_storm.py measures connects): the sockets connect
        # first, a few at a time, and the messages go at the moment `at`.
        opening = asyncio.Semaphore(20)

        async def connect(index: int):
            url = where["urls"][index % len(where["urls"])]
            cookie = where["cookies"][index % where["users"]]
            async with opening:
                return await session.ws_connect(url.replace("http", "ws") + "/ws/chat/",
                                                headers={"Origin": url, "Cookie": f"sessionid={cookie}"})  # fmt: skip

        sockets = await asyncio.gather(*(connect(i) for i in indexes))
        try:
            await asyncio.gather(*(answer(ws) for ws in sockets))
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))
    return run


def client_process(where: dict, path: str, indexes: list[int], chunks: int, delay: int, at: float) -> dict:
    """One load client process's streams (--clients): what it saw, as plain lists."""
    run = asyncio.run(streams_of(where, path, indexes, chunks, delay, at))
    return vars(run)


class WaitSampler:
    """PostgreSQL's backends of the bench database seen waiting on a lock, every 10 ms, in a thread."""

    def __init__(self, database_url: str) -> None:
        self.database_url, self.lock_seconds, self.stop = database_url, 0.0, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()

    def sample(self) -> None:
        name = self.database_url.rsplit("/", 1)[1]
        sql = ("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock' "
               "AND pid <> pg_backend_pid()")  # fmt: skip
        with psycopg.connect(self.database_url, autocommit=True) as database:
            last = time.perf_counter()
            while not self.stop.is_set():
                waiting = database.execute(sql, [name]).fetchone()[0]
                now = time.perf_counter()
                self.lock_seconds += waiting * (now - last)  # each waiting backend waited about this long
                last = now
                self.stop.wait(0.01)


def waits(stack: Stack) -> dict[str, float]:
    """The servers' summed waits for a database thread and for a busy database: seconds and counts."""
    found = {"thread_s": 0.0, "thread_n": 0.0, "busy_s": 0.0}
    auth = {"Authorization": f"Bearer {stack.env['METRICS_TOKEN']}"}
    for url in stack.urls:
        for line in httpx.get(url + "/metrics", headers=auth, timeout=30).text.splitlines():
            if line.startswith("chat_db_thread_wait_seconds_sum"):
                found["thread_s"] += float(line.split()[-1])
            elif line.startswith("chat_db_thread_wait_seconds_count"):
                found["thread_n"] += float(line.split()[-1])
            elif line.startswith("chat_db_busy_wait_seconds_sum"):
                found["busy_s"] += float(line.split()[-1])
    return found


async def measure(stack: Stack, path: str, streams: int, chunks: int, delay: int, clients: int = 1,
                  database_url: str | None = None) -> dict:  # fmt: skip
    """`streams` concurrent streams on one path, the i-th on process i mod processes (`direct`: to the upstream)."""
    pids = [server.pid for server in stack.servers]
    where = target(stack)
    parts = [list(range(streams))[n::clients] for n in range(clients)]
    before = sum(rss_bytes(pid) for pid in pids)
    peak = before
    waited = waits(stack) if path != "direct" else None
    pool = client_pool(clients) if clients > 1 else None
    with WaitSampler(database_url) if database_url and path != "direct" else contextlib.nullcontext() as sampler:
        cpu = sum(cpu_seconds(pid) for pid in pids)
        # The moment every client process starts its streams (its sockets connected before it, not timed).
        at = time.time() + (0.5 if clients > 1 else 0.0) + (max(5.0, streams / 20) if path == "websocket" else 0.0)
        if clients == 1:
            work = asyncio.ensure_future(streams_of(where, path, parts[0], chunks, delay, at))
        else:
            loop = asyncio.get_running_loop()
            work = asyncio.gather(*(loop.run_in_executor(pool, client_process, where, path, part, chunks, delay, at)
                                    for part in parts))  # fmt: skip
        while not work.done():
            await asyncio.wait([work], timeout=0.1)
            peak = max(peak, sum(rss_bytes(pid) for pid in pids))
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu
        wall = time.time() - at
    if clients == 1:
        run = work.result()
    else:
        run = Run()
        for seen in work.result():
            run.ttft += seen["ttft"]
            run.latencies += seen["latencies"]
            run.failed += seen["failed"]
            run.lost += seen["lost"]
            run.errors += seen["errors"][: max(0, 3 - len(run.errors))]
    delivered = (streams - run.failed) * chunks - run.lost
    result = {
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
        "lock_wait_ms_per_start": None,
        "thread_wait_ms_per_start": None,
        "busy_wait_ms_per_start": None,
    }
    if waited is not None:
        after = waits(stack)
        calls = max(1.0, after["thread_n"] - waited["thread_n"])
        result["thread_wait_ms_per_start"] = (after["thread_s"] - waited["thread_s"]) / streams * 1000
        result["db_calls_per_stream"] = calls / streams
        result["busy_wait_ms_per_start"] = (after["busy_s"] - waited["busy_s"]) / streams * 1000
        if sampler is not None:
            result["lock_wait_ms_per_start"] = sampler.lock_seconds / streams * 1000
    return result


async def run_all(stack: Stack, args) -> dict:
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "processes": len(stack.servers),
        "clients": args.clients,
        "upstreams": args.upstreams,
        "users": stack.users,
        "chunks": args.chunks,
        "delay_ms": args.delay,
        "results": [],
    }
    options = {"clients": args.clients, "database_url": args.database_url}
    for path in ("/v1", "websocket"):
        await measure(stack, path, 4, 2, 1)  # warm up: imports, connections
    for path in ("/v1", "websocket"):
        floor = await measure(stack, "direct", args.streams, args.chunks, args.delay, args.clients)
        added(floor, floor)
        result = await measure(stack, path, args.streams, args.chunks, args.delay, **options)
        added(result, floor)
        report["results"] += [floor, result]
        for row in (floor, result):
            print(
                f"{row['path']:>10} {row['streams']} streams: TTFT p50/p99 {fmt(row['ttft_p50_ms'])}/"
                f"{fmt(row['ttft_p99_ms'])} ms (+{fmt(row['added_ttft_p50_ms'])}/+{fmt(row['added_ttft_p99_ms'])}), "
                f"chunk p50/p95/p99 {fmt(row['chunk_p50_ms'])}/{fmt(row['chunk_p95_ms'])}/"
                f"{fmt(row['chunk_p99_ms'])} ms (+{fmt(row['added_chunk_p99_ms'])} p99), "
                f"CPU {row['cpu_us_per_chunk'] or 0:.0f} µs/chunk, "
                f"RSS {row['rss_per_stream_kib'] or 0:.0f} KiB/stream, "
                f"failed {row['failed']}, lost {row['lost_chunks']} {row['errors'][:1]}",
                flush=True,
            )
        print(
            f"{path:>10} waits per start: PostgreSQL locks {fmt(result['lock_wait_ms_per_start'])} ms, "
            f"a database thread {fmt(result['thread_wait_ms_per_start'])} ms "
            f"({fmt(result.get('db_calls_per_stream'))} calls a stream), "
            f"a busy database {fmt(result['busy_wait_ms_per_start'])} ms",
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
    parser.add_argument("--clients", type=int, default=1, help="processes of the load client")
    parser.add_argument("--upstreams", type=int, default=1, help="processes of the fake upstream")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with postgres_database("chat_bench") as database_url, redis_prefix("chat_bench") as prefix:
        args.database_url = database_url
        env = {"REDIS_URL": REDIS_URL, "REDIS_PREFIX": prefix, "DATABASE_POOL_SIZE": str(args.pool),
               "METRICS_TOKEN": secrets.token_hex(16)}  # fmt: skip
        stack = Stack(database_url, litellm=False, servers=args.processes, env=env, users=args.users,
                      upstreams=args.upstreams)  # fmt: skip
        try:
            report = asyncio.run(run_all(stack, args))
        finally:
            stack.close()
    for pool in _pools.values():
        pool.shutdown()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaleout-latest.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    failed = sum(row["failed"] for row in report["results"])
    print(f"results: {args.out / 'scaleout-latest.json'}; failed streams: {failed}")


if __name__ == "__main__":
    main()
