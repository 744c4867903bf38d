"""Rebuild the dashboard's daily summaries from the usage rows, and their triggers for today's TIME_ZONE."""

from django.core.management.base import BaseCommand, CommandError

from chat.metering import summary_triggers
from chat.models import PersonDay, UsageDay


class Command(BaseCommand):
    help = (
        "Recreate the triggers that keep the usage dashboard's daily summaries and refill them from the "
        "usage rows. Run it after changing DJANGO_TIME_ZONE (until then the dashboard reads the rows)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="Only compare the summaries with the rows.")

    def handle(self, *args, check=False, **options):
        if check:
            found = summary_triggers.mismatches()
            for line in found[:50]:
                self.stdout.write(line)
            if found:
                raise CommandError(f"The daily summaries differ from the usage rows in {len(found):,} places.")
            self.stdout.write(
                f"The daily summaries match the usage rows (days in {summary_triggers.installed_zone()})."
            )
            return
        summary_triggers.install()
        if options["verbosity"]:
            self.stdout.write(
                f"Daily summaries rebuilt in {summary_triggers.installed_zone()}: "
                # Days by model and source: the shards of one (chat/models/rollups.py) count once.
                f"{UsageDay.objects.values('day', 'model', 'source').distinct().count():,} days by model, "
                f"{PersonDay.objects.count():,} days by person."
            )
