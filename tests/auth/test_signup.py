"""Joining and recovery in this process, read from Django's outbox: the admin's invites, the
command's refusals, open sign-up and its domain list, a reset for an unknown address.

(The browser flows and the SMTP path are in tests/auth/test_invites.py; a Playwright module
leaves its event loop marked as running, so Django's test client cannot share it.)
"""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client

from chat.models import Invite

pytestmark = pytest.mark.django_db(transaction=True)
LINK = re.compile(r"https?://\S+")


def test_an_address_with_an_account_cannot_be_invited(alice):
    alice.email = "alice@example.com"
    alice.save()
    with pytest.raises(CommandError, match="already has an account"):
        invite_command_in_process("ALICE@example.com")


def invite_command_in_process(*arguments: str) -> str:
    out = StringIO()
    call_command("invite", *arguments, stdout=out)
    return out.getvalue()


def test_the_admin_invites_by_e_mail(admin_user):
    research = Group.objects.create(name="research")
    staff = Client()
    staff.force_login(admin_user)
    added = staff.post("/admin/chat/invite/add/", {"email": "erin@example.com", "groups": [research.pk]}, follow=True)
    assert added.status_code == 200
    (sent,) = mail.outbox
    link = LINK.search(sent.body).group(0)
    assert sent.to == ["erin@example.com"] and link in added.content.decode()  # shown to staff once too
    invite = Invite.objects.get(email="erin@example.com")
    assert [g.name for g in invite.groups.all()] == ["research"] and invite.created_by == admin_user
    # "Send a new link": the old one stops working.
    staff.post("/admin/chat/invite/", {"action": "send_again", "_selected_action": [invite.pk]})
    new_link = LINK.search(mail.outbox[1].body).group(0)
    guest = Client()
    assert guest.get(link).status_code == 410 and guest.get(new_link).status_code == 200


def test_a_new_invite_for_an_address_withdraws_the_one_waiting(admin_user, capsys):
    """One link and one set of groups per address: which link the person clicks must not decide their access."""
    research = Group.objects.create(name="research")
    staff = Client()
    staff.force_login(admin_user)
    staff.post("/admin/chat/invite/add/", {"email": "gail@example.com", "groups": [research.pk]})
    first = LINK.search(mail.outbox[0].body).group(0)
    again = staff.post("/admin/chat/invite/add/", {"email": "Gail@example.com"}, follow=True).content.decode()
    assert "The earlier invite for Gail@example.com is withdrawn" in again
    second = LINK.search(mail.outbox[1].body).group(0)
    guest = Client()
    assert guest.get(first).status_code == 410 and guest.get(second).status_code == 200
    third = invite_command_in_process("gail@example.com", "--no-email").strip().splitlines()[-1]
    assert "earlier invite for gail@example.com is withdrawn" in capsys.readouterr().err
    assert guest.get(second).status_code == 410 and guest.get(third).status_code == 200
    # "Send a new link" on the first invite makes it the one waiting again, and the others end.
    oldest = Invite.objects.order_by("created").first()
    staff.post("/admin/chat/invite/", {"action": "send_again", "_selected_action": [oldest.pk]})
    assert (
        guest.get(third).status_code == 410 and guest.get(LINK.search(mail.outbox[-1].body).group(0)).status_code == 200
    )
    assert list(Invite.objects.usable().values_list("pk", flat=True)) == [oldest.pk]


# --- open sign-up ------------------------------------------------------------------------


def test_sign_up_is_closed_by_default(client):
    assert client.get("/accounts/signup/").status_code == 404
    assert "Sign up" not in client.get("/accounts/login/").content.decode()


def test_open_sign_up_limited_to_domains_e_mails_an_invite(client, settings, django_user_model):
    settings.SIGNUP_OPEN = True
    settings.SIGNUP_DOMAINS = ["example.com"]
    assert "Sign up" in client.get("/accounts/login/").content.decode()
    refused = client.post("/accounts/signup/", {"email": "mallory@elsewhere.org"})
    assert "open to addresses at example.com only" in refused.content.decode() and not mail.outbox
    assert client.post("/accounts/signup/", {"email": "fay@example.com"}).status_code == 200
    client.post("/accounts/signup/", {"email": "fay@example.com"})  # asked twice: one e-mail
    (sent,) = mail.outbox
    link = LINK.search(sent.body).group(0)
    joined = client.post(link, {"password1": "fay-picks-a-good-one", "password2": "fay-picks-a-good-one"})
    assert joined.status_code == 302 and joined["Location"] == "/"
    assert django_user_model.objects.get(email="fay@example.com").username == "fay@example.com"


def test_a_reset_for_an_unknown_address_sends_nothing_and_says_the_same(client):
    answered = client.post("/accounts/password/reset/", {"email": "nobody@example.com"}, follow=True)
    assert "Check your e-mail" in answered.content.decode() and not mail.outbox


def test_a_reset_link_goes_to_an_address_once_in_ten_minutes(client, django_user_model):
    """The form is open to anyone: fifteen posts for one address sent fifteen e-mails."""
    django_user_model.objects.create_user("gil", email="gil@example.com", password="gil-secret-pw-1")
    for _ in range(3):
        answered = client.post("/accounts/password/reset/", {"email": "GIL@example.com"}, follow=True)
        assert "Check your e-mail" in answered.content.decode()  # the same answer each time
    assert [message.to for message in mail.outbox] == [["gil@example.com"]]
