"""Memory under a long load: rounds of N minutes at 200 concurrent streams, the server's RSS after each.

Starts the fake upstream and our server as bench/compare.py does (one process, a fresh SQLite
file, or --database-url), then runs --rounds rounds: for --minutes, --streams streams stay open
at all times (half on /v1, half on the websocket, each --chunks chunks --delay ms apart; a stream
that ends is replaced at once). After each round, once every stream has ended and the server has
been idle for --settle seconds, it reads the server's RSS. Memory "returns" when the last rounds
end at the same RSS: the growth from the first round's end to the last's is printed (per stream
too), with failed streams and lost chunks, and written to bench/results/soak-latest.json.

    .venv/bin/python bench/soak.py                       # 2 rounds of 10 minutes at 200 streams
    .venv/bin/python bench/soak.py --minutes 1           # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import orjson
from compare import RESULTS, Run, Stack, machine, rss_bytes, systems
from server_bench import cpu_seconds


async def round_of(stack: Stack, paths: list, streams: int, seconds: float, chunks: int, delay: int) -> dict:
    """`streams` streams kept open for `seconds`, alternating between the paths; what the clients saw."""
    prompt = f"[[stamp]] [[chunks:{chunks}]] [[delay:{delay}]] [[reasoning:0]]"
    run, done = Run(), 0
    end = time.monotonic() + seconds
    peak = rss_bytes(stack.server.pid)

    async def lane(index: int, session) -> None:
        nonlocal done
        one = paths[index % len(paths)]
        while time.monotonic() < end:
            await one(session, prompt, chunks, run)
            done += 1

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
        work = asyncio.gather(*(lane(i, session) for i in range(streams)))
        while not work.done():
            await asyncio.wait([work], timeout=1)
            peak = max(peak, rss_bytes(stack.server.pid))
    return {"streams_run": done, "failed": run.failed, "lost_chunks": run.lost, "errors": run.errors,
            "peak_rss_mib": peak / 2**20}  # fmt: skip


async def soak(stack: Stack, args) -> dict:
    found = systems(stack)
    paths = [found["ours /v1"][1], found["ours websocket"][1]]
    pid = stack.server.pid
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "streams": args.streams,
        "minutes": args.minutes,
        "chunks": args.chunks,
        "delay_ms": args.delay,
        "rss_start_mib": rss_bytes(pid) / 2**20,
        "rounds": [],
    }
    for number in range(1, args.rounds + 1):
        cpu = cpu_seconds(pid)
        result = await round_of(stack, paths, args.streams, args.minutes * 60, args.chunks, args.delay)
        await asyncio.sleep(args.settle)  # the last saves and closes, then idle
        result.update(round=number, cpu_s=cpu_seconds(pid) - cpu, rss_after_mib=rss_bytes(pid) / 2**20,
                      load=os.getloadavg()[0])  # fmt: skip
        report["rounds"].append(result)
        print(
            f"round {number}: {result['streams_run']} streams, failed {result['failed']}, "
            f"lost {result['lost_chunks']}, "
            f"peak RSS {result['peak_rss_mib']:.1f} MiB, after {result['rss_after_mib']:.1f} MiB, "
            f"load {result['load']:.1f} {result['errors'][:1]}",
            flush=True,
        )
    first, last = report["rounds"][0], report["rounds"][-1]
    report["growth_mib"] = last["rss_after_mib"] - first["rss_after_mib"]
    report["growth_kib_per_stream"] = report["growth_mib"] * 1024 / args.streams
    report["peak_kib_per_stream"] = (
        (max(r["peak_rss_mib"] for r in report["rounds"]) - report["rss_start_mib"]) * 1024 / args.streams
    )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=100)
    parser.add_argument("--delay", type=int, default=20, help="ms between chunks (20: 50 a second)")
    # Longer than the server's MEMORY_TRIM_SECONDS (10 s): a trim has run since the last stream ended.
    parser.add_argument("--settle", type=float, default=15, help="idle seconds before RSS is read after a round")
    parser.add_argument("--database-url")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON")
    args = parser.parse_args()
    stack = Stack(args.database_url, litellm=False)
    try:
        report = asyncio.run(soak(stack, args))
    finally:
        stack.close()
    first, last = report["rounds"][0], report["rounds"][-1]
    print(
        f"RSS {report['rss_start_mib']:.1f} MiB at the start; after round 1 "
        f"{first['rss_after_mib']:.1f}, after round {args.rounds} {last['rss_after_mib']:.1f}: "
        f"growth {report['growth_mib']:+.1f} MiB ({report['growth_kib_per_stream']:+.1f} KiB a stream); "
        f"peak {report['peak_kib_per_stream']:.0f} KiB a stream over the start"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak-latest.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
