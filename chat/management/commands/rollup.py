"""Rebuild the dashboard's daily summaries from the usage rows, and their triggers for today's TIME_ZONE."""

from django.core.management.base import BaseCommand

from chat import rollup
from chat.models import PersonDay, UsageDay


class Command(BaseCommand):
    help = (
        "Recreate the triggers that keep the usage dashboard's daily summaries and refill them from the "
        "usage rows. Run it after changing DJANGO_TIME_ZONE (until then the dashboard reads the rows)."
    )

    def handle(self, *args, **options):
        rollup.install()
        self.stdout.write(
            f"Daily summaries rebuilt in {rollup.installed_zone()}: {UsageDay.objects.count():,} days by model, "
            f"{PersonDay.objects.count():,} days by person."
        )
