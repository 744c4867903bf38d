"""Joining and recovery (chat/auth/invites.py): invite links, open sign-up, password reset, and their e-mails.

The server here sends its e-mail over SMTP to a real local SMTP server (aiosmtpd) that
the tests read; code run in the test process uses Django's outbox.
"""

from __future__ import annotations

import email
import queue
import re
import socket
import subprocess
import sys
from datetime import timedelta

import httpx
import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Invite
from tests.live import ROOT, LiveServer, database_url
from tests.page_helpers import open_chat

pytestmark = pytest.mark.django_db(transaction=True)
expect.set_options(timeout=15_000)
LINK = re.compile(r"https?://\S+")


class Sink:
    """aiosmtpd's handler: every message it is given, in a queue."""

    def __init__(self) -> None:
        self.messages: queue.Queue[email.message.Message] = queue.Queue()

    async def handle_DATA(self, server, session, envelope) -> str:
        message = email.message_from_bytes(envelope.content)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        self.messages.put(message)
        return "250 Message accepted"

    def next(self, timeout: float = 15) -> email.message.Message:
        return self.messages.get(timeout=timeout)


def body(message) -> str:
    return message.get_payload(decode=True).decode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def smtp():
    """A real SMTP server on this machine; the messages it was given are read from it."""
    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=free_port())
    controller.start()
    sink.url = f"smtp://127.0.0.1:{controller.port}"
    yield sink
    controller.stop()


@pytest.fixture(scope="module")
def mailing(django_db_setup, django_db_blocker, smtp):
    """The real server, sending its e-mail over SMTP to the sink; SITE_URL is its own address."""
    server = LiveServer({"DATABASE_URL": database_url(connection.settings_dict), "EMAIL_URL": smtp.url})
    server.env["SITE_URL"] = server.url
    with server:
        yield server


@pytest.fixture(scope="module")
def browser(mailing):
    """Debian's Chromium (never a downloaded one); Django's ORM told it is safe beside Playwright's loop."""
    from tests.page_helpers import chromium

    with chromium() as browser:
        yield browser


@pytest.fixture
def new_page(browser, mailing):
    contexts = []

    def make():
        context = browser.new_context(base_url=mailing.url)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()


def sign_in_through_the_form(page, login: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.get_by_label("Username or e-mail").fill(login)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def invite_command(server, *arguments: str) -> str:
    """`manage.py invite …` as staff would run it, on the server's database and e-mail; its output."""
    env = {**server.env, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "manage.py", "invite", *arguments], cwd=ROOT, env=env,
                          check=True, capture_output=True, timeout=60)  # fmt: skip
    return done.stdout.decode()


# --- invites ------------------------------------------------------------------------------


def test_an_invite_from_the_command_is_e_mailed_used_once_in_the_browser_then_refused(
    mailing, smtp, new_page, django_user_model, providers
):
    Group.objects.create(name="research")
    printed = invite_command(mailing, "dana@example.com", "--staff", "--group", "research")
    link = printed.strip().splitlines()[-1]
    assert link.startswith(f"{mailing.url}/accounts/invite/")
    sent = smtp.next()
    assert sent["X-Envelope-To"] == "dana@example.com" and link in body(sent)

    page = new_page()
    page.goto(link)
    expect(page.get_by_text("dana@example.com")).to_be_visible()
    page.get_by_label("Password", exact=True).fill("short")
    page.get_by_label("Password again").fill("short")
    page.get_by_role("button", name="Create my account").click()
    expect(page.locator(".field-error").first).to_contain_text("too short")  # Django's password rules
    page.get_by_label("Password", exact=True).fill("dana-chooses-this-1")
    page.get_by_label("Password again").fill("dana-chooses-this-1")
    page.get_by_role("button", name="Create my account").click()
    open_chat(page)  # signed in, on the chat page
    dana = django_user_model.objects.get(email="dana@example.com")
    assert dana.username == "dana@example.com" and dana.is_staff and not dana.is_superuser
    assert [group.name for group in dana.groups.all()] == ["research"]

    # Signed out, she signs in with her e-mail and that password.
    page.get_by_role("button", name="Sign out").click()
    sign_in_through_the_form(page, "dana@example.com", "dana-chooses-this-1")
    open_chat(page)
    # The link was for one use.
    reused = page.goto(link)
    assert reused.status == 410
    expect(page.get_by_role("alert")).to_contain_text("expired or was already used")
    assert django_user_model.objects.filter(email="dana@example.com").count() == 1


def test_an_expired_invite_is_refused_and_makes_no_account(mailing, django_user_model):
    invite, secret = Invite.issue("late@example.com")
    assert timedelta(days=6, hours=23) < invite.expires - timezone.now() <= timedelta(days=7)  # INVITE_DAYS
    Invite.objects.filter(pk=invite.pk).update(expires=timezone.now() - timedelta(seconds=1))
    with httpx.Client(base_url=mailing.url) as browser:
        assert browser.get(f"/accounts/invite/{secret}/").status_code == 410
        form = {"password1": "late-but-keen-77", "password2": "late-but-keen-77"}
        assert browser.post(f"/accounts/invite/{secret}/", data=form).status_code in (403, 410)  # no CSRF, no use
    assert not django_user_model.objects.filter(email="late@example.com").exists()


@pytest.mark.django_db
def test_the_invite_command_refuses_what_is_not_an_address():
    """The admin's form checked the address; `manage.py invite not-an-email` made an account named so."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="not-an-email is not an e-mail address"):
        call_command("invite", "not-an-email", "--no-email")
    assert not Invite.objects.exists()


# --- password reset ---------------------------------------------------------------------


def test_forgot_password_by_e_mail_over_smtp_end_to_end(mailing, smtp, new_page, alice, providers):
    alice.email = "alice@example.com"
    alice.save()
    page = new_page()
    page.goto("/accounts/login/")
    page.get_by_role("link", name="Forgot your password?").click()
    page.get_by_label("E-mail address").fill("alice@example.com")
    page.get_by_role("button", name="Send me a link").click()
    expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()
    sent = smtp.next()
    assert sent["X-Envelope-To"] == "alice@example.com"
    link = LINK.search(body(sent)).group(0)
    assert link.startswith(mailing.url + "/accounts/password/reset/")
    page.goto(link)
    page.get_by_label("New password", exact=True).fill("alice-new-secret-44")
    page.get_by_label("New password confirmation").fill("alice-new-secret-44")
    page.get_by_role("button", name="Set my password").click()
    expect(page.get_by_role("heading", name="Your password is set")).to_be_visible()
    sign_in_through_the_form(page, "alice", "alice-secret-pw")
    expect(page.get_by_role("alert")).to_be_visible()  # the old password no longer works
    sign_in_through_the_form(page, "alice@example.com", "alice-new-secret-44")
    open_chat(page)
    page.goto(link)  # the link was for one use
    expect(page.get_by_role("heading", name="This link cannot be used")).to_be_visible()
