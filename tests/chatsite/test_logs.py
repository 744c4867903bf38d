"""The server's log lines (chatsite/logs.py, chatsite/server.py): the request's id on each, JSON on request."""

from __future__ import annotations

import json
import logging
import sys

import httpx
import pytest
from django.db import connection

from chatsite.logs import JsonFormatter, RequestIdFilter, request_id
from tests.chatsite.test_settings import manage
from tests.live import LiveServer, database_url, wait_until


def test_a_json_line_carries_the_request_id_and_the_traceback():
    record = logging.LogRecord("chat.x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
    token = request_id.set("abc123")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id.reset(token)
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "failed here" and line["request_id"] == "abc123" and line["level"] == "ERROR"
    assert line["time"].endswith("Z") and "ValueError: boom" in line["exception"]


@pytest.mark.django_db(transaction=True)
def test_log_format_json_makes_every_line_of_the_server_a_json_object():
    env = {"DATABASE_URL": database_url(connection.settings_dict), "LOG_FORMAT": "json"}
    with LiveServer(env) as live:
        assert httpx.get(live.url + "/accounts/login/").status_code == 200
        assert httpx.get(live.url + "/healthz").status_code == 200
        assert wait_until(lambda: "/accounts/login/" in live.output())
        output = live.output()
    lines = [json.loads(line) for line in output.splitlines() if line.strip()]
    started = [line for line in lines if line["message"].startswith("chat server ")]
    name = connection.settings_dict["NAME"]  # the file, not the backend's module
    assert len(started) == 1 and f"database SQLite {name};" in started[0]["message"], started
    access = [line for line in lines if line["logger"] == "chatsite.access" and "/accounts/login/" in line["message"]]
    assert len(access) == 1 and access[0]["request_id"] != "-"
    assert not [line for line in lines if "/healthz" in line["message"]]  # the probes are never logged


def test_an_unknown_log_format_is_a_clear_error():
    result = manage("check", env={"LOG_FORMAT": "xml"})
    assert result.returncode != 0 and "LOG_FORMAT must be plain or json" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_the_logs_never_show_an_invites_a_resets_or_a_shares_secret():
    """Whoever reads the log must not get in: the paths that carry a capability are logged without it."""
    secrets = ["inviteSECRET123", "resetTOKEN-abc", "shareTOKEN456"]
    paths = [f"/accounts/invite/{secrets[0]}/", f"/accounts/password/reset/MQ/{secrets[1]}/", f"/s/{secrets[2]}/"]
    with LiveServer({"DATABASE_URL": database_url(connection.settings_dict)}) as live:
        statuses = [httpx.get(live.url + path).status_code for path in paths]
        assert wait_until(lambda: live.output().count("[secret]") >= 3)
        output = live.output()
    assert statuses[0] == 410 and statuses[2] == 404, statuses  # unknown, so also a warning line of their own
    assert not [secret for secret in secrets if secret in output], output
    assert "GET /accounts/invite/[secret]/ 410" in output and "GET /s/[secret]/ 404" in output, output
    assert "Not Found: /s/[secret]/" in output, output


def test_loggable_path_keeps_what_is_not_a_secret():
    from chat.lib.log_paths import loggable_path

    assert loggable_path("/accounts/password/reset/MQ/set-password/") == "/accounts/password/reset/MQ/set-password/"
    assert loggable_path("/accounts/password/reset/sent/") == "/accounts/password/reset/sent/"
    assert loggable_path("/s/abc/continue") == "/s/[secret]/continue"
    assert loggable_path("/c/12/") == "/c/12/" and loggable_path("/settings/") == "/settings/"
