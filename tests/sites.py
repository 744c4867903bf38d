"""A server's own SQLite database, for tests that need a database no other server or test shares."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass

from tests.live import ROOT
from tests.services import migrated_sqlite

SETUP = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from chat.models import ApiToken, Provider
user = get_user_model().objects.create_user("carol", password="carol-secret-pw")
token, secret = ApiToken.issue(user, "script")
client = Client()
client.force_login(user)  # a session exactly as signing in makes one
Provider.objects.create(name="infyrence", base_url=sys.argv[1], api_key=sys.argv[2])
print(json.dumps({"secret": secret, "session": client.cookies[settings.SESSION_COOKIE_NAME].value}))
"""


@dataclass
class Site:
    """A SQLite file with one user (a signed-in session and an API token) and one provider."""

    path: str
    secret: str
    session: str
    url: str = ""  # of the server running on it, once there is one
    server: object = None  # that server (a tests.live.LiveServer), for its log
    other_url: str = ""  # a database that is not a SQLite file (then `path` is empty)

    @property
    def database_url(self) -> str:
        return self.other_url or f"sqlite:///{self.path}"

    def count(self, table: str, where: str = "1") -> int:
        with sqlite3.connect(self.path) as db:
            return db.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]


def make_site(path: str, base_url: str, api_key: str, database_url: str = "") -> Site:
    """Migrate a new SQLite file at `path` (or `database_url`) and add carol, her session and token, the provider."""
    url = database_url or f"sqlite:///{path}"
    if not database_url and not os.path.exists(path):
        migrated_sqlite(path)  # the migrate below then has nothing left to do
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "chatsite.settings"}
    out = subprocess.run(
        [sys.executable, "-c", SETUP, base_url, api_key], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    made = json.loads(out.splitlines()[-1])
    return Site(path, made["secret"], made["session"], other_url=database_url)
