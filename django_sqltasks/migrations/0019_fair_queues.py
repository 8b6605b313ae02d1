# Fair queues need no schema change: a task with a fair_key is stored under the limit key
# fair:<path>#<key>, in the partial index of limited tasks (sqltasks_ready_limited_idx), and the
# limited claim takes its keys round robin. This migration keeps the numbering.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0018_queue_overrides'),
    ]

    operations: list[migrations.operations.base.Operation] = []
