"""Measure the usage dashboard's server time on a year of a busy team, on SQLite and on PostgreSQL.

Seeds 1,000,000 usage rows spread over the last 12 months (500 people, 20 models) into a fresh
SQLite file and a fresh PostgreSQL database of its own (tests/services.py; dropped afterwards),
then times GET /usage/ for a staff member, in process (Django's test client: the view, its
queries and the template, no network), for this month and for the whole year, and the CSV of
this month. Each figure is the median of a few runs after one to warm the caches (the page's
best run beside it: the machine may be shared).

    .venv/bin/python bench/dashboard_bench.py                     # both databases, 1,000,000 rows
    .venv/bin/python bench/dashboard_bench.py --rows 100000 --backend sqlite
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEOPLE = 500
MODELS = 20
STATUSES = ["complete"] * 90 + ["stopped"] * 4 + ["interrupted"] * 3 + ["failed"] * 3


def seed(rows: int) -> float:
    """500 people and `rows` usage rows over the 365 days before now; returns the seconds `manage.py rollup` took.

    The rows go in as plain tuples (COPY on PostgreSQL, executemany on SQLite) with the
    summaries' triggers off, then `rollup` makes the triggers again and fills the summaries with
    one GROUP BY each, as migration 0010 does on an existing database.
    """
    import random
    from datetime import timedelta
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.utils import timezone

    from chat.metering import summary_triggers

    User = get_user_model()
    User.objects.bulk_create([User(username=f"person{n:03d}", password="!") for n in range(PEOPLE)])
    User.objects.create_user("staff", is_staff=True)
    ids = list(User.objects.filter(username__startswith="person").values_list("pk", flat=True))
    models = [f"vendor{n % 4}/model-{n:02d}" for n in range(MODELS)]
    rng = random.Random(9)
    now = timezone.now()
    year = 365 * 24 * 3600
    postgres = connection.vendor == "postgresql"
    columns = ["user_id", "source", "model", "started", "prompt_tokens", "completion_tokens", "reasoning_tokens"]
    columns += ["total_tokens", "cost", "ttft_ms", "tokens_per_second", "status", "upstream_id", "request_id"]
    columns += ["finish_reason", "error", "estimated", "cost_source", "cost_estimated", "reserved_tokens"]

    def row() -> tuple:
        prompt, completion = rng.randint(50, 4000), rng.randint(10, 2000)
        model = rng.randrange(MODELS)
        started = now - timedelta(seconds=rng.randrange(year))
        return (
            rng.choice(ids),
            "api" if rng.random() < 0.3 else "chat",
            models[model],
            started if postgres else connection.ops.adapt_datetimefield_value(started),
            prompt,
            completion,
            completion // 4 if model % 3 == 0 else 0,
            prompt + completion,
            Decimal(prompt + 4 * completion) * Decimal("0.000001") * (model + 1),
            rng.randint(80, 4000),
            rng.uniform(10, 150),
            rng.choice(STATUSES),
            *("", "", "stop", "", False, "reported", False, 0),
        )

    summary_triggers.uninstall()
    with transaction.atomic(), connection.cursor() as cursor:
        if postgres:
            with cursor.cursor.copy(f"COPY chat_usage ({', '.join(columns)}) FROM STDIN") as copy:
                for _ in range(rows):
                    copy.write_row(row())
        else:
            marks = ", ".join(["%s"] * len(columns))
            sql = f"INSERT INTO chat_usage ({', '.join(columns)}) VALUES ({marks})"
            for start in range(0, rows, 10_000):
                cursor.executemany(sql, [row() for _ in range(min(10_000, rows - start))])
    began = time.perf_counter()
    call_command("rollup", verbosity=0)
    return time.perf_counter() - began


async def drain(response) -> int:
    """Read a streamed response to its end, as daphne would; its size in bytes."""
    return sum([len(part) async for part in response.streaming_content])


def measure(runs: int) -> dict[str, float]:
    """Median milliseconds for the month page, the year page and the month's CSV."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="staff"))
    results = {}
    for name, path in (("month", "/usage/"), ("year", "/usage/?period=year"), ("month CSV", "/usage/csv")):
        times = []
        for _ in range(runs + 1):
            began = time.perf_counter()
            response = client.get(path)
            if name.endswith("CSV"):
                size = asyncio.run(drain(response))
            assert response.status_code == 200, response.status_code
            times.append((time.perf_counter() - began) * 1000)
        results[name] = statistics.median(times[1:])
        results[f"{name} best"] = min(times[1:])
        if name.endswith("CSV"):
            results["CSV MB"] = size / 1e6
    return results


def child(rows: int, runs: int) -> None:
    """Runs in a process of its own, DATABASE_URL set: migrate, seed, measure, print one line."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)  # the page links hashed static files
    began = time.perf_counter()
    rolled_up = seed(rows)
    seeded = time.perf_counter() - began
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")  # the summaries too
    else:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    figures = measure(runs)
    print(
        f"| {connection.vendor} | {rows:,} | {figures['month']:.0f} ({figures['month best']:.0f}) "
        f"| {figures['year']:.0f} ({figures['year best']:.0f}) "
        f"| {figures['month CSV']:.0f} ({figures['CSV MB']:.1f} MB) | {seeded:.0f} s | {rolled_up:.1f} s |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.rows, args.runs)
        return
    print("| database | rows | month page ms (best) | year page ms (best) | month CSV ms | seeding | of which rollup |")
    print("| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    command = [sys.executable, __file__, "--child", "--rows", str(args.rows), "--runs", str(args.runs)]
    env = {**os.environ, "DJANGO_DEBUG": "0", "LOG_LEVEL": "WARNING", "DJANGO_ALLOWED_HOSTS": "testserver"}
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{folder}/bench.sqlite3"
            subprocess.run(command, env={**env, "DATABASE_URL": url}, cwd=ROOT, check=True)
    if args.backend in ("postgresql", "both"):
        from tests.services import postgres_database

        with postgres_database("chat_dashboard_bench") as url:
            subprocess.run(command, env={**env, "DATABASE_URL": url}, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
