"""Settings from the environment: safe production settings, a SQLite that takes concurrent writers."""

import os
import shutil
import stat
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
    "EMAIL_URL": "smtp://127.0.0.1:25",
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


def test_check_deploy_is_clean_with_the_production_example_filled_in():
    example = production_example()
    assert example["DJANGO_DEBUG"] == "0" and example["DJANGO_HTTPS"] == "1"
    # As it is, each placeholder left is named: anyone can read them.
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=example)
    assert result.returncode != 0
    left = sorted(line.split("(chat.W001) ")[1].split()[0] for line in result.stderr.splitlines() if "W001" in line)
    expected = ["DATABASE_URL", "DJANGO_SECRET_KEY", "EMAIL_URL", "METRICS_TOKEN", "UPSTREAM_API_KEY"]
    assert left == expected, result.stderr
    # Checked without the PostgreSQL and Redis it names: the checks do not connect to them.
    filled = {name: value.replace("change-me", "Xq7v9RandomFill3kP") for name, value in example.items()}
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=filled)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
    # Without EMAIL_URL, mail (invite and reset links) would be printed to the log.
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={**filled, "EMAIL_URL": ""})
    assert result.returncode != 0 and "chat.W002" in result.stderr and "written to the log" in result.stderr


def test_check_deploy_warns_without_https():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={**PRODUCTION, "DJANGO_HTTPS": "0"})
    assert result.returncode != 0 and "SECURE_SSL_REDIRECT" in result.stderr


def test_a_bad_number_in_the_environment_is_a_clear_error():
    result = manage("check", env={"UPSTREAM_MAX_TOKENS": "lots"})
    assert result.returncode != 0 and "UPSTREAM_MAX_TOKENS must be a number" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DATABASE_THREADS", "0", "DATABASE_THREADS must be more than 0"),  # every send hung
        ("REQUEST_MAX_BYTES", "-1", "REQUEST_MAX_BYTES must be 0 or more, not -1"),  # every request was a 413
        ("UPSTREAM_DEADLINE", "0", "UPSTREAM_DEADLINE must be more than 0"),  # every stream failed
        ("SHUTDOWN_GRACE_SECONDS", "-5", "SHUTDOWN_GRACE_SECONDS must be 0 or more"),
        ("LOG_LEVEL", "VERBOSE", "LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not 'VERBOSE'"),
        ("DJANGO_TIME_ZONE", "Mars/Base", "DJANGO_TIME_ZONE must be a zone such as Europe/Paris, not 'Mars/Base'"),
    ],
)
def test_a_value_out_of_range_stops_the_start_with_a_sentence(variable, value, says):
    result = manage("check", env={variable: value})
    assert result.returncode != 0 and says in result.stderr, result.stderr[-500:]
    assert "ValueError" not in result.stderr  # a sentence naming the variable, not a library's complaint


@pytest.mark.django_db
def test_sqlite_runs_in_wal_mode_with_immediate_transactions():
    assert connection.vendor == "sqlite"  # the default; PostgreSQL is covered by test_scaleout.py
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] == 20000
    assert connection.transaction_mode == "IMMEDIATE"


def test_limit_defaults_and_token_limits_follow_the_user_limits(settings):
    assert (settings.CHAT_MAX_STREAMS, settings.API_MAX_STREAMS, settings.RATE_LIMIT_PER_MINUTE) == (4, 8, 60)
    assert settings.API_TOKEN_MAX_STREAMS == 8 and settings.API_TOKEN_RATE_LIMIT_PER_MINUTE == 60
    assert (settings.MAX_TOKENS_LIMIT, settings.API_MAX_N) == (32768, 1)
    assert settings.UPSTREAM_PROVIDER_MAX_CONNECTIONS == settings.UPSTREAM_MAX_CONNECTIONS // 2
    result = manage("check", env={"UPSTREAM_MAX_TOKENS": "40000"})
    assert result.returncode != 0 and "UPSTREAM_MAX_TOKENS must be between 1 and MAX_TOKENS_LIMIT" in result.stderr


SETTINGS_ONLY = """
import os, pathlib, sys
# Any chmod after creation would hide a moment with a wider mode: the file must be born 600.
os.umask(0o022)
os.chmod = pathlib.Path.chmod = lambda *args, **kwargs: sys.exit("chmod called")
sys.path.insert(0, os.getcwd())
from chatsite import settings
print(settings.SECRET_KEY)
"""


def test_generated_secret_key_file_is_created_readable_by_its_owner_only(tmp_path):
    shutil.copytree(ROOT / "chatsite", tmp_path / "chatsite", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}

    def settings_key() -> str:
        result = subprocess.run([sys.executable, "-c", SETTINGS_ONLY], cwd=tmp_path, env=env, capture_output=True)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode().strip()

    key = settings_key()
    path = tmp_path / ".secret_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) >= 50 and path.read_text() == key
    assert settings_key() == key  # kept, not regenerated


@pytest.mark.django_db
def test_csrf_cookie_is_http_only(client):
    response = client.get("/accounts/login/")
    cookie = response.cookies["csrftoken"]
    assert cookie.value and cookie["httponly"] is True


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("console://", {"EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend"}),
        (
            "smtp://bot%40example.com:p%40ss@mail.example.com:587?tls=1",
            {"EMAIL_HOST": "mail.example.com", "EMAIL_PORT": 587, "EMAIL_HOST_USER": "bot@example.com",
             "EMAIL_HOST_PASSWORD": "p@ss", "EMAIL_USE_TLS": True, "EMAIL_USE_SSL": False},
        ),
        ("smtps://mail.example.com", {"EMAIL_PORT": 465, "EMAIL_USE_SSL": True, "EMAIL_USE_TLS": False}),
        ("smtp+tls://mail.example.com", {"EMAIL_PORT": 587, "EMAIL_USE_TLS": True}),
        ("smtp://127.0.0.1", {"EMAIL_PORT": 25, "EMAIL_USE_TLS": False, "EMAIL_HOST_USER": ""}),
        ("file:///var/mail/chat", {"EMAIL_FILE_PATH": "/var/mail/chat"}),
    ],
)  # fmt: skip
def test_email_url(url, expected):
    from chatsite import mailconfig

    parsed = mailconfig.parse(url)
    assert expected.items() <= parsed.items()


def test_email_is_printed_by_default_and_a_bad_email_url_stops_the_start():
    shown = manage("shell", "-c", "from django.conf import settings; print(settings.EMAIL_BACKEND)", env={})
    assert shown.stdout.strip().splitlines()[-1] == "django.core.mail.backends.console.EmailBackend"
    refused = manage("check", env={"EMAIL_URL": "pop3://mail.example.com"})
    assert refused.returncode != 0 and "EMAIL_URL: unknown scheme 'pop3'" in refused.stderr


@pytest.mark.parametrize(("prepared", "expected"), [(None, "True 5"), ("0", "None None")])
def test_postgresql_binds_and_prepares_unless_database_prepared_is_0(prepared, expected):
    """DATABASE_PREPARED (default on): the values sent apart and statements prepared; 0 for a pooler without them."""
    env = {"DATABASE_URL": "postgres://chat@127.0.0.1:9/chat", **({"DATABASE_PREPARED": prepared} if prepared else {})}
    code = (
        "from django.conf import settings; options = settings.DATABASES['default'].get('OPTIONS', {}); "
        "print(options.get('server_side_binding'), options.get('prepare_threshold'))"
    )
    shown = manage("shell", "-c", code, env=env)
    assert shown.stdout.strip().splitlines()[-1] == expected, shown.stderr
