"""Upstream-derived strings against the columns that store them, on PostgreSQL (which enforces lengths)."""

import asyncio
import os
import subprocess
import sys

import httpx
import psycopg
import pytest

from chat.models import Conversation
from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer, Tab
from tests.services import postgres_database
from tests.test_scaleout import sign_in

FINISH = "stop_" + "x" * 35  # 40 characters for a 30-character column
LONG = "[[finish:" + FINISH + "]] [[longid]] hi"


@pytest.fixture(scope="module")
def pg_server(fake_server):
    """A server on a PostgreSQL database of its own, its upstream the fake infyrence; yields (server, API token)."""
    with postgres_database("chat_columns") as database_url:
        env = {
            "DATABASE_URL": database_url,
            "UPSTREAM_BASE_URL": fake_server.base_url("infyrence"),
            "UPSTREAM_API_KEY": FAKE_KEY,
            "UPSTREAM_NAME": "infyrence",
            "UPSTREAM_MODEL": MODELS["infyrence"],
        }
        setup = {**os.environ, **env, "DJANGO_SUPERUSER_PASSWORD": "carol-secret-pw"}
        commands = (["migrate", "--noinput"], ["createsuperuser", "--noinput", "--username", "carol", "--email", ""],
                    ["createtoken", "carol"])  # fmt: skip
        for command in commands:
            made = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=setup, check=True,
                                  capture_output=True, text=True)  # fmt: skip
        with LiveServer(env) as live:
            live.database_url = database_url
            yield live, made.stdout.strip().splitlines()[-1]


async def test_long_upstream_strings_are_cut_to_their_columns_on_postgresql(pg_server):
    live, token = pg_server
    async with Tab(live, await asyncio.to_thread(sign_in, live)) as tab:
        await tab.send(type="send", conversation=None, content=LONG, model=MODELS["infyrence"])
        frames = await tab.until("done")
    assert frames[-1]["status"] == "complete"
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            live.url + "/v1/chat/completions",
            json={"model": MODELS["infyrence"], "messages": [{"role": "user", "content": LONG}], "stream": True},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    output = live.output()
    assert "Traceback" not in output and "value too long" not in output
    with psycopg.connect(live.database_url) as db:
        (finish,) = db.execute("SELECT finish_reason FROM chat_message WHERE role = 'assistant'").fetchone()
        rows = db.execute("SELECT source, status, finish_reason, upstream_id, request_id FROM chat_usage").fetchall()
    assert finish == FINISH[:30]
    assert sorted(row[0] for row in rows) == ["api", "chat"]
    for _, status, finish, upstream_id, request_id in rows:
        assert status == "complete" and finish == FINISH[:30]
        assert len(upstream_id) == len(request_id) == 200 and upstream_id.startswith("chatcmpl_")


@pytest.mark.parametrize(
    ("first_message", "title"),
    [
        ("[[chunks:3]] hello there", "hello there"),
        ("# **Bold** title with `code`", "Bold title with code"),
        ("\n\n> see [the docs](https://x.example) ![chart](c.png)", "see the docs chart"),
        ("snake_case_name and 2*3*4", "snake_case_name and 2*3*4"),
        ("[[delay:5]]\nthe second line", "the second line"),
        ("x" * 80, "x" * 59 + "…"),
    ],
)
def test_a_title_is_the_first_line_as_plain_text(first_message, title):
    assert Conversation.title_for(first_message) == title
