"""PostgreSQL and Redis for the scale-out tests, shared with whatever else uses them on this machine.

Every test run makes a database and a Redis key prefix of its own (named after its
process id: each pytest-xdist worker is a process of its own too) and removes only
those when it is done.

Migrating a new database costs seconds of CPU (on a busy machine, a minute of waiting), so each
run migrates one template per engine, once, and copies it: PostgreSQL by CREATE DATABASE … TEMPLATE,
SQLite by its backup API. The run's id (CHAT_TEST_RUN, set by the first process and inherited by
pytest-xdist's workers) names them; drop_templates() removes them at the end of the run.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import redis

PG_ADMIN = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parent.parent
RUN = os.environ.setdefault("CHAT_TEST_RUN", uuid.uuid4().hex[:10])
TEMPLATES = Path(tempfile.gettempdir()) / f"chat-test-templates-{RUN}"
PG_TEMPLATE = f"chat_template_{RUN}"


def url_of(name: str) -> str:
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


def migrate(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True)  # fmt: skip


def _copy_of_the_template(admin: psycopg.Connection, name: str) -> None:
    """CREATE DATABASE `name` from the run's migrated template, made first if no worker has made it yet."""
    admin.execute("SELECT pg_advisory_lock(hashtext(%s))", (PG_TEMPLATE,))  # one worker builds; copies queue
    try:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_TEMPLATE,)).fetchone() is None:
            partial = f"{PG_TEMPLATE}_partial"
            admin.execute(f"DROP DATABASE IF EXISTS {partial} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {partial}")
            migrate(url_of(partial))
            admin.execute(f"ALTER DATABASE {partial} RENAME TO {PG_TEMPLATE}")
        admin.execute(f"CREATE DATABASE {name} TEMPLATE {PG_TEMPLATE}")
    finally:
        admin.execute("SELECT pg_advisory_unlock(hashtext(%s))", (PG_TEMPLATE,))


def migrated_sqlite(path: str) -> None:
    """A migrated SQLite database at `path`: a copy of the run's template, made first if no worker has made it yet."""
    TEMPLATES.mkdir(exist_ok=True)
    template = TEMPLATES / "template.sqlite3"
    with open(TEMPLATES / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not template.exists():
            partial = TEMPLATES / "partial.sqlite3"
            partial.unlink(missing_ok=True)
            migrate(f"sqlite:///{partial}")
            with sqlite3.connect(partial) as db:  # its log into the file: the file alone is the database
                db.execute("PRAGMA journal_mode=DELETE")
            partial.rename(template)
    source, target = sqlite3.connect(template), sqlite3.connect(path)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def drop_templates() -> None:
    """Remove the run's templates (at the end of the run, by the process that started it)."""
    shutil.rmtree(TEMPLATES, ignore_errors=True)
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {PG_TEMPLATE} WITH (FORCE)")
            admin.execute(f"DROP DATABASE IF EXISTS {PG_TEMPLATE}_partial WITH (FORCE)")
    except psycopg.OperationalError:
        pass  # no PostgreSQL here: no template was made on it


def unique_name(base: str) -> str:
    return f"{base}_{os.getpid()}"


@contextmanager
def postgres_database(base: str, migrated: bool = False) -> Iterator[str]:
    """A new PostgreSQL database, empty or `migrated`; yields its URL and drops it afterwards."""
    name = unique_name(base)
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if migrated:
            _copy_of_the_template(admin, name)
        else:
            admin.execute(f"CREATE DATABASE {name}")
    try:
        yield url_of(name)
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def check_on_postgresql(base: str, module: str, function: str) -> None:
    """Call `module.function()` in a process of its own on a new, migrated PostgreSQL database; fail with its errors."""
    with postgres_database(base, migrated=True) as database_url:
        env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
        code = f"import django; django.setup(); from {module} import {function}; {function}()"
        checked = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


@contextmanager
def redis_prefix(base: str) -> Iterator[str]:
    """A Redis key prefix no one else uses; yields it and deletes only its keys afterwards."""
    prefix = unique_name(base)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield prefix
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()
