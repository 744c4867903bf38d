"""A share link names its owner only if they chose so, and a deactivated person's links are taken down (issue 35)."""

import pytest
from django.test import Client

from chat.models import Conversation, Message, Share

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(alice):
    alice.first_name, alice.last_name = "Alice", "Liddell"
    alice.save()
    c = Conversation.objects.create(owner=alice, title="Ocean poem")
    c.current = Message.objects.create(conversation=c, role="user", content="Write about the sea")
    c.save()
    return c


def share(owner, conversation, **options) -> dict:
    client = Client()
    client.force_login(owner)
    made = client.post(f"/api/conversations/{conversation.pk}/shares", options, content_type="application/json")
    assert made.status_code == 201
    return made.json()


@pytest.mark.parametrize("live", [False, True])
def test_no_one_is_named_unless_the_owner_chooses(alice, bob, conversation, settings, live):
    settings.CHAT_PUBLIC_SHARES = True
    unnamed = share(alice, conversation, public=True, live=live)
    assert unnamed["show_name"] is False
    teammate = Client()
    teammate.force_login(bob)
    for visitor in (Client(), teammate):
        page = visitor.get(unnamed["url"]).content.decode()
        assert "alice" not in page.lower() and "Liddell" not in page and "Shared by" not in page
        assert ("Live: as it is now" if live else "As it was on") in page
    named = share(alice, conversation, public=True, live=live, show_name=True)
    assert named["show_name"] is True
    assert "Shared by Alice Liddell" in Client().get(named["url"]).content.decode()
    alice.first_name = alice.last_name = ""
    alice.save()
    assert "Shared by alice" in Client().get(named["url"]).content.decode()  # no full name: the username


def test_a_deactivated_persons_links_are_taken_down(alice, bob, conversation, settings):
    settings.CHAT_PUBLIC_SHARES = True
    public = share(alice, conversation, public=True)["url"]
    team = share(alice, conversation)["url"]
    teammate = Client()
    teammate.force_login(bob)
    assert Client().get(public).status_code == 200 and teammate.get(team).status_code == 200
    alice.is_active = False
    alice.save()
    assert Client().get(public).status_code == 404
    assert Client().get(team).status_code == 404  # not a sign-in page that would tell the link exists
    assert teammate.get(public).status_code == 404 and teammate.get(team).status_code == 404
    assert Share.objects.count() == 2  # kept: back up if the account is activated again
    alice.is_active = True
    alice.save()
    assert Client().get(public).status_code == 200
