"""Issue a personal API token from the command line; the token is the last line printed."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from chat.models import ApiToken


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it (last line of output). It is not stored in clear."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="created by manage.py createtoken")

    def handle(self, *args, username, name, **options):
        try:
            user = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        token, secret = ApiToken.issue(user, name[:100])
        self.stderr.write(f"Token {token.name!r} for {username}; shown once, keep it safe:")
        self.stdout.write(secret)
