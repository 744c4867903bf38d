"""Delete conversations untouched for N days (retention), and /v1/responses' stored responses as old; their usage
rows stay, unlinked.

For a daily timer (docs/deploy.md). The last line printed says what was (or, with
--dry-run, would be) deleted.
"""

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from chat.actions.deletes import delete_one
from chat.models import Conversation, Message, StoredResponse


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
        # What /v1/responses kept for follow-ups (previous_response_id): a follow-up to a later one then says that
        # an earlier response of its conversation is gone.
        responses = StoredResponse.objects.filter(created__lt=timezone.now() - timedelta(days=days))
        stored = responses.count()
        if dry_run:
            self.stdout.write(f"Would delete {count} conversation(s) untouched for {days} days and {stored} stored "
                              "API response(s) as old (dry run).")  # fmt: skip
            return
        for conversation in old.iterator(chunk_size=500):
            delete_one(conversation)  # one by one, a long one in batches: each one's attachments' files go with it
        responses.delete()
        self.stdout.write(f"Deleted {count} conversation(s) untouched for {days} days and {stored} stored API "
                          "response(s) as old; their usage rows are kept.")  # fmt: skip
