"""Failed sign-ins count per account, whichever spelling of its name or e-mail address is typed (issue 35)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import RequestFactory

from chat.auth import signin
from tests.auth.test_accounts import LOCKED, WRONG, sign_in
from tests.live import LiveServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def throttled(django_db_setup, django_db_blocker):
    """Three failures lock, behind a trusted proxy (127.0.0.1) so each sign-in picks its address."""
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "AUTH_LOCKOUT_FAILURES": "3",
        "DJANGO_TRUSTED_PROXIES": "127.0.0.1",
    }
    with LiveServer(env) as server:
        yield server


@pytest.fixture
def dave(django_user_model):
    return django_user_model.objects.create_user("dave", email="Dave@Example.com", password="dave-secret-pw")


def test_every_spelling_counts_under_the_accounts_username(dave, django_user_model):
    django_user_model.objects.create_user("erin@example.com", password="x")  # a username that looks like an e-mail
    for login in ("dave", "DAVE", "dave@example.com", "DAVE@EXAMPLE.COM", "Dave@Example.com"):
        request = RequestFactory().post("/accounts/login/", {"username": login})
        assert signin.lockout_username(request) == "dave"
        assert signin.lockout_username(None, {"username": login}) == "dave"
    assert signin.lockout_username(None, {"username": "erin@example.com"}) == "erin@example.com"
    assert signin.lockout_username(None, {"username": "Nobody@Example.com"}) == "nobody@example.com"
    assert signin.lockout_username(None, {"username": "nobody"}) == "nobody"


async def test_the_e_mail_address_cannot_get_round_a_locked_username(throttled, dave):
    for attempt in range(3):
        await sign_in(throttled.url, "dave", WRONG, address=f"198.51.100.{attempt}")
    locked = await sign_in(throttled.url, "dave@example.com", "dave-secret-pw", address="198.51.100.60")
    assert locked.status_code == 429 and LOCKED in locked.text and not locked.signed_in


async def test_spellings_of_the_e_mail_address_share_one_count(throttled, dave):
    for attempt, login in enumerate(("dave@example.com", "DAVE@EXAMPLE.COM", "Dave@example.COM")):
        await sign_in(throttled.url, login, WRONG, address=f"203.0.113.{attempt}")
    locked = await sign_in(throttled.url, "dave", "dave-secret-pw", address="203.0.113.60")
    assert locked.status_code == 429 and LOCKED in locked.text and not locked.signed_in
