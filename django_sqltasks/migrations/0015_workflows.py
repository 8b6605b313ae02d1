import django.utils.timezone
import django_sqltasks.ids
import django_sqltasks.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0014_progress_trace_parent'),
    ]

    operations = [
        migrations.AddField(
            model_name='taskrecord',
            name='workflow_id',
            field=models.UUIDField(blank=True, db_default=None, help_text='The chain or group this task is a step of.', null=True, verbose_name='workflow'),
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
                'indexes': [django_sqltasks.indexes.PartialIndex(fallback=['status'], fields=['backend_name', 'updated_at'], name='sqltasks_workflow_running_idx', where=models.Q(('status', 'RUNNING')))],
            },
        ),
    ]
