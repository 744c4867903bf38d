"""Deleting a long conversation (chat/actions/deletes.py): CHAT_BATCH_ROWS messages to a transaction, all of them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat.actions import imports
from chat.models import Conversation, Message
from tests.heavy_requests import chain_file

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_long_conversation_is_deleted_a_batch_at_a_time_and_entirely(alice, bob, settings):
    settings.CHAT_BATCH_ROWS = 40
    (long,) = imports.import_now(alice, chain_file(130))
    (other,) = imports.import_now(bob, chain_file(3))
    client = Client()
    client.force_login(alice)
    with CaptureQueriesContext(connection) as queries:
        assert client.delete(f"/api/conversations/{long.pk}").status_code == 204
    deletes = [q["sql"] for q in queries if q["sql"].startswith('DELETE FROM "chat_message"')]
    # Newest first, 40 to a statement (each its own transaction): never the 130 at once.
    assert [sql.split(" IN (")[1].count(",") + 1 for sql in deletes] == [40, 40, 40, 10]
    assert not Conversation.objects.filter(pk=long.pk).exists()
    assert not Message.objects.filter(conversation_id=long.pk).exists()
    assert Message.objects.filter(conversation=other).count() == 3  # someone else's stay
