"""Single sign-on (chat/auth/oidc.py) through a real OpenID Connect provider started here (tests/oidc_provider/),
the whole way in Chromium: first sign-in makes the account from the claims, domain limits refuse others,
and AUTH_PASSWORD_LOGIN=0 leaves only the provider's button."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

import httpx
import pytest
from django.db import connection
from playwright.sync_api import expect

from tests.live import ROOT, LiveServer, database_url
from tests.page_helpers import open_chat

pytestmark = pytest.mark.django_db(transaction=True)
expect.set_options(timeout=15_000)
CLIENT_ID, CLIENT_SECRET = "team-chat", "team-chat-client-secret-0123456789"
PEOPLE = [
    "gina.k:gina-idp-pw:gina@corp.example",
    "mallory:mallory-idp-pw:mallory@elsewhere.example",
    "unverified-ivan:ivan-idp-pw:ivan@corp.example",
]


class Provider:
    """The test provider in a subprocess, on a socket bound here (so it is reachable as soon as it starts)."""

    def __init__(self, redirects: list[str]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        port = self.sock.getsockname()[1]
        # "localhost", not 127.0.0.1: a host of its own for the browser's cookies.
        self.issuer = f"http://localhost:{port}/o"
        people = [argument for person in PEOPLE for argument in ("--person", person)]
        self.home = tempfile.mkdtemp(prefix="oidc-provider-")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.oidc_provider", "--fd", str(self.sock.fileno()), "--issuer", self.issuer,
             "--db", f"{self.home}/db.sqlite3",
             "--client", f"{CLIENT_ID}:{CLIENT_SECRET}:{' '.join(redirects)}", *people],
            cwd=ROOT, pass_fds=[self.sock.fileno()], env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        # The socket already listens: this waits in its backlog until the provider answers.
        assert httpx.get(self.issuer + "/.well-known/openid-configuration", timeout=60).status_code == 200

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self.sock.close()
        shutil.rmtree(self.home)


@pytest.fixture(scope="module")
def sso(django_db_setup, django_db_blocker):
    """Chat servers on one provider: as configured, with AUTH_PASSWORD_LOGIN=0, and with OIDC_CREATE_USERS=0."""
    base = {"DATABASE_URL": database_url(connection.settings_dict), "OIDC_CLIENT_ID": CLIENT_ID,
            "OIDC_CLIENT_SECRET": CLIENT_SECRET, "OIDC_NAME": "Test IdP", "OIDC_USERNAME_CLAIM": "preferred_username",
            "OIDC_ALLOWED_DOMAINS": "corp.example"}  # fmt: skip
    servers = (
        LiveServer(base),
        LiveServer({**base, "AUTH_PASSWORD_LOGIN": "0"}),
        LiveServer({**base, "OIDC_CREATE_USERS": "0"}),
    )
    provider = Provider([f"{server.url}/oidc/callback/" for server in servers])
    for server in servers:
        server.env["OIDC_ISSUER"] = provider.issuer
        server.start()
    yield servers
    for server in servers:
        server.stop()
    provider.stop()


@pytest.fixture(scope="module")
def browser(sso):
    from tests.page_helpers import chromium

    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser, sso):
    context = browser.new_context(base_url=sso[0].url)
    yield context.new_page()
    context.close()


def through_the_provider(page, server, username: str, password: str) -> None:
    page.goto(server.url + "/accounts/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.get_by_role("heading", name="Test identity provider")).to_be_visible()
    page.get_by_label("IdP username").fill(username)
    page.get_by_label("IdP password").fill(password)
    page.get_by_role("button", name="Continue").click()


def test_first_sign_in_makes_the_account_from_the_claims_and_the_next_finds_it(sso, page, django_user_model, providers):
    server = sso[0]
    through_the_provider(page, server, "gina.k", "gina-idp-pw")
    open_chat(page)  # signed in, on the chat page
    expect(page.locator(".sidebar-foot .username")).to_have_text("gina.k")  # OIDC_USERNAME_CLAIM's value
    expect(page.get_by_role("link", name="Change password")).to_have_count(0)  # it has none here to change
    gina = django_user_model.objects.get(username="gina.k")
    assert gina.email == "gina@corp.example" and not gina.has_usable_password()
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/$"))
    page.context.clear_cookies()  # signed out of the provider too
    through_the_provider(page, server, "gina.k", "gina-idp-pw")
    open_chat(page)
    assert django_user_model.objects.filter(email="gina@corp.example").count() == 1


@pytest.mark.parametrize(("username", "password"), [("mallory", "mallory-idp-pw"), ("unverified-ivan", "ivan-idp-pw")])
def test_people_outside_the_allowed_domains_are_refused(sso, page, django_user_model, username, password):
    server = sso[0]
    through_the_provider(page, server, username, password)
    expect(page).to_have_url(re.compile(r"/accounts/login/\?sso=failed$"))
    expect(page.get_by_role("alert")).to_contain_text("Signing in with Test IdP did not work")
    assert not django_user_model.objects.filter(username=username).exists()
    page.goto(server.url + "/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))


def test_a_deactivated_account_is_refused_by_single_sign_on_too(sso, page, django_user_model):
    server = sso[0]
    django_user_model.objects.create_user("gina.k", email="gina@corp.example", is_active=False)
    through_the_provider(page, server, "gina.k", "gina-idp-pw")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?sso=failed$"))


def test_the_password_form_shows_beside_the_button_by_default(sso, page, alice, providers):
    server = sso[0]
    page.goto(server.url + "/accounts/login/")
    expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()
    page.get_by_label("Username or e-mail").fill("alice")
    page.get_by_label("Password").fill("alice-secret-pw")
    page.get_by_role("button", name="Sign in", exact=True).click()
    open_chat(page)


def test_auth_password_login_0_hides_the_form_and_refuses_passwords(sso, page, alice, django_user_model, providers):
    sso_only = sso[1]
    page.goto(sso_only.url + "/accounts/login/")
    expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()
    expect(page.get_by_label("Password")).to_have_count(0)
    expect(page.get_by_role("link", name="Forgot your password?")).to_have_count(0)
    # A password posted anyway (a script, an old tab) signs no one in, here or in the admin.
    django_user_model.objects.create_superuser("root", password="root-secret-pw")
    with httpx.Client(base_url=sso_only.url) as client:
        client.get("/admin/login/")  # the admin's form still sets the CSRF cookie; the page's has no form
        for path, login, password in (("/admin/login/", "root", "root-secret-pw"),
                                      ("/accounts/login/", "alice", "alice-secret-pw")):  # fmt: skip
            form = {"username": login, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]}
            assert client.post(path, data=form).status_code == 200  # the form again, not a redirect
            assert "sessionid" not in client.cookies
    # The button still works.
    through_the_provider(page, sso_only, "gina.k", "gina-idp-pw")
    open_chat(page, sso_only.url + "/")


def test_a_providers_namesake_of_a_local_account_is_refused(sso, page, django_user_model):
    """A local account (a password of its own here, as the first admin has) is not taken over by the provider's
    person of the same username, nor its e-mail address (where its password resets go) rewritten."""
    server = sso[0]
    django_user_model.objects.create_superuser("gina.k", email="boss@here.example", password="local-admin-pw")
    through_the_provider(page, server, "gina.k", "gina-idp-pw")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?sso=failed$"))
    assert django_user_model.objects.get(username="gina.k").email == "boss@here.example"


def test_with_oidc_create_users_0_only_accounts_made_beforehand_get_in(sso, page, django_user_model, providers):
    known_only = sso[2]
    through_the_provider(page, known_only, "gina.k", "gina-idp-pw")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?sso=failed$"))
    assert not django_user_model.objects.filter(username="gina.k").exists()
    django_user_model.objects.create_user("gina.k")  # staff made her account (no password)
    page.goto(known_only.url + "/accounts/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()  # still signed in at the provider
    open_chat(page, known_only.url + "/")
    assert django_user_model.objects.get(username="gina.k").email == "gina@corp.example"  # kept up to date
