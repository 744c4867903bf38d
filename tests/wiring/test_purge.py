"""Retention: `manage.py purge` deletes conversations untouched for N days and keeps their usage rows."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from chat.models import Conversation, Message, StoredResponse, Usage

pytestmark = pytest.mark.django_db


def purge(*args) -> str:
    out = StringIO()
    call_command("purge", *args, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


@pytest.fixture
def old_and_new(alice):
    long_ago = timezone.now() - timedelta(days=40)
    old = Conversation.objects.create(owner=alice, title="old")
    reply = Message.objects.create(conversation=old, role="assistant", content="kept in usage only")
    Usage.objects.create(user=alice, message=reply, model="m", status="complete", prompt_tokens=1, completion_tokens=2)
    live = Conversation.objects.create(owner=alice, title="old but streaming")
    Message.objects.create(conversation=live, role="assistant", status="streaming")
    new = Conversation.objects.create(owner=alice, title="new")
    Conversation.objects.filter(pk__in=[old.pk, live.pk]).update(updated=long_ago)
    for name in ("resp_old", "resp_new"):
        StoredResponse.objects.create(id=name, owner=alice, model="m", status="completed")
    StoredResponse.objects.filter(pk="resp_old").update(created=long_ago)
    return old, live, new


def test_dry_run_counts_and_deletes_nothing(old_and_new):
    assert purge("--days", "30", "--dry-run") == (
        "Would delete 1 conversation(s) untouched for 30 days and 1 stored API response(s) as old (dry run)."
    )
    assert Conversation.objects.count() == 3 and StoredResponse.objects.count() == 2


def test_purge_deletes_old_conversations_and_keeps_their_usage(old_and_new):

    assert purge("--days", "30").startswith("Deleted 1 conversation(s) untouched for 30 days and 1 stored API")
    assert set(Conversation.objects.values_list("title", flat=True)) == {"old but streaming", "new"}
    assert list(StoredResponse.objects.values_list("pk", flat=True)) == ["resp_new"]  # /v1/responses' too
    usage = Usage.objects.get()
    assert usage.message is None and usage.completion_tokens == 2


def test_retention_is_off_by_default(old_and_new, settings):
    settings.CHAT_RETENTION_DAYS = 0
    assert purge().startswith("Retention is off")
    settings.CHAT_RETENTION_DAYS = 30
    assert purge().startswith("Deleted 1")
    assert Conversation.objects.count() == 2
