"""Organising (chat/views/sidebar.py): the sidebar's cursor pages, pin, archive, folders, delete all; own data only."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from chat.models import Conversation, Folder, Message, Usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


def patch(client, url, body):
    return client.patch(url, json.dumps(body), content_type="application/json")


def post(client, url, body):
    return client.post(url, json.dumps(body), content_type="application/json")


def titles(rows):
    return [row["title"] for row in rows]


def make(user, count, start=None):
    """`count` conversations, "c0" the newest, one minute apart (their `updated` set, as bulk_create keeps it)."""
    start = start or timezone.now()
    return Conversation.objects.bulk_create(
        Conversation(owner=user, title=f"c{i}", updated=start - timedelta(minutes=i)) for i in range(count)
    )


def test_pages_follow_the_cursor_to_the_oldest_without_repeats_or_a_cap(alice_client, alice, bob):
    make(alice, 620)
    make(bob, 5)
    # Two rows with the same `updated`: the id breaks the tie, so a page boundary between them loses neither.
    tie = timezone.now() - timedelta(days=30)
    Conversation.objects.bulk_create([Conversation(owner=alice, title=t, updated=tie) for t in ("tie-a", "tie-b")])
    seen, cursor, pages = [], None, 0
    while True:
        data = alice_client.get("/api/conversations", {"limit": 200, **({"cursor": cursor} if cursor else {})}).json()
        seen += titles(data["conversations"])
        pages += 1
        cursor = data["next"]
        if cursor is None:
            break
    assert pages == 4 and len(seen) == 622 == len(set(seen))  # no 500 cap, nothing twice
    assert seen[0] == "c0" and seen[619] == "c619" and set(seen[620:]) == {"tie-a", "tie-b"}
    assert alice_client.get("/api/conversations").json()["conversations"].__len__() == 50  # the default page
    assert alice_client.get("/api/conversations", {"cursor": "nonsense"}).status_code == 400


def test_pin_archive_and_folder_move_a_conversation_between_the_lists(alice_client, alice):
    plain, pinned, archived, filed = make(alice, 4)
    folder = Folder.objects.create(owner=alice, name="Work")
    assert patch(alice_client, f"/api/conversations/{pinned.pk}", {"pinned": True}).json()["pinned"] is True
    assert patch(alice_client, f"/api/conversations/{archived.pk}", {"archived": True}).json()["archived"] is True
    assert patch(alice_client, f"/api/conversations/{filed.pk}", {"folder": folder.pk}).json()["folder"] == folder.pk
    first = alice_client.get("/api/conversations").json()
    assert titles(first["conversations"]) == ["c0"]
    assert titles(first["pinned"]) == ["c1"]
    assert first["folders"] == [{"id": folder.pk, "name": "Work", "count": 1}]
    assert titles(alice_client.get("/api/conversations", {"folder": folder.pk}).json()["conversations"]) == ["c3"]
    assert titles(alice_client.get("/api/conversations", {"archived": 1}).json()["conversations"]) == ["c2"]
    # Search finds all of them, the archived one too, and says which it is.
    found = alice_client.get("/api/conversations", {"q": "c"}).json()["conversations"]
    assert titles(found) == ["c0", "c1", "c2", "c3"] and found[2]["archived"] is True
    # Organising is not an update: the list's order (by last message) stays.
    pinned.refresh_from_db()
    assert pinned.updated == plain.updated - timedelta(minutes=1)
    # Restore, unpin, and back out of the folder.
    patch(alice_client, f"/api/conversations/{archived.pk}", {"archived": False})
    patch(alice_client, f"/api/conversations/{pinned.pk}", {"pinned": False})
    patch(alice_client, f"/api/conversations/{filed.pk}", {"folder": None})
    assert titles(alice_client.get("/api/conversations").json()["conversations"]) == ["c0", "c1", "c2", "c3"]
    assert patch(alice_client, f"/api/conversations/{plain.pk}", {"pinned": "yes"}).status_code == 400


def test_folders_are_created_renamed_and_deleted_keeping_their_conversations(alice_client, alice):
    (chat,) = make(alice, 1)
    response = post(alice_client, "/api/folders", {"name": "  Trips  "})
    assert response.status_code == 201
    folder = response.json()
    assert folder["name"] == "Trips" and folder["count"] == 0
    assert post(alice_client, "/api/folders", {"name": " "}).status_code == 400
    patch(alice_client, f"/api/conversations/{chat.pk}", {"folder": folder["id"]})
    renamed = patch(alice_client, f"/api/folders/{folder['id']}", {"name": "Holidays"}).json()
    assert renamed == {"id": folder["id"], "name": "Holidays", "count": 1}
    assert alice_client.get("/api/folders").json()["folders"] == [renamed]
    assert alice_client.delete(f"/api/folders/{folder['id']}").status_code == 204
    chat.refresh_from_db()
    assert chat.folder is None
    assert titles(alice_client.get("/api/conversations").json()["conversations"]) == ["c0"]


def test_another_persons_folder_is_not_found(alice_client, alice, bob):
    (chat,) = make(alice, 1)
    (theirs,) = make(bob, 1)
    foreign = Folder.objects.create(owner=bob, name="Bob's")
    Conversation.objects.filter(pk=theirs.pk).update(folder=foreign)
    assert patch(alice_client, f"/api/conversations/{chat.pk}", {"folder": foreign.pk}).status_code == 404
    assert alice_client.get("/api/conversations", {"folder": foreign.pk}).status_code == 404
    assert patch(alice_client, f"/api/folders/{foreign.pk}", {"name": "mine"}).status_code == 404
    assert alice_client.delete(f"/api/folders/{foreign.pk}").status_code == 404
    assert patch(alice_client, f"/api/conversations/{theirs.pk}", {"pinned": True}).status_code == 404
    assert alice_client.get("/api/folders").json()["folders"] == []
    assert Folder.objects.filter(pk=foreign.pk, name="Bob's").exists()
    chat.refresh_from_db()
    assert chat.folder is None


def test_folder_api_needs_a_signed_in_user_and_csrf(client, alice):
    assert client.get("/api/folders").status_code == 401
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert post(strict, "/api/folders", {"name": "x"}).status_code == 403
    assert not Folder.objects.exists()


def test_delete_all_needs_the_confirmation_and_keeps_usage_rows(alice_client, alice, bob):
    mine = Conversation.objects.create(owner=alice, title="mine")
    reply = Message.objects.create(conversation=mine, role="assistant", content="answer")
    usage = Usage.objects.create(user=alice, message=reply, model="m", status="complete", prompt_tokens=1)
    make(alice, 2)
    (theirs,) = make(bob, 1)
    page = alice_client.get("/settings/")
    assert b"You have 3 conversations." in page.content
    response = alice_client.post("/settings/delete-conversations/")  # the box not ticked
    assert response.status_code == 302 and Conversation.objects.filter(owner=alice).count() == 3
    assert b"Tick the box to confirm" in alice_client.get("/settings/").content
    response = alice_client.post("/settings/delete-conversations/", {"confirm": "yes"})
    assert response.status_code == 302
    assert not Conversation.objects.filter(owner=alice).exists()
    assert Conversation.objects.filter(pk=theirs.pk).exists()  # bob's are bob's
    usage.refresh_from_db()
    assert usage.message is None  # the usage row stays, unlinked
    assert b"3 conversations deleted" in alice_client.get("/settings/").content
    assert alice_client.get("/settings/delete-conversations/").status_code == 405


def test_the_shortcuts_name_the_keys_as_the_persons_keyboard_does(alice_client):
    page = alice_client.get("/settings/", headers={"Accept-Language": "fr"}).content.decode()
    assert "<kbd>Maj</kbd> + <kbd>Entrée</kbd>" in page and "<kbd>Échap</kbd>" in page
    assert "<kbd>Shift</kbd>" not in page and "<kbd>Enter</kbd>" not in page


def test_delete_all_refuses_a_post_without_csrf(alice):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    make(alice, 1)
    assert strict.post("/settings/delete-conversations/", {"confirm": "yes"}).status_code == 403
    assert Conversation.objects.filter(owner=alice).count() == 1


@pytest.mark.django_db(transaction=True)
async def test_delete_all_stops_an_answer_still_streaming(connect, alice, providers, fake):
    """The stream is stopped, not refused: its upstream request is closed and its usage row kept, unlinked."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.test import Client

    from chat.streaming import generation
    from tests.conftest import MODELS

    _, _, ws = await connect(alice)
    await ws.send(type="send", conversation=None, content="[[delay:20]] [[chunks:400]] long", model=MODELS["i14"])
    frames = await ws.until("delta")
    message_id = frames[-1]["message"]

    def delete_all():
        client = Client()
        client.force_login(alice)
        return client.post("/settings/delete-conversations/", {"confirm": "yes"})

    assert (await sync_to_async(delete_all)()).status_code == 302
    assert not await Conversation.objects.filter(owner=alice).aexists()
    assert await asyncio.to_thread(fake.app.last().disconnected.wait, 5.0), "the upstream request went on"
    async with asyncio.timeout(10):
        await generation.wait_all()
    usage = await Usage.objects.aget(user=alice)
    assert usage.message_id is None and usage.status != "streaming" and message_id
