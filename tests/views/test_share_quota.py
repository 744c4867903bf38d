"""Copies from a share link, asked for at once, stay within the reader's storage quota (a real server)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from chat.models import Attachment, Conversation, Message
from tests.live import LiveServer, database_url
from tests.views.test_attachments import browser_client

pytestmark = pytest.mark.django_db(transaction=True)
QUOTA, SIZE = 300_000, 100_000


@pytest.fixture(scope="module")
def small_quota(django_db_setup, django_db_blocker):
    env = {"DATABASE_URL": database_url(connection.settings_dict), "ATTACHMENT_QUOTA_BYTES": str(QUOTA)}
    with LiveServer(env) as server:
        yield server


def test_ten_copies_asked_at_once_stay_within_the_quota(small_quota, alice):
    """Each of ten copies asked together found room for one: 1.1 MB against 300 KB."""
    conversation = Conversation.objects.create(owner=alice, title="With a file")
    question = Message.objects.create(conversation=conversation, role="user", content="Read this")
    Attachment.objects.create(owner=alice, message=question, name="notes.txt", kind="document",
                              content_type="text/plain", size=SIZE, stored_bytes=SIZE, text="x",
                              data=b"x" * SIZE)  # fmt: skip
    conversation.current = question
    conversation.save()
    url = browser_client(small_quota, alice).post(f"/api/conversations/{conversation.pk}/shares", json={}).json()["url"]

    clients = [browser_client(small_quota, alice) for _ in range(10)]
    try:
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda client: client.post(url + "continue").status_code, clients))
    finally:
        for client in clients:
            client.close()
    assert sorted(answers) == [302, 302] + [413] * 8  # room for two copies beside the original
    assert Attachment.objects.filter(owner=alice).count() == 3
