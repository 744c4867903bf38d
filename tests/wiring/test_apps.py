"""chat/apps.py: what a server process does before it serves, and again once its database is back."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import openai
import psycopg
import pytest
from django.utils import timezone

from chat import apps
from chat.models import Conversation, Message, Provider, Usage
from tests.conftest import FAKE_KEY, MODELS
from tests.live import ROOT, LiveServer, wait_until
from tests.proxy import proxy_for, via
from tests.services import postgres_database


@pytest.fixture
def fresh_process(monkeypatch):
    """chat.apps as in a process that has not yet prepared to serve."""
    monkeypatch.setattr(apps, "_prepared", False)
    monkeypatch.setattr(apps, "_serving_since", None)
    monkeypatch.setattr(apps, "_retrying", None)


@pytest.mark.django_db(transaction=True)
def test_a_late_preparation_takes_only_streams_written_before_the_process_began(fresh_process, alice):
    """A process that booted without its database prepares later: a stream it started meanwhile (before
    its lease was registered, so with no worker) is alive; one a dead process left is not."""
    long_ago = timezone.now() - timedelta(hours=1)
    apps._serving_since = timezone.now() - timedelta(minutes=1)  # when this process began
    conversation = Conversation.objects.create(owner=alice, title="t")
    left = Message.objects.create(conversation=conversation, role="assistant", status="streaming", content="half")
    Message.objects.filter(pk=left.pk).update(updated=long_ago)
    mine = Message.objects.create(conversation=conversation, role="assistant", status="streaming", content="going")
    Usage.objects.create(user=alice, message=left, model="m", status="streaming", prompt_tokens=5)
    Usage.objects.create(user=alice, message=mine, model="m", status="streaming", prompt_tokens=5)
    left_api = Usage.objects.create(user=alice, model="m", status="streaming", prompt_tokens=5, started=long_ago)
    mine_api = Usage.objects.create(user=alice, model="m", status="streaming", prompt_tokens=5)

    assert apps.prepare_to_serve() and apps._prepared
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert statuses == {left.pk: "interrupted", mine.pk: "streaming"}
    assert Usage.objects.get(pk=left_api.pk).status == "interrupted"
    assert Usage.objects.get(pk=mine_api.pk).status == "streaming"
    assert Usage.objects.get(message=mine).status == "streaming"
    assert Provider.objects.filter(enabled=True).exists()  # the configured (here the demo) provider


def manage(database_url: str, *command: str) -> str:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SUPERUSER_PASSWORD": "carol-secret-pw"}
    done = subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True)
    return done.stdout.decode()


ORPHAN = (
    "from django.contrib.auth.models import User; from chat.models import Conversation, Message\n"
    "c = Conversation.objects.create(owner=User.objects.get(username='carol'), title='t')\n"
    "print(Message.objects.create(conversation=c, role='assistant', status='streaming', content='half').pk)"
)


@pytest.mark.cluster
def test_a_server_booted_without_its_database_creates_its_provider_once_the_database_is_back(fake_server):
    """A new install whose PostgreSQL came up after the server: the provider of UPSTREAM_* is created and a
    dead process's stream recovered without a restart (before, /v1 said "No upstream provider is enabled")."""
    with postgres_database("chat_boot") as database_url:
        manage(database_url, "migrate", "--noinput")
        manage(database_url, "createsuperuser", "--noinput", "--username", "carol", "--email", "")
        token = manage(database_url, "createtoken", "carol").strip().splitlines()[-1]
        orphan = int(manage(database_url, "shell", "-c", ORPHAN).split()[-1])
        proxy = proxy_for(database_url)
        env = {
            "DATABASE_URL": via(proxy, database_url),
            "UPSTREAM_BASE_URL": fake_server.base_url("i14"),
            "UPSTREAM_API_KEY": FAKE_KEY,
            "UPSTREAM_NAME": "i14",
            "UPSTREAM_MODEL": MODELS["i14"],
        }
        proxy.cut()
        try:
            with LiveServer(env) as server:
                assert wait_until(lambda: "database not ready" in server.output()), server.output()
                proxy.restore()
                assert wait_until(lambda: "database ready:" in server.output(), timeout=30), server.output()
                api = openai.OpenAI(base_url=server.url + "/v1", api_key=token, max_retries=0, timeout=30)
                stream = api.chat.completions.create(
                    model=MODELS["i14"], stream=True, messages=[{"role": "user", "content": "hi [[chunks:3]]"}]
                )
                answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
                output = server.output()
        finally:
            proxy.close()
        with psycopg.connect(database_url) as db:
            status = db.execute("SELECT status FROM chat_message WHERE id = %s", [orphan]).fetchone()[0]
            usage = db.execute("SELECT status FROM chat_usage WHERE message_id IS NULL").fetchall()
    assert answer
    assert status == "interrupted"
    assert usage == [("complete",)]
    assert "marked 1 stream(s) left by a stopped server as interrupted" in output


def test_the_features_hand_the_runtime_their_loops_and_handlers():
    """The runtime imports no feature: ChatConfig.ready() is where each one registers what it runs."""
    from chat.actions import orphans, streams, titles, tool_servers
    from chat.auth import session_sockets
    from chat.runtime import control, process_loops
    from chat.streaming import generation

    loops = {name: (loop.start, loop.needs_redis) for name, loop in process_loops._loops.items()}
    assert loops == {
        "control-listener": (control.listen_forever, False),
        "account-watch": (session_sockets.watch_accounts_forever, False),
        "api-checkpoints": (streams.checkpoint_api_streams_forever, False),
        "orphan-sweeper": (orphans.sweep_forever, True),
        "own-orphan-sweeper": (orphans.sweep_own_forever, False),
        "stops-from-database": (streams.stops_from_database_forever, False),
        "mcp-refresh": (tool_servers.refresh_forever, False),
    }
    from chat import apps

    handlers = control.handlers
    assert (handlers.deliver, handlers.recover, handlers.end_user, handlers.end_token) == (
        streams.deliver,
        orphans.recover_one,
        apps.end_user,  # the person's cached API tokens forgotten, then streams.end_local_user
        apps.end_token,
    )
    assert generation.after_complete is titles.after_answer
