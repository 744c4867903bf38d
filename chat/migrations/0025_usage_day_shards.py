from django.db import migrations, models


def drop_triggers(apps, schema_editor):
    """Off while the summary table changes: SQLite rebuilds it, under the triggers that write to it."""
    from chat.metering import summary_triggers

    summary_triggers.uninstall(schema_editor.connection)


def install_triggers(apps, schema_editor):
    """The triggers again, now writing each row's shard, and every summary refilled from the rows."""
    from chat.metering import summary_triggers

    summary_triggers.install(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0024_tools"),
    ]

    operations = [
        migrations.RunPython(drop_triggers, install_triggers),
        migrations.RemoveConstraint(model_name="usageday", name="usage_day_key"),
        migrations.AddField(model_name="usageday", name="shard", field=models.SmallIntegerField(default=0)),
        migrations.AddConstraint(
            model_name="usageday",
            constraint=models.UniqueConstraint(fields=("day", "model", "source", "shard"), name="usage_day_shard_key"),
        ),
        migrations.RunPython(install_triggers, drop_triggers),
    ]
