"""A backup restored, as docs/deploy.md and docs/operations.md say to: the server serves the data from the copy.

A database with a conversation, an attachment and usage is backed up (SQLite's online
backup while a server runs on it; `pg_dump --format=custom`), restored into a new
database (a new file; `pg_restore` into an empty database), and a server started on the
restored one serves the conversation, the attachment's bytes and the usage.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import httpx
import pytest

from tests.conftest import FAKE_KEY
from tests.live import ROOT, LiveServer
from tests.services import postgres_database
from tests.sites import Site, make_site

# The data, written through the ORM in the site's own process (as the server would have stored it).
FILL = """
import json
from decimal import Decimal
import django
django.setup()
from django.contrib.auth import get_user_model
from django.utils import timezone
from chat.models import Attachment, Conversation, Message, Provider, Usage
carol = get_user_model().objects.get(username="carol")
provider = Provider.objects.get(name="infyrence")
conversation = Conversation.objects.create(owner=carol, title="Backed up", model="infyrence/claude-sonnet-5")
question = Message.objects.create(conversation=conversation, role="user", content="What is kept?")
answer = Message.objects.create(conversation=conversation, role="assistant", content="Everything, restored.",
                                parent=question, model="claude-sonnet-5", status="complete")
conversation.current = answer
conversation.save(update_fields=["current"])
data = b"notes kept in the attachment"
attachment = Attachment.objects.create(owner=carol, message=question, name="notes.txt", kind="document",
                                       content_type="text/plain", size=len(data), stored_bytes=len(data),
                                       text=data.decode(), data=data)
now = timezone.now()
Usage.objects.create(user=carol, provider=provider, message=answer, source="chat", model="claude-sonnet-5",
                     status="complete", prompt_tokens=1234, completion_tokens=567, total_tokens=1801,
                     cost=Decimal("0.0123"), started=now, ended=now)
print(json.dumps({"conversation": conversation.pk, "attachment": attachment.pk}))
"""


def fill(database_url: str) -> dict:
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "chatsite.settings",
           "ATTACHMENT_STORAGE": "database"}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", FILL], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def assert_served(database_url: str, site: Site, made: dict) -> None:
    """A server on the restored database serves the conversation, the attachment and the usage."""
    with LiveServer({"DATABASE_URL": database_url, "ATTACHMENT_STORAGE": "database"}) as server:
        cookies = {"sessionid": site.session}  # sessions are rows too: the sign-in survives
        with httpx.Client(base_url=server.url, cookies=cookies, timeout=30) as client:
            listing = client.get("/api/conversations")
            assert listing.status_code == 200, listing.text
            assert "Backed up" in listing.text
            conversation = client.get(f"/api/conversations/{made['conversation']}")
            assert conversation.status_code == 200
            assert "Everything, restored." in conversation.text and "notes.txt" in conversation.text
            attachment = client.get(f"/api/attachments/{made['attachment']}")
            assert attachment.content == b"notes kept in the attachment"
            usage = client.get("/usage/csv")
            assert usage.status_code == 200 and "1234" in usage.text and "567" in usage.text, usage.text
        assert httpx.get(server.url + "/readyz").json()["checks"]["database"]["ok"]


@pytest.mark.timeout(300)  # a site migrated, two servers started
def test_a_sqlite_online_backup_restores_into_a_new_file_that_serves(fake_server, tmp_path):
    site = make_site(str(tmp_path / "live.sqlite3"), fake_server.base_url("infyrence"), FAKE_KEY)
    made = fill(site.database_url)
    backup = tmp_path / "backup.sqlite3"
    # While a server runs on the live file (WAL mode), as docs/deploy.md's backup does.
    with LiveServer({"DATABASE_URL": site.database_url}):
        with sqlite3.connect(site.path) as source, sqlite3.connect(backup) as target:
            source.backup(target)
    restored = tmp_path / "restored.sqlite3"
    restored.write_bytes(backup.read_bytes())
    assert_served(f"sqlite:///{restored}", site, made)


@pytest.mark.cluster
@pytest.mark.timeout(300)  # two PostgreSQL databases, one migrated, a server started
def test_a_pg_dump_restores_into_a_new_database_that_serves(fake_server):
    source, restored = postgres_database("backup_source", migrated=True), postgres_database("backup_restored")
    with source as source_url, restored as restored_url:
        site = make_site("", fake_server.base_url("infyrence"), FAKE_KEY, database_url=source_url)
        made = fill(source_url)
        dump = subprocess.run(["pg_dump", "--format=custom", "--dbname", source_url], capture_output=True, check=True)
        restored = subprocess.run(
            ["pg_restore", "--no-owner", "--dbname", restored_url], input=dump.stdout, capture_output=True
        )
        assert restored.returncode == 0, restored.stderr.decode()
        assert_served(restored_url, site, made)
