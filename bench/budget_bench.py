"""Measure what the budget check adds to the start of a stream (target: at most 2 ms).

Starts the fake upstream and the real server (daphne, a fresh SQLite database, or
PostgreSQL with --database-url) as separate processes, seeds two people with the same
history this month (--rows usage records each), one with a budget (own USD and token
limits, a price for the model) and one with none, then alternates short streams of the
two, one at a time, over /v1 and over the websocket, and prints the median time to
first token each sees, and the difference. It also times `budgets.reserve()` itself in
this process against the same database (the check plus the reservation's price lookup).

    .venv/bin/python bench/budget_bench.py
    .venv/bin/python bench/budget_bench.py --streams 300 --rows 20000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_bench import MODEL, free_port, server_env, wait_http  # noqa: E402

PROMPT = "[[chunks:2]] [[reasoning:0]]"


def seed(rows: int, kinds: str = "both") -> dict[str, dict[str, str]]:
    """Two people with the same month of history; only the first has a budget (and the model a price)."""
    from datetime import timedelta

    from django.contrib.auth.models import User
    from django.test import Client
    from django.utils import timezone

    from chat.models import ApiToken, Budget, Price, Usage

    people = {}
    start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for name in ("budgeted", "free"):
        user = User.objects.create_user(name, password="x")
        Usage.objects.bulk_create(
            Usage(
                user=user,
                model=MODEL,
                status="complete",
                started=start + timedelta(seconds=i),
                prompt_tokens=50,
                completion_tokens=200,
                total_tokens=250,
                cost=Decimal("0.0001"),
            )
            for i in range(rows)
        )
        client = Client()
        client.force_login(user)
        people[name] = {"cookie": client.cookies["sessionid"].value, "token": ApiToken.issue(user, "bench")[1]}
    Budget.objects.create(
        user=User.objects.get(username="budgeted"),
        usd=Decimal("1000000") if kinds in ("usd", "both") else None,
        tokens=10**12 if kinds in ("tokens", "both") else None,
    )
    Price.objects.create(model=MODEL, prompt=Decimal("3"), completion=Decimal("15"))
    return people


def time_reserve(repeat: int) -> dict[str, float]:
    """Median µs of budgets.reserve() in a transaction with the user's row locked, as the server runs it."""
    from django.contrib.auth.models import User
    from django.db import transaction

    from chat.metering import budgets

    users = {name: User.objects.get(username=name) for name in ("budgeted", "free")}
    times: dict[str, list[float]] = {name: [] for name in users}
    for i in range(repeat):
        for name in ("budgeted", "free") if i % 2 else ("free", "budgeted"):  # interleaved: the same load for both
            begin = time.perf_counter()
            with transaction.atomic():
                User.objects.select_for_update().filter(pk=users[name].pk).first()
                budgets.reserve(users[name], provider_id=None, model=MODEL, prompt_tokens=20, max_tokens=8192)
            times[name].append(time.perf_counter() - begin)
    return {name: statistics.median(values) * 1e6 for name, values in times.items()}


async def api_ttft(session: aiohttp.ClientSession, url: str, token: str) -> float:
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": PROMPT}]}
    begin = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        assert r.status == 200, await r.read()
        first = None
        async for line in r.content:
            if first is None and line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                first = time.perf_counter() - begin
    return first if first is not None else float("nan")


async def chat_ttft(session: aiohttp.ClientSession, url: str, cookie: str) -> float:
    headers = {"Origin": url, "Cookie": f"sessionid={cookie}"}
    async with session.ws_connect(url.replace("http", "ws") + "/ws/chat/", headers=headers) as ws:
        begin = time.perf_counter()
        await ws.send_str(orjson.dumps({"type": "send", "conversation": None, "content": PROMPT}).decode())
        first = None
        async for message in ws:
            frame = orjson.loads(message.data)
            if frame["type"] == "delta" and first is None:
                first = time.perf_counter() - begin
            elif frame["type"] == "error":
                raise SystemExit(f"refused: {frame}")
            elif frame["type"] == "done":
                break
    return first if first is not None else float("nan")


async def measure(url: str, people: dict, streams: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, list[float]]] = {
        "api": {"budgeted": [], "free": []},
        "chat": {"budgeted": [], "free": []},
    }
    async with aiohttp.ClientSession() as session:
        for _ in range(5):  # warm up connections, caches and the model list
            await api_ttft(session, url, people["free"]["token"])
            await chat_ttft(session, url, people["free"]["cookie"])
        for i in range(streams):
            # Alternate who goes first, so neither always follows the other.
            order = ("budgeted", "free") if i % 2 else ("free", "budgeted")
            for name in order:
                results["api"][name].append(await api_ttft(session, url, people[name]["token"]))
                results["chat"][name].append(await chat_ttft(session, url, people[name]["cookie"]))
    summary = {}
    for path, by_name in results.items():
        pairs = [b - f for b, f in zip(by_name["budgeted"], by_name["free"], strict=True)]
        summary[path] = {name: statistics.median(times) * 1000 for name, times in by_name.items()}
        # Each budgeted stream against the free one next to it: steadier than a difference of medians.
        summary[path]["paired"] = statistics.median(pairs) * 1000
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=200, help="streams per person and path")
    parser.add_argument(
        "--rows", type=int, default=170, help="usage records per person this month (1M a year for 500 people: ~170)"
    )
    parser.add_argument("--kinds", choices=["usd", "tokens", "both"], default="both", help="the budget's limits")
    parser.add_argument("--database-url", help="e.g. postgres://postgres@127.0.0.1/bench_budget (emptied first)")
    args = parser.parse_args()
    folder = tempfile.TemporaryDirectory(prefix="chat-budget-bench-")
    fake_port, port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = server_env(
        args.database_url or f"sqlite:///{folder.name}/bench.sqlite3", fake_port,
        BUDGET_DEFAULT_USD="", BUDGET_DEFAULT_TOKENS="",
    )  # fmt: skip
    if args.database_url:
        subprocess.run([sys.executable, "manage.py", "flush", "--noinput"], cwd=ROOT, env=env, check=False)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update({name: env[name] for name in ("DATABASE_URL", "BUDGET_DEFAULT_USD", "BUDGET_DEFAULT_TOKENS")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()
    people = seed(args.rows, args.kinds)
    fake = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "fakeupstream.app:app", "--port", str(fake_port), "--log-level", "warning"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{fake_port}/", fake)
        wait_http(url + "/accounts/login/", server)
        reserve = time_reserve(500)
        ttft = asyncio.run(measure(url, people, args.streams))
    finally:
        for process in (server, fake):
            process.terminate()
            process.wait()
        folder.cleanup()
    engine = "PostgreSQL" if args.database_url else "SQLite"
    print(f"{engine}, {args.rows} usage records this month per person, {args.streams} streams per person and path\n")
    print(f"budgets.reserve(): {reserve['budgeted']:.0f} µs with a budget, {reserve['free']:.0f} µs with none")
    print(f"{'path':>5} {'TTFT with budget ms':>20} {'without ms':>11} {'added ms':>9} {'paired ms':>10}")
    for path, by_name in ttft.items():
        added = by_name["budgeted"] - by_name["free"]
        print(
            f"{path:>5} {by_name['budgeted']:>20.2f} {by_name['free']:>11.2f} {added:>9.2f} {by_name['paired']:>10.2f}"
        )


if __name__ == "__main__":
    main()
