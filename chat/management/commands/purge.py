"""Delete conversations untouched for N days (retention); their usage rows stay, unlinked.

For a daily timer (docs/deploy.md). The last line printed says what was (or, with
--dry-run, would be) deleted.
"""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chat.actions.deletes import delete_one
from chat.models import Conversation, Message


class Command(BaseCommand):
    help = "Delete conversations not updated for --days days (default CHAT_RETENTION_DAYS; 0: keep all)."

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=None, help="untouched for this many days (default: setting)")
        parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")

    def handle(self, *args, days=None, dry_run=False, **options):
        days = settings.CHAT_RETENTION_DAYS if days is None else days
        if days < 0:
            raise CommandError("--days must be 0 (keep everything) or more.")
        if days == 0:
            self.stdout.write("Retention is off (CHAT_RETENTION_DAYS=0 and no --days): nothing deleted.")
            return
        # A conversation with an answer still streaming is live, whatever its date.
        old = Conversation.objects.untouched_for(days).exclude(messages__status=Message.Status.STREAMING)
        count = old.count()
        if dry_run:
            self.stdout.write(f"Would delete {count} conversation(s) untouched for {days} days (dry run).")
            return
        for conversation in old.iterator(chunk_size=500):
            delete_one(conversation)  # one by one, a long one in batches: each one's attachments' files go with it
        self.stdout.write(f"Deleted {count} conversation(s) untouched for {days} days; their usage rows are kept.")
