"""LDAP sign-in (django-auth-ldap, LDAP_* settings) against a real OpenLDAP server: Debian's slapd,
started here with its own data directory and port, removed afterwards (tests/prepare.sh installs it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.live import LiveServer, database_url

pytestmark = pytest.mark.django_db(transaction=True)

SUFFIX = "dc=example,dc=org"
ADMIN, ADMIN_PASSWORD = f"cn=admin,{SUFFIX}", "ldap-admin-secret"
CONFIG = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {dir}/slapd.pid
database mdb
suffix "{suffix}"
rootdn "{admin}"
rootpw {admin_password}
directory {dir}/data
"""
PEOPLE = f"""\
dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
dc: example
o: Example

dn: ou=people,{SUFFIX}
objectClass: organizationalUnit
ou: people

dn: uid=lena,ou=people,{SUFFIX}
objectClass: inetOrgPerson
uid: lena
cn: Lena Berg
givenName: Lena
sn: Berg
mail: lena@example.org
userPassword: lena-directory-pw

dn: uid=alice,ou=people,{SUFFIX}
objectClass: inetOrgPerson
uid: alice
cn: Alice Namesake
sn: Namesake
mail: someone@example.org
userPassword: alice-directory-pw
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def directory():
    """slapd on 127.0.0.1:<free port> with one person; its data directory is deleted afterwards."""
    home = Path(tempfile.mkdtemp(prefix="slapd-"))
    (home / "data").mkdir()
    config = home / "slapd.conf"
    config.write_text(CONFIG.format(dir=home, suffix=SUFFIX, admin=ADMIN, admin_password=ADMIN_PASSWORD))
    (home / "people.ldif").write_text(PEOPLE)
    subprocess.run(["slapadd", "-f", config, "-l", home / "people.ldif"], check=True, capture_output=True)
    url = f"ldap://127.0.0.1:{free_port()}/"
    # -d 0: in the foreground, so it is this process's child and stops with it.
    slapd = subprocess.Popen(["slapd", "-f", config, "-h", url, "-d", "0"], stderr=subprocess.PIPE)
    try:
        for _ in range(100):  # slapd cannot be handed a listening socket: ask until it answers
            answered = subprocess.run(["ldapwhoami", "-x", "-H", url, "-D", ADMIN, "-w", ADMIN_PASSWORD],
                                      capture_output=True)  # fmt: skip
            if answered.returncode == 0:
                break
            assert slapd.poll() is None, slapd.stderr.read().decode()
            time.sleep(0.1)
        else:
            pytest.fail("slapd did not answer")
        yield url
    finally:
        slapd.terminate()
        slapd.wait(10)
        shutil.rmtree(home)


@pytest.fixture(scope="module")
def ldap_server(django_db_setup, django_db_blocker, directory):
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "LDAP_SERVER_URI": directory,
        "LDAP_BIND_DN": ADMIN,
        "LDAP_BIND_PASSWORD": ADMIN_PASSWORD,
        "LDAP_USER_BASE": f"ou=people,{SUFFIX}",
    }
    with LiveServer(env) as server:
        yield server


def sign_in(server, username: str, password: str) -> httpx.Response:
    """The sign-in form, posted as a browser would."""
    with httpx.Client(base_url=server.url) as browser:
        browser.get("/accounts/login/")
        form = {"username": username, "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]}
        return browser.post("/accounts/login/", data=form)


def test_a_directory_account_signs_in_and_gets_an_account_from_its_entry(ldap_server, django_user_model):
    assert sign_in(ldap_server, "lena", "not-her-password").status_code == 200  # the form again
    assert not django_user_model.objects.filter(username="lena").exists()
    signed_in = sign_in(ldap_server, "lena", "lena-directory-pw")
    assert signed_in.status_code == 302 and signed_in.headers["location"] == "/"
    lena = django_user_model.objects.get(username="lena")
    assert (lena.email, lena.first_name, lena.last_name) == ("lena@example.org", "Lena", "Berg")
    assert not lena.has_usable_password()  # her password stays in the directory


def test_local_passwords_still_sign_in_beside_the_directory(ldap_server, alice):
    assert sign_in(ldap_server, "alice", "alice-secret-pw").status_code == 302


def test_a_directory_namesake_of_a_local_account_is_refused(ldap_server, alice, django_user_model):
    """FreeIPA makes `uid=admin`: a directory entry must not sign in as the local account of its name, nor rewrite
    its e-mail address, where its password resets go."""
    email = alice.email
    assert sign_in(ldap_server, "alice", "alice-directory-pw").status_code == 200  # the form again
    alice.refresh_from_db()
    assert (alice.email, alice.last_name) == (email, "")
    assert sign_in(ldap_server, "alice", "alice-secret-pw").status_code == 302  # her own password still works


def test_a_directory_account_signs_in_by_its_email_address_too(ldap_server, django_user_model):
    assert sign_in(ldap_server, "lena", "lena-directory-pw").status_code == 302  # the account is made
    signed_in = sign_in(ldap_server, "Lena@Example.org", "lena-directory-pw")
    assert signed_in.status_code == 302 and signed_in.headers["location"] == "/"
    assert django_user_model.objects.filter(username="lena").count() == 1
