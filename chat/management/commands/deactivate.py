"""Deactivate a user: signed out everywhere at once, their streams stopped, their tokens refused."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Deactivate USERNAME: their sessions are deleted, their open tabs closed and running streams stopped "
        "on every server process (with REDIS_URL), their API tokens refused. Conversations and usage stay."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        try:
            user = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        if not user.is_active:
            self.stdout.write(f"{username} was already deactivated.")
            return
        user.is_active = False
        user.save(update_fields=["is_active"])  # chat/auth/session_sockets.py signs them out everywhere
        self.stdout.write(f"{username} deactivated: signed out everywhere; conversations and usage kept.")
