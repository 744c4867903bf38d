"""manage.py reads .env beside it, as `make run` does, so its commands act on the server's database."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.live import ROOT


def test_manage_py_takes_the_env_file_beside_it_and_the_environment_wins(tmp_path):
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")  # a copy: the tests' own runs of manage.py see no .env
    (tmp_path / ".env").write_text(
        "# the server's settings\n"
        f"export DATABASE_URL=sqlite:///{tmp_path}/served.sqlite3\n"
        "DJANGO_TIME_ZONE='Europe/Paris'  \n"
        "SITE_URL=https://chat.example.com # where people reach it\n"
        'CHAT_TITLES="0"\n'
    )
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "SITE_URL")}
    env |= {"PYTHONPATH": str(ROOT), "DJANGO_TIME_ZONE": "UTC"}  # set here: the environment wins
    script = (
        "from django.conf import settings; import os;"
        "print(settings.DATABASES['default']['NAME'], settings.TIME_ZONE, os.environ['SITE_URL'], settings.CHAT_TITLES)"
    )
    done = subprocess.run([sys.executable, str(tmp_path / "manage.py"), "shell", "-c", script], cwd=ROOT, env=env,
                          check=True, capture_output=True, text=True)  # fmt: skip
    printed = done.stdout.splitlines()[-1].split()  # after the shell's line about its imports
    assert printed == [f"{tmp_path}/served.sqlite3", "UTC", "https://chat.example.com", "False"]


def test_make_run_reads_the_env_file_the_same_way_and_env_example_changes_nothing(tmp_path):
    """`make run` sourced .env in the shell: .env.example's `OIDC_NAME=single sign-on` ran `sign-on`, its LDAP
    filter was a syntax error, `DATABASE_URL=` stopped the migration, and the file won over the environment."""
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DATABASE_", "OIDC_", "LDAP_"))}
    env |= {"PYTHONPATH": str(ROOT), "DATABASE_URL": f"sqlite:///{tmp_path}/mine.sqlite3"}
    shell = f'eval "$({sys.executable} -m chatsite.dotenv {tmp_path}/.env)" && printf "%s|%s|%s" ' + (
        '"$OIDC_NAME" "$LDAP_USER_FILTER" "$DATABASE_URL"'
    )
    done = subprocess.run(["bash", "-c", shell], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    assert done.stdout == f"single sign-on|(uid=%(user)s)|sqlite:///{tmp_path}/mine.sqlite3" and not done.stderr
    script = "from django.conf import settings as s; print(s.DATABASES['default']['NAME'], s.ATTACHMENT_STORAGE)"
    done = subprocess.run([sys.executable, str(tmp_path / "manage.py"), "shell", "-c", script], cwd=ROOT, env=env,
                          check=True, capture_output=True, text=True)  # fmt: skip
    assert done.stdout.splitlines()[-1] == f"{tmp_path}/mine.sqlite3 database"  # the example's values: defaults
