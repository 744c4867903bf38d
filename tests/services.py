"""PostgreSQL and Redis for the scale-out tests, shared with whatever else uses them on this machine.

Every test run makes a database and a Redis key prefix of its own (named after its
process id) and removes only those when it is done.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import redis

PG_ADMIN = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def unique_name(base: str) -> str:
    return f"{base}_{os.getpid()}"


@contextmanager
def postgres_database(base: str) -> Iterator[str]:
    """A new, empty PostgreSQL database; yields its URL and drops it afterwards."""
    name = unique_name(base)
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


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
