# A stop asked through the database (chat/actions/streams.py). A database default too, so a process
# of the previous release still writes messages while this one migrates.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0022_stored_responses'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='stop_requested',
            field=models.BooleanField(default=False, db_default=False, help_text='A stop asked through the database.'),
        ),
    ]
