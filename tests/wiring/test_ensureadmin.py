"""The first account: its generated password reaches only the operator (a terminal, or a private file)."""

import io
import os
import stat

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_password_in_environment(monkeypatch):
    monkeypatch.delenv("DJANGO_SUPERUSER_PASSWORD", raising=False)


def test_without_a_terminal_the_password_goes_to_a_file_only_its_owner_reads(tmp_path):
    path = tmp_path / ".admin-password"
    path.write_text("an old file anyone could read\n")
    path.chmod(0o644)
    out = io.StringIO()  # not a terminal, as under a service manager
    call_command("ensureadmin", username="boss", password_file=path, stdout=out)
    password = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert authenticate(username="boss", password=password) is not None
    printed = out.getvalue()
    assert password not in printed
    assert str(path) in printed and "manage.py changepassword boss" in printed


def test_on_a_terminal_the_password_is_shown_and_no_file_written(tmp_path):
    main, secondary = os.openpty()
    path = tmp_path / ".admin-password"
    with open(secondary, "w") as terminal:
        call_command("ensureadmin", username="boss", password_file=path, stdout=terminal)
    # Everything the terminal got: its lines reach this end a moment after they were written, one read
    # may hold only the first; once read to the end, the closed terminal answers EIO.
    received = []
    while True:
        try:
            received.append(os.read(main, 4096))
        except OSError:
            break
        if not received[-1]:
            break
    printed = b"".join(received).decode()
    os.close(main)
    password = printed.split("password ", 1)[1].split(".", 1)[0]
    assert authenticate(username="boss", password=password) is not None
    assert "manage.py changepassword boss" in printed
    assert not path.exists()


def test_a_password_from_the_environment_is_neither_shown_nor_written(tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "from-the-env-pw-123")
    out = io.StringIO()
    call_command("ensureadmin", username="boss", password_file=tmp_path / "p", stdout=out)
    assert "from-the-env-pw-123" not in out.getvalue() and not (tmp_path / "p").exists()
    assert authenticate(username="boss", password="from-the-env-pw-123") is not None


def test_nothing_happens_once_a_user_exists(tmp_path, django_user_model):
    django_user_model.objects.create_user("someone")
    out = io.StringIO()
    call_command("ensureadmin", username="boss", password_file=tmp_path / "p", stdout=out)
    assert out.getvalue() == "" and not django_user_model.objects.filter(username="boss").exists()
