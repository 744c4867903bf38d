"""What heals a stream the channel layer could not reach: a stop through the database, a turn that never
started, a live process's own orphans (chat/actions/orphans.py, chat/actions/streams.py)."""

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.actions import orphans
from chat.models import Conversation, Message, Usage, Worker
from chat.streaming import generation
from tests.conftest import MODELS

I14 = MODELS["i14"]


async def test_a_stop_asked_through_the_database_stops_the_stream(connect, alice, providers):
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[delay:20]] [[chunks:3000]]", model=I14)
    started = (await ws.until("delta"))[0]
    # What control.send_control does when the channel layer cannot take the stop (Redis away).
    assert await sync_to_async(Message.objects.request_stop)(started["message"])
    done = (await ws.until("done", timeout=30))[-1]
    assert done["status"] == "stopped"
    reply = await Message.objects.aget(pk=started["message"])
    assert reply.status == "stopped" and reply.content


async def test_a_turn_whose_stream_cannot_start_is_failed_with_a_sentence(connect, alice, providers, monkeypatch):
    def broken(job):
        raise RuntimeError("no stream today")

    monkeypatch.setattr(generation, "start", broken)
    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[chunks:3]]", model=I14)
    error = (await ws.until("error"))[-1]
    assert error["code"] == "not_started" and "could not be started" in error["detail"]
    # The watchers are told it ended, as for any ended stream.
    told = (await ws.until("done"))[-1]
    assert (told["status"], told["error"]) == ("failed", orphans.NEVER_STARTED)
    reply = await Message.objects.filter(role="assistant").alatest("pk")
    usage = await Usage.objects.aget(message=reply)
    assert (reply.status, reply.error) == ("failed", orphans.NEVER_STARTED)
    assert usage.status == "failed" and usage.ended is not None
    monkeypatch.undo()
    # The conversation is not blocked by it: the next message is answered.
    await ws.send(type="send", conversation=reply.conversation_id, content="[[chunks:3]]", model=I14)
    assert (await ws.until("done"))[-1]["status"] == "complete"


@pytest.mark.django_db
def test_a_live_process_ends_its_own_replies_that_no_stream_runs(alice):
    worker = Worker.objects.create(host="here", pid=1, channel="specific.here!x")
    conversation = Conversation.objects.create(owner=alice, title="t")
    long_ago = timezone.now() - timedelta(minutes=1)
    never, cut, fresh = (
        Message.objects.create(
            conversation=conversation,
            role="assistant",
            status="streaming",
            content=content,
            model=I14,
            worker=worker,
            updated=updated,
        )
        for content, updated in (("", long_ago), ("some text", long_ago), ("", timezone.now()))
    )
    for message in (never, cut, fresh):
        Usage.objects.create(user=alice, message=message, model=I14, status="streaming", prompt_tokens=7, worker=worker)
    # A reply just stored may not have started yet: only those written more than the grace ago.
    assert sorted(orphans.own_orphans(worker.pk)) == [never.pk, cut.pk]
    ended = orphans.end_own_orphans(worker.pk, [never.pk, cut.pk, fresh.pk])
    assert sorted(message.pk for message in ended) == [never.pk, cut.pk]
    never.refresh_from_db(), cut.refresh_from_db(), fresh.refresh_from_db()
    assert (never.status, never.error) == ("failed", orphans.NEVER_STARTED)
    assert (cut.status, cut.error) == ("interrupted", orphans.LOST_STREAM)
    assert fresh.status == "streaming"
    statuses = dict(Usage.objects.values_list("message_id", "status"))
    assert statuses == {never.pk: "failed", cut.pk: "interrupted", fresh.pk: "streaming"}
    assert Usage.objects.get(message=cut).completion_tokens > 0
