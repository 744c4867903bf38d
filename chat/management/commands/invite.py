"""Invite someone by e-mail; the invite link is the last line printed."""

from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from chat.auth.invites import send_invite
from chat.models import ChatError, Invite


class Command(BaseCommand):
    help = (
        "Invite EMAIL: e-mail them a single-use link (expiring after INVITE_DAYS) to choose a password, "
        "and print the link (last line of output)."
    )

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--staff", action="store_true", help="the account may use the admin")
        parser.add_argument("--group", action="append", default=[], metavar="NAME", help="a group to join (repeatable)")
        parser.add_argument("--no-email", action="store_true", help="only print the link")

    def handle(self, *args, email, staff, group, no_email, **options):
        groups = list(Group.objects.filter(name__in=group))
        missing = set(group) - {g.name for g in groups}
        if missing:
            raise CommandError(f"No group named {', '.join(sorted(missing))}.")
        try:
            invite, secret = Invite.issue(email, staff=staff, groups=groups)
        except ChatError as exc:
            raise CommandError(exc.detail) from None
        if invite.replaced:
            self.stderr.write(f"The earlier invite for {invite.email} is withdrawn: its link no longer works.")
        if not no_email:
            try:
                send_invite(invite, secret)
            except OSError as exc:
                self.stderr.write(f"Could not e-mail the invite ({exc}); send the link yourself.")
        self.stderr.write(f"Invite for {invite.email}, single-use, until {invite.expires:%Y-%m-%d %H:%M %Z}:")
        self.stdout.write(Invite.link(secret))
