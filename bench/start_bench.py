"""The database's part of a `/v1` stream's start and end, one after another, with no HTTP and no upstream.

What a `/v1` request's database trip does before the upstream request (the token's owner's access and the
enabled providers, kept by the process after the first read: chat/runtime/kept_reads.py; the metered start:
the lock, the limits, the budget, the usage row) and its final save, --starts times in this process against
a fresh database (SQLite in a temporary folder, or a new PostgreSQL database made from --database-url's
server and dropped afterwards). It prints this process's CPU and the wall time per start and end: on
PostgreSQL the wall time includes the round trips and the backend's work, which SQLite does inside the
process; with the server on this machine (Linux), also the backend's own CPU.

    .venv/bin/python bench/start_bench.py
    .venv/bin/python bench/start_bench.py --database-url postgres://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(starts: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per start and end, after a warm-up of 50 (the statements prepared, the caches full)."""
    from django.contrib.auth import get_user_model

    from chat.auth.api_tokens import caller
    from chat.metering import metered_streams
    from chat.models import ApiToken, Provider, Usage

    person = get_user_model().objects.create_user("bench")
    provider = Provider.objects.create(name="bench", base_url="http://127.0.0.1:9/v1", api_key="k")
    _, secret = ApiToken.issue(person, "bench")

    def one() -> None:
        token, _, _ = caller(secret)
        usage = metered_streams.start(person, source=Usage.Source.API, token=token, provider=provider, model="m",
                                      prompt_tokens=5, max_tokens=10, check_limits=False)  # fmt: skip
        metered_streams.settle(usage.pk, {"status": "complete", "completion_tokens": 3, "total_tokens": 8})

    for _ in range(50):
        one()
    backend = backend_clock()
    cpu, wall, backend_cpu = time.process_time(), time.perf_counter(), cpu_time(backend)
    for _ in range(starts):
        one()
    backend_ms = (cpu_time(backend) - backend_cpu) / starts * 1000 if backend is not None else None
    return (time.process_time() - cpu) / starts * 1000, (time.perf_counter() - wall) / starts * 1000, backend_ms


def backend_clock() -> int | None:
    """The CPU clock of this connection's PostgreSQL backend (Linux, a server on this machine); None elsewhere."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    clock = (~pid << 3) | 2  # Linux's clock_getcpuclockid(pid): that process's CPU time
    try:
        time.clock_gettime(clock)
    except OSError:
        return None
    return clock


def cpu_time(clock: int | None) -> float:
    return time.clock_gettime(clock) if clock is not None else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=500)
    parser.add_argument("--database-url", help="a PostgreSQL server (any database on it): a new one is made there")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        name = f"chat_start_bench_{os.getpid()}"
        if args.database_url:
            admin = psycopg.conninfo.conninfo_to_dict(args.database_url)
            with psycopg.connect(**admin, autocommit=True) as connection:
                connection.execute(f"CREATE DATABASE {name}")
            database_url = args.database_url.rsplit("/", 1)[0] + "/" + name
        else:
            database_url = f"sqlite:///{folder}/bench.sqlite3"
        try:
            env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING"}
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
            os.environ.update({"DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"})
            import django

            django.setup()
            cpu, wall, backend = measure(args.starts)
            from django.db import connections

            connections.close_all()
        finally:
            if args.database_url:
                with psycopg.connect(**admin, autocommit=True) as connection:
                    connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    vendor = "PostgreSQL" if args.database_url else "SQLite"
    also = f", the PostgreSQL backend's CPU {backend:.2f} ms" if backend is not None else ""
    print(f"{vendor}: {args.starts} starts and ends, one after another: this process's CPU {cpu:.2f} ms{also}, "
          f"wall {wall:.2f} ms a start and end")  # fmt: skip


if __name__ == "__main__":
    main()
