"""The admin's streams: live and orphaned told apart, stop and mark interrupted; a read-only, audited message page."""

from datetime import timedelta

import pytest
from django.utils import timezone

from chat.actions import orphans
from chat.models import Conversation, ConversationRead, Message, Usage, Worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="root-pw-123456"))
    return client


@pytest.fixture
def streams(django_user_model, settings):
    """Three streaming replies: one of a live process, one of a dead one, one of no process; and their usage."""
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"  # several processes: alive is a current lease
    settings.CHAT_LEASE_SECONDS = 600  # the live lease stays current however slowly a busy host runs the test
    alice = django_user_model.objects.create_user("alice", password="alice-secret-pw")
    alive = Worker.objects.create(host="a", pid=1, channel="specific.a!x")
    dead = Worker.objects.create(host="b", pid=2, channel="specific.b!x", heartbeat=timezone.now() - timedelta(hours=1))
    conversation = Conversation.objects.create(owner=alice, title="Secret plans")
    rows = {}
    for name, worker in (("live", alive), ("dead", dead), ("none", None)):
        reply = Message.objects.create(conversation=conversation, role="assistant", status="streaming",
                                       content=f"{name} text so far", model="m", worker=worker)  # fmt: skip
        usage = Usage.objects.create(user=alice, message=reply, model="m", status="streaming", worker=worker)
        rows[name] = (reply, usage)
    api = Usage.objects.create(user=alice, source="api", model="m", status="streaming", worker=dead)
    return rows, api


def listed(client, url: str) -> set[int]:
    response = client.get(url)
    assert response.status_code == 200
    return {row.pk for row in response.context["cl"].result_list}


def test_the_stream_filter_tells_live_from_orphaned_streams(staff_client, streams):
    rows, api = streams
    replies = {name: reply.pk for name, (reply, _) in rows.items()}
    usages = {name: usage.pk for name, (_, usage) in rows.items()}
    assert listed(staff_client, "/admin/chat/message/?stream=live") == {replies["live"]}
    assert listed(staff_client, "/admin/chat/message/?stream=orphaned") == {replies["dead"], replies["none"]}
    assert listed(staff_client, "/admin/chat/usage/?stream=live") == {usages["live"]}
    assert listed(staff_client, "/admin/chat/usage/?stream=orphaned") == {usages["dead"], usages["none"], api.pk}


def test_stop_asks_the_streams_process_through_its_row(staff_client, streams):
    rows, _ = streams
    live, usage = rows["live"]
    form = {"action": "stop_streams", "_selected_action": [usage.pk]}
    assert staff_client.post("/admin/chat/usage/", form, follow=True).status_code == 200
    live.refresh_from_db()
    assert live.stop_requested and live.status == "streaming"  # its process stops it and saves its ending


def test_mark_interrupted_ends_orphans_only(staff_client, streams):
    rows, api = streams
    selected = [reply.pk for reply, _ in rows.values()]
    response = staff_client.post("/admin/chat/message/", {"action": "mark_interrupted", "_selected_action": selected},
                                 follow=True)  # fmt: skip
    assert b"1 selected row(s) were live" in response.content
    statuses = {name: Message.objects.get(pk=reply.pk).status for name, (reply, _) in rows.items()}
    assert statuses == {"live": "streaming", "dead": "interrupted", "none": "interrupted"}
    ended = Usage.objects.get(pk=rows["dead"][1].pk)
    assert ended.status == "interrupted" and ended.error == orphans.STAFF_INTERRUPTED and ended.completion_tokens > 0
    staff_client.post("/admin/chat/usage/", {"action": "mark_interrupted", "_selected_action": [api.pk]})
    assert Usage.objects.get(pk=api.pk).status == "interrupted"


def test_the_message_page_is_read_only_and_its_reads_are_recorded(staff_client, streams):
    rows, _ = streams
    reply = rows["dead"][0]
    response = staff_client.get("/admin/chat/message/")
    assert b"dead text so far" not in response.content  # the list shows no text: nothing read unrecorded
    assert not ConversationRead.objects.exists()
    page = staff_client.get(f"/admin/chat/message/{reply.pk}/change/")
    assert page.status_code == 200 and b"dead text so far" in page.content
    read = ConversationRead.objects.get()
    assert (read.conversation_id, read.where, read.reader.username) == (reply.conversation_id, "admin message", "root")
    edit = {"content": "changed"}
    staff_client.post(f"/admin/chat/message/{reply.pk}/change/", edit)
    reply.refresh_from_db()
    assert reply.content == "dead text so far"
    assert staff_client.get("/admin/chat/message/add/").status_code == 403
