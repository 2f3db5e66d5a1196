# idx_minute_stats_minute (issue 52): the live overview's last hour and garbage
# collection's minutes past the day are ranges of minutes across every (group, topic);
# without it both read the whole day (two million rows at 1,500 topics).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('sqlqueue', '0015_group_topic_offset_index'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='minutestats',
            index=models.Index(fields=['minute'], name='idx_minute_stats_minute'),
        ),
    ]
