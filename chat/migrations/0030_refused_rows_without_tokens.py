"""Refused streams' usage rows no longer carry the request's estimated prompt tokens.

Nothing went upstream, so the dashboard's "tokens in" must not count them. The summaries follow:
their triggers take each updated row off and add it again (chat/metering/summary_triggers.py).
"""

from django.db import migrations


def zero_refused_tokens(apps, schema_editor):
    Usage = apps.get_model("chat", "Usage")
    Usage.objects.filter(status="refused").exclude(prompt_tokens=0, total_tokens=0).update(
        prompt_tokens=0, total_tokens=0
    )


class Migration(migrations.Migration):
    dependencies = [("chat", "0029_constraint_messages")]

    operations = [migrations.RunPython(zero_refused_tokens, migrations.RunPython.noop)]
