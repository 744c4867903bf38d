"""Create the first account on a fresh install, so the run command ends at a sign-in page."""

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, born with mode 600 (an older file is replaced, not reused)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)


class Command(BaseCommand):
    help = (
        "Create a superuser when no user exists yet (password from DJANGO_SUPERUSER_PASSWORD, else random: "
        "shown on a terminal, otherwise written to a file only the operator can read)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin"))
        parser.add_argument(
            "--password-file",
            type=Path,
            default=settings.BASE_DIR / ".admin-password",
            help="Where a generated password goes when the output is not a terminal.",
        )

    def handle(self, *args, username, password_file, **options):
        User = get_user_model()
        if User.objects.exists():
            return
        given = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        password = given or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, password=password, email="")
        reset = f"Reset it with: python manage.py changepassword {username}"
        if given:
            shown = "from DJANGO_SUPERUSER_PASSWORD"
        elif self.stdout.isatty():
            shown = password
        else:
            # Not a terminal: likely a service log that others can read, so the password goes to a private file.
            write_private(password_file, password + "\n")
            shown = f"in {password_file} (readable by its owner only; delete it once read)"
        self.stdout.write(self.style.SUCCESS(f"Created the first account: user {username!r}, password {shown}."))
        self.stdout.write(f"Change the password after signing in. {reset}")
