# The suspects under a limit (READY limited tasks marked in the year 9998, after a rescue) are
# found in a range of this index, however many limit keys wait: without it, the look every
# worker makes at each heartbeat read every READY limited task.

import django_sqltasks.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0022_tags_search'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='taskrecord',
            index=django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['backend_name', 'available_at'], name='sqltasks_ready_limited_at_idx', where=models.Q(('limit_key__isnull', False), ('status', 'READY'))),
        ),
    ]
