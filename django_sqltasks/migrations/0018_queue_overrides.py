# Queue limits set at run time (QueueLimitOverride).
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0017_schedules'),
    ]

    operations: list[migrations.operations.base.Operation] = [
        migrations.CreateModel(
            name='QueueLimitOverride',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('queue_name', models.CharField(max_length=64, verbose_name='queue')),
                ('concurrency', models.PositiveIntegerField(blank=True, help_text="At most this many of the queue's tasks RUNNING; blank: the settings'.", null=True, verbose_name='concurrency limit')),
                ('rate', models.PositiveIntegerField(blank=True, help_text="At most this many starts a period; blank: the settings'.", null=True, verbose_name='rate limit')),
                ('period', models.FloatField(blank=True, null=True, verbose_name='period (seconds)')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'queue limit override',
                'verbose_name_plural': 'queue limit overrides',
                'ordering': ['backend_name', 'queue_name'],
                'constraints': [models.UniqueConstraint(fields=('backend_name', 'queue_name'), name='sqltasks_queue_limit_override')],
            },
        ),
    ]
