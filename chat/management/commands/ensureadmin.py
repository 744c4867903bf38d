"""Create the first account on a fresh install, so the run command ends at a sign-in page."""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a superuser when no user exists yet (password from DJANGO_SUPERUSER_PASSWORD, else random)."

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin"))

    def handle(self, *args, username, **options):
        User = get_user_model()
        if User.objects.exists():
            return
        password = os.environ.get("DJANGO_SUPERUSER_PASSWORD") or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, password=password, email="")
        shown = password if "DJANGO_SUPERUSER_PASSWORD" not in os.environ else "(from DJANGO_SUPERUSER_PASSWORD)"
        self.stdout.write(
            self.style.SUCCESS(
                f"Created the first account: user {username!r}, password {shown}. Change it after signing in."
            )
        )
