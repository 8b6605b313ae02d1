# The scheduler's tick reads only due schedules (sqltasks_schedule_due_idx), and a worker's row
# says which process it is beyond host and pid (process), so that a second worker given a live
# id in another PID namespace is refused.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0019_fair_queues'),
    ]

    operations = [
        migrations.AddField(
            model_name='workerrecord',
            name='process',
            field=models.CharField(blank=True, default='', max_length=200, verbose_name='process'),
        ),
        migrations.AddIndex(
            model_name='schedulerecord',
            index=models.Index(fields=['backend_name', 'enabled', 'next_run_at', 'id'], name='sqltasks_schedule_due_idx'),
        ),
    ]
