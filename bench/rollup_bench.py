"""Measure what the summaries' triggers (chat/metering/summary_triggers.py) add to a usage row's two writes.

A stream creates its usage row when it starts and settles it (an UPDATE) when it ends, each in
a transaction of its own. This times both, one row at a time, with the triggers and without,
against a fresh SQLite file or PostgreSQL database holding --rows rows already, and prints
the medians.

    .venv/bin/python bench/rollup_bench.py                      # both databases
    .venv/bin/python bench/rollup_bench.py --backend sqlite --streams 2000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def streams(count: int, user) -> tuple[float, float]:
    """Median ms of creating a streaming usage row and of settling it, each in its own transaction."""
    from decimal import Decimal

    from django.db import transaction

    from chat.models import Usage

    created, settled = [], []
    for n in range(count):
        began = time.perf_counter()
        with transaction.atomic():
            row = Usage.objects.create(user=user, model=f"model-{n % 20}", status="streaming", prompt_tokens=100)
        middle = time.perf_counter()
        Usage.objects.filter(pk=row.pk).update(
            status="complete", completion_tokens=50, total_tokens=150, cost=Decimal("0.0012"), ttft_ms=300
        )
        ended = time.perf_counter()
        created.append((middle - began) * 1000)
        settled.append((ended - middle) * 1000)
    return statistics.median(created), statistics.median(settled)


def child(rows: int, count: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection

    from bench.dashboard_bench import seed
    from chat.metering import summary_triggers

    call_command("migrate", verbosity=0)
    seed(rows)
    user = get_user_model().objects.get(username="staff")
    streams(50, user)  # warm-up
    with_triggers = streams(count, user)
    summary_triggers.uninstall()
    without = streams(count, user)
    print(
        f"| {connection.vendor} | {without[0]:.2f} / {with_triggers[0]:.2f} "
        f"| {without[1]:.2f} / {with_triggers[1]:.2f} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.rows, args.streams)
        return
    print("| database | start: create, ms without / with triggers | end: settle, ms without / with |")
    print("| --- | --- | --- |", flush=True)
    command = [sys.executable, __file__, "--child", "--rows", str(args.rows), "--streams", str(args.streams)]
    env = {**os.environ, "DJANGO_DEBUG": "0", "LOG_LEVEL": "WARNING"}
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as folder:
            url = f"sqlite:///{folder}/bench.sqlite3"
            subprocess.run(command, env={**env, "DATABASE_URL": url}, cwd=ROOT, check=True)
    if args.backend in ("postgresql", "both"):
        from tests.services import postgres_database

        with postgres_database("chat_rollup_bench") as url:
            subprocess.run(command, env={**env, "DATABASE_URL": url}, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
