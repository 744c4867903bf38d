"""Profile the server with py-spy while it answers one-token requests one at a time, on /v1 or the websocket.

With --streams, it profiles the per-chunk path instead: that many concurrent streams of
--chunks chunks each, 20 ms apart (bench/compare.py's load), started before py-spy attaches
in the sense that their starts are a small share of the samples.

Starts the same processes as bench/compare.py (without LiteLLM), attaches py-spy (bench/.venv,
`make bench-deps`) to the server, runs --requests sequential one-token answers on one path and
prints the functions with the most samples, inclusive and exclusive; the raw collapsed stacks
are kept in bench/results/profile-<path>.txt (speedscope and flamegraph tools read them).

    .venv/bin/python bench/profile.py --path api
    .venv/bin/python bench/profile.py --path websocket --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import time

from compare import BENCH_VENV, RESULTS, Stack, cpu_per_chunk, measure, one_token_rate, systems

# Leaf functions that wait rather than work.
IDLE = ("select", "Condition.wait", "_wait_for_tstate_lock", "SimpleQueue.get", "Event.wait")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=["api", "websocket"], default="api")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--streams", type=int, default=0, help="profile this many concurrent long streams instead")
    parser.add_argument("--chunks", type=int, default=500, help="chunks a stream, with --streams")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw = RESULTS / f"profile-{args.path}{'-chunks' if args.streams else ''}.txt"
    stack = Stack(args.database_url, litellm=False)
    try:
        name = "ours /v1" if args.path == "api" else "ours websocket"
        pid, one = systems(stack)[name]
        socket = stack if args.path == "websocket" else None
        asyncio.run(one_token_rate(one, pid, 20, 1, socket))  # warm up
        spy = subprocess.Popen(
            [str(BENCH_VENV / "bin" / "py-spy"), "record", "--pid", str(pid), "--format", "raw", "--rate", "500",
             "--gil", "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1)  # py-spy attaching
        if args.streams:
            baseline = asyncio.run(measure(one, pid, args.streams, 1, 20))
            result = asyncio.run(measure(one, pid, args.streams, args.chunks, 20))
            cpu_per_chunk(result, baseline, args.chunks)
        else:
            rate = asyncio.run(one_token_rate(one, pid, args.requests, 1, socket))
        spy.send_signal(2)
        spy.wait(30)
    finally:
        stack.close()
    if args.streams:
        print(f"{args.streams} streams of {args.chunks} chunks on {name}: "
              f"CPU {result['cpu_us_per_chunk']:.0f} µs a chunk, "
              f"chunk p50/p99 {result['chunk_p50_ms']:.1f}/{result['chunk_p99_ms']:.1f} ms, failed {result['failed']}, "
              f"lost {result['lost_chunks']}")  # fmt: skip
    else:
        print(f"{args.requests} one-token answers on {name}: {rate['per_second']:.0f}/s, "
              f"CPU {rate['cpu_ms_per_request']:.2f} ms each, failed {rate['failed']}")  # fmt: skip
    inclusive, exclusive, total = collections.Counter(), collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        frames = [frame.split(" (")[0] + " (" + frame.rsplit("/", 1)[-1] for frame in stack_text.split(";")]
        count = int(count)
        if frames[-1].split(" (")[0].endswith(IDLE):
            continue  # waiting, not working
        total += count
        exclusive[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    print(f"\n{total} busy samples; inclusive share (top {args.top}):")
    for frame, count in inclusive.most_common(args.top):
        print(f"  {count / total:6.1%}  {frame}")
    print("\nexclusive share (top 20):")
    for frame, count in exclusive.most_common(20):
        print(f"  {count / total:6.1%}  {frame}")


if __name__ == "__main__":
    main()
