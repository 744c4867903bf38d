"""Settings from the environment: safe production settings, a SQLite that takes concurrent writers."""

import os
import subprocess
import sys

import pytest
from django.db import connection

from tests.live import ROOT

PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_HTTPS": "1",
    "DJANGO_SECRET_KEY": "a-production-secret-key-that-is-long-and-random-0123456789-abcdefghij",
    "DJANGO_ALLOWED_HOSTS": "chat.example.com",
}


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True
    )


def test_check_deploy_is_clean_with_production_settings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def production_example() -> dict[str, str]:
    """deploy/env.production.example as an environment (KEY=value lines; comments and blanks skipped)."""
    lines = (ROOT / "deploy" / "env.production.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_check_deploy_is_clean_with_the_production_example_in_deploy():
    example = production_example()
    assert example["DJANGO_DEBUG"] == "0" and example["DJANGO_HTTPS"] == "1"
    # Checked without the PostgreSQL and Redis it names: the checks do not connect to them.
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=example)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_warns_without_https():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={**PRODUCTION, "DJANGO_HTTPS": "0"})
    assert result.returncode != 0 and "SECURE_SSL_REDIRECT" in result.stderr


def test_a_bad_number_in_the_environment_is_a_clear_error():
    result = manage("check", env={"UPSTREAM_MAX_TOKENS": "lots"})
    assert result.returncode != 0 and "UPSTREAM_MAX_TOKENS must be a number" in result.stderr


@pytest.mark.django_db
def test_sqlite_runs_in_wal_mode_with_immediate_transactions():
    assert connection.vendor == "sqlite"  # the default; PostgreSQL is covered by test_scaleout.py
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == 20000
    assert connection.transaction_mode == "IMMEDIATE"
