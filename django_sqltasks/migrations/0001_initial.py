# The tables of django-sqltasks, as the models declare them (regenerated with makemigrations
# before the first release), then, on PostgreSQL, the task table partitioned: live tasks apart,
# finished ones by status and day, so that pruning drops old days instead of deleting rows
# (docs/databases.md). MariaDB, MySQL, SQLite: one task table.

import django.utils.timezone
import django_sqltasks.ids
import django_sqltasks.indexes
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def partition(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # A migration loads before its code may be imported at the top: the store needs the models.
    from django_sqltasks.store.partitions import convert_at_migrate

    if schema_editor.connection.vendor == "postgresql":
        # The indexes and constraints of the models above are still deferred to the end of
        # this migration: make them now, on the plain table the conversion copies them from.
        for statement in schema_editor.deferred_sql:
            schema_editor.execute(statement)
        schema_editor.deferred_sql.clear()
    convert_at_migrate(schema_editor.connection)


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='WorkerRecord',
            fields=[
                ('id', models.CharField(max_length=64, primary_key=True, serialize=False, verbose_name='worker id')),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('queue_names', models.JSONField(default=list, verbose_name='queues')),
                ('hostname', models.CharField(blank=True, max_length=255, verbose_name='hostname')),
                ('pid', models.PositiveIntegerField(blank=True, null=True, verbose_name='pid')),
                ('concurrency', models.PositiveIntegerField(default=1, verbose_name='concurrency')),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='started at')),
                ('heartbeat_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now, verbose_name='last heartbeat')),
                ('process', models.CharField(blank=True, default='', max_length=200, verbose_name='process')),
                ('claim_measured_at', models.DateTimeField(blank=True, null=True, verbose_name='claims measured at')),
                ('claim_count', models.PositiveIntegerField(blank=True, null=True, verbose_name='claims (last minute)')),
                ('claim_rows', models.PositiveIntegerField(blank=True, null=True, verbose_name='tasks claimed (last minute)')),
                ('claim_mean', models.FloatField(blank=True, null=True, verbose_name='claim mean (s)')),
                ('claim_p99', models.FloatField(blank=True, null=True, verbose_name='claim p99 (s)')),
                ('claim_max', models.FloatField(blank=True, null=True, verbose_name='claim max (s)')),
                ('claim_full_passes', models.PositiveIntegerField(blank=True, null=True, verbose_name='full passes (last minute)')),
                ('claim_full_pass_max', models.FloatField(blank=True, null=True, verbose_name='full pass max (s)')),
            ],
            options={
                'verbose_name': 'worker',
                'verbose_name_plural': 'workers',
                'ordering': ['-heartbeat_at'],
            },
        ),
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
            name='PausedQueue',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('queue_name', models.CharField(max_length=64, verbose_name='queue')),
                ('paused_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='paused at')),
            ],
            options={
                'verbose_name': 'paused queue',
                'verbose_name_plural': 'paused queues',
                'ordering': ['backend_name', 'queue_name'],
                'permissions': [('pause_queue', 'Can pause and resume queues')],
                'default_permissions': ('view',),
                'constraints': [models.UniqueConstraint(fields=('backend_name', 'queue_name'), name='sqltasks_paused_queue')],
            },
        ),
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
        migrations.CreateModel(
            name='ScheduleRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('name', models.CharField(max_length=200, verbose_name='name')),
                ('last_slot', models.DateTimeField(blank=True, null=True, verbose_name='last slot')),
                ('task_path', models.CharField(blank=True, max_length=255, verbose_name='task')),
                ('args', models.JSONField(blank=True, default=list, verbose_name='args')),
                ('kwargs', models.JSONField(blank=True, default=dict, verbose_name='kwargs')),
                ('cron', models.CharField(blank=True, max_length=200, verbose_name='cron')),
                ('every', models.FloatField(blank=True, null=True, verbose_name='every (seconds)')),
                ('time_zone', models.CharField(blank=True, max_length=64, verbose_name='time zone')),
                ('queue_name', models.CharField(blank=True, max_length=64, verbose_name='queue')),
                ('priority', models.SmallIntegerField(blank=True, null=True, verbose_name='priority')),
                ('enabled', models.BooleanField(default=True, verbose_name='enabled')),
                ('origin', models.CharField(choices=[('admin', 'admin'), ('settings', 'settings (PERIODIC)'), ('removed', 'removed from settings')], default='admin', max_length=10, verbose_name='origin')),
                ('revision', models.PositiveIntegerField(default=0, verbose_name='revision')),
                ('last_run_at', models.DateTimeField(blank=True, null=True, verbose_name='last run')),
                ('last_task_id', models.UUIDField(blank=True, null=True, verbose_name='last task')),
                ('next_run_at', models.DateTimeField(blank=True, null=True, verbose_name='next run')),
                ('last_error', models.TextField(blank=True, verbose_name='last error')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'periodic task',
                'verbose_name_plural': 'periodic tasks',
                'ordering': ['backend_name', 'name'],
                'indexes': [models.Index(fields=['backend_name', 'enabled', 'next_run_at', 'id'], name='sqltasks_schedule_due_idx')],
                'constraints': [models.UniqueConstraint(fields=('backend_name', 'name'), name='sqltasks_schedule_name')],
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
        migrations.CreateModel(
            name='TaskLimit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('key', models.CharField(max_length=255, verbose_name='key')),
                ('concurrency', models.PositiveIntegerField(blank=True, help_text='At most this many RUNNING.', null=True, verbose_name='concurrency limit')),
                ('rate', models.PositiveIntegerField(blank=True, help_text='At most this many starts a period.', null=True, verbose_name='rate limit')),
                ('period', models.FloatField(blank=True, null=True, verbose_name='period (seconds)')),
                ('starts', models.JSONField(blank=True, default=list, verbose_name='recent starts')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'limit',
                'verbose_name_plural': 'limits',
                'ordering': ['backend_name', 'key'],
                'default_permissions': ('view',),
                'constraints': [models.UniqueConstraint(fields=('backend_name', 'key'), name='sqltasks_limit_key')],
            },
        ),
        migrations.CreateModel(
            name='TaskRecord',
            fields=[
                ('id', models.UUIDField(default=django_sqltasks.ids.new_task_id, editable=False, primary_key=True, serialize=False)),
                ('task_path', models.CharField(max_length=255, verbose_name='task path')),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('queue_name', models.CharField(max_length=64, verbose_name='queue')),
                ('priority', models.SmallIntegerField(default=0, verbose_name='priority')),
                ('status', models.CharField(choices=[('READY', 'Ready'), ('RUNNING', 'Running'), ('FAILED', 'Failed'), ('SUCCESSFUL', 'Successful')], default='READY', max_length=10, verbose_name='status')),
                ('args', models.JSONField(default=list, verbose_name='args')),
                ('kwargs', models.JSONField(default=dict, verbose_name='kwargs')),
                ('return_value', models.JSONField(blank=True, null=True, verbose_name='return value')),
                ('errors', models.JSONField(blank=True, default=list, verbose_name='errors')),
                ('worker_ids', models.JSONField(blank=True, default=list, verbose_name='worker ids')),
                ('attempts', models.PositiveIntegerField(default=0, verbose_name='attempts')),
                ('rescues', models.PositiveIntegerField(db_default=0, default=0, help_text='How many times this task went back in the queue because its worker was lost.', verbose_name='rescues')),
                ('snoozes', models.PositiveIntegerField(db_default=0, default=0, help_text='How many times this task raised Snooze to run again later.', verbose_name='snoozes')),
                ('owner', models.CharField(blank=True, help_text='The worker holding this task while it runs.', max_length=64, null=True, verbose_name='owner')),
                ('enqueued_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='enqueued at')),
                ('run_after', models.DateTimeField(blank=True, null=True, verbose_name='run after')),
                ('available_at', models.DateTimeField(default=django.utils.timezone.now, help_text='The earliest time a worker may claim this task.', verbose_name='available at')),
                ('started_at', models.DateTimeField(blank=True, null=True, verbose_name='started at')),
                ('last_attempted_at', models.DateTimeField(blank=True, null=True, verbose_name='last attempted at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
                ('cancel_requested', models.BooleanField(db_default=False, default=False, help_text='Set to stop a running async task; its worker cancels it at its next heartbeat.', verbose_name='cancel requested')),
                ('dedupe_key', models.CharField(blank=True, help_text='While a task with this key is READY or RUNNING, enqueueing it again returns that task.', max_length=255, null=True, verbose_name='dedupe key')),
                ('subject_type', models.CharField(blank=True, max_length=100, null=True, verbose_name='subject type')),
                ('subject_id', models.CharField(blank=True, max_length=255, null=True, verbose_name='subject id')),
                ('limit_key', models.CharField(blank=True, db_default=None, help_text='The concurrency or rate limit this task waits on and counts against.', max_length=255, null=True, verbose_name='limit key')),
                ('progress', models.JSONField(blank=True, db_default=None, help_text="The progress, note and metadata the task's latest attempt reported.", null=True, verbose_name='progress')),
                ('trace_parent', models.CharField(blank=True, db_default=None, max_length=64, null=True, verbose_name='trace parent')),
                ('workflow_id', models.UUIDField(blank=True, db_default=None, help_text='The chain or group this task is a step of.', null=True, verbose_name='workflow')),
                ('tags', models.JSONField(blank=True, help_text='Labels set when the task was enqueued, to find it by.', null=True, verbose_name='tags')),
            ],
            options={
                'verbose_name': 'task',
                'verbose_name_plural': 'tasks',
                'ordering': ['-id'],
                'permissions': [('retry_taskrecord', 'Can retry failed tasks'), ('cancel_taskrecord', 'Can cancel tasks that have not started'), ('run_taskrecord', 'Can run deferred tasks now')],
                'indexes': [django_sqltasks.indexes.PartialIndex(fallback=['status', 'limit_key'], fields=['backend_name', 'queue_name', '-priority', 'available_at'], name='sqltasks_ready_idx', where=models.Q(('limit_key__isnull', True), ('status', 'READY'))), django_sqltasks.indexes.PartialIndex(fallback=['status', 'limit_key'], fields=['backend_name', '-priority', 'available_at'], name='sqltasks_ready_all_idx', where=models.Q(('limit_key__isnull', True), ('status', 'READY'))), django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['backend_name', 'limit_key', '-priority', 'available_at'], name='sqltasks_ready_limited_idx', where=models.Q(('limit_key__isnull', False), ('status', 'READY'))), django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['backend_name', 'available_at'], name='sqltasks_ready_limited_at_idx', where=models.Q(('limit_key__isnull', False), ('status', 'READY'))), django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['owner'], name='sqltasks_running_idx', where=models.Q(('status', 'RUNNING'))), django_sqltasks.indexes.PostgreSQLIndex(expression='owner', name='sqltasks_cancel_requested_idx', using='btree', where="status = 'RUNNING' AND cancel_requested"), django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['finished_at'], name='sqltasks_finished_idx', where=models.Q(('status__in', ('SUCCESSFUL', 'FAILED')))), django_sqltasks.indexes.PartialIndex(fallback=[], fields=['subject_type', 'subject_id'], name='sqltasks_subject_idx', where=models.Q(('subject_type__isnull', False))), django_sqltasks.indexes.PostgreSQLIndex(expression='(jsonb_path_query_array(args || kwargs, \'strict $.**{0 to 40} ? (@.type() != "object" && @.type() != "array")\') || jsonb_object(ARRAY[\'t\', task_path::text, \'q\', queue_name::text]))', name='sqltasks_argument_values_idx', where=''), django_sqltasks.indexes.PostgreSQLIndex(expression="regexp_replace((errors -> -1) ->> 'exception_class_path', '^.*\\.', '')", name='sqltasks_error_class_idx', using='btree', where="status = 'FAILED'"), django_sqltasks.indexes.PostgreSQLIndex(expression='tags', name='sqltasks_tags_idx', where='tags IS NOT NULL'), django_sqltasks.indexes.FilterIndex(fields=['task_path', 'id'], name='sqltasks_task_path_idx'), django_sqltasks.indexes.FilterIndex(fields=['queue_name', 'id'], name='sqltasks_queue_name_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('priority__gte', -100), ('priority__lte', 100)), name='sqltasks_priority_range'), models.CheckConstraint(condition=models.Q(('status__in', ['READY', 'RUNNING', 'FAILED', 'SUCCESSFUL'])), name='sqltasks_status_valid'), django_sqltasks.indexes.LiveDedupeConstraint(name='sqltasks_dedupe_live')],
            },
        ),
        migrations.CreateModel(
            name='QueueOverview',
            fields=[
            ],
            options={
                'verbose_name': 'queue overview',
                'verbose_name_plural': 'queue overview',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('django_sqltasks.taskrecord',),
        ),
        migrations.CreateModel(
            name='WorkflowRecord',
            fields=[
                ('id', models.UUIDField(default=django_sqltasks.ids.new_task_id, editable=False, primary_key=True, serialize=False)),
                ('backend_name', models.CharField(max_length=64, verbose_name='backend')),
                ('status', models.CharField(choices=[('READY', 'Ready'), ('RUNNING', 'Running'), ('FAILED', 'Failed'), ('SUCCESSFUL', 'Successful')], default='RUNNING', max_length=10, verbose_name='status')),
                ('plan', models.JSONField(verbose_name='plan')),
                ('revision', models.PositiveIntegerField(default=0, verbose_name='revision')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='created at')),
                ('updated_at', models.DateTimeField(default=django.utils.timezone.now, verbose_name='updated at')),
                ('finished_at', models.DateTimeField(blank=True, null=True, verbose_name='finished at')),
            ],
            options={
                'verbose_name': 'workflow',
                'verbose_name_plural': 'workflows',
                'ordering': ['-id'],
                'default_permissions': ('view',),
                'indexes': [django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['backend_name', 'updated_at'], name='sqltasks_workflow_running_idx', where=models.Q(('status', 'RUNNING'))), models.Index(fields=['backend_name', 'status', 'finished_at'], name='sqltasks_workflow_finished_idx')],
            },
        ),
        # Reversing keeps the partitioned table: dropping the model drops it whole.
        migrations.RunPython(partition, migrations.RunPython.noop, elidable=False),
    ]
