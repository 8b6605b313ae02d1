# Durable tasks: the steps a task recorded, and the events sent to tasks (docs/durable.md).

import django.utils.timezone
import django_sqltasks.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0023_suspect_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='EventRecord',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=200, verbose_name='name')),
                ('key', models.CharField(max_length=200, verbose_name='key')),
                ('payload', models.JSONField(blank=True, null=True, verbose_name='payload')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('sent_at', models.DateTimeField(blank=True, null=True, verbose_name='sent at')),
                ('task_id', models.UUIDField(blank=True, null=True, verbose_name='task')),
            ],
            options={
                'verbose_name': 'event',
                'verbose_name_plural': 'events',
                'ordering': ['-id'],
                'indexes': [django_sqltasks.indexes.PartialIndex(fallback=['task_id'], fields=['sent_at'], name='sqltasks_event_unclaimed_idx', where=models.Q(('task_id__isnull', True)))],
                'constraints': [models.UniqueConstraint(fields=('name', 'key'), name='sqltasks_event_unique')],
            },
        ),
        migrations.CreateModel(
            name='StepRecord',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('task_id', models.UUIDField(verbose_name='task')),
                ('kind', models.CharField(choices=[('step', 'step'), ('sleep', 'sleep'), ('event', 'event')], default='step', max_length=8, verbose_name='kind')),
                ('name', models.CharField(max_length=200, verbose_name='name')),
                ('occurrence', models.PositiveIntegerField(default=0, verbose_name='occurrence')),
                ('state', models.CharField(choices=[('done', 'done'), ('failed', 'failed'), ('waiting', 'waiting'), ('timed_out', 'timed out')], max_length=10, verbose_name='state')),
                ('attempts', models.PositiveIntegerField(default=0, help_text='How many times the step ran to its end or raised.', verbose_name='attempts')),
                ('result', models.JSONField(blank=True, null=True, verbose_name='result')),
                ('error', models.TextField(blank=True, default='', verbose_name='error')),
                ('event_key', models.CharField(blank=True, max_length=200, null=True, verbose_name='event key')),
                ('wake_at', models.DateTimeField(blank=True, null=True, verbose_name='wakes at')),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='started at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
            ],
            options={
                'verbose_name': 'step',
                'verbose_name_plural': 'steps',
                'ordering': ['task_id', 'id'],
                'indexes': [django_sqltasks.indexes.PartialIndex(fallback=['state'], fields=['task_id'], name='sqltasks_step_waiting_idx', where=models.Q(('state', 'waiting')))],
                'constraints': [models.UniqueConstraint(fields=('task_id', 'kind', 'name', 'occurrence'), name='sqltasks_step_unique')],
            },
        ),
    ]
