# Periodic schedules stored in the database: what to enqueue and when, edited in the admin or
# synced from OPTIONS["PERIODIC"]; last_slot is null until a worker first sees a schedule.
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_sqltasks", "0016_workflow_finished_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedulerecord",
            name="args",
            field=models.JSONField(blank=True, default=list, verbose_name="args"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="cron",
            field=models.CharField(blank=True, max_length=200, verbose_name="cron"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="enabled",
            field=models.BooleanField(default=True, verbose_name="enabled"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="every",
            field=models.FloatField(blank=True, null=True, verbose_name="every (seconds)"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="kwargs",
            field=models.JSONField(blank=True, default=dict, verbose_name="kwargs"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="last_error",
            field=models.TextField(blank=True, verbose_name="last error"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="last_run_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="last run"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="last_task_id",
            field=models.UUIDField(blank=True, null=True, verbose_name="last task"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="next_run_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="next run"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="origin",
            field=models.CharField(
                choices=[
                    ("admin", "admin"),
                    ("settings", "settings (PERIODIC)"),
                    ("removed", "removed from settings"),
                ],
                default="settings",
                max_length=10,
                verbose_name="origin",
            ),
        ),
        # The rows stored so far came from settings (above); a row made from now on is the
        # admin's unless the settings' sync says otherwise.
        migrations.AlterField(
            model_name="schedulerecord",
            name="origin",
            field=models.CharField(
                choices=[
                    ("admin", "admin"),
                    ("settings", "settings (PERIODIC)"),
                    ("removed", "removed from settings"),
                ],
                default="admin",
                max_length=10,
                verbose_name="origin",
            ),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="priority",
            field=models.SmallIntegerField(blank=True, null=True, verbose_name="priority"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="queue_name",
            field=models.CharField(blank=True, max_length=64, verbose_name="queue"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="revision",
            field=models.PositiveIntegerField(default=0, verbose_name="revision"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="task_path",
            field=models.CharField(blank=True, max_length=255, verbose_name="task"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="time_zone",
            field=models.CharField(blank=True, max_length=64, verbose_name="time zone"),
        ),
        migrations.AddField(
            model_name="schedulerecord",
            name="updated_at",
            field=models.DateTimeField(
                default=django.utils.timezone.now, verbose_name="updated at"
            ),
        ),
        migrations.AlterField(
            model_name="schedulerecord",
            name="last_slot",
            field=models.DateTimeField(blank=True, null=True, verbose_name="last slot"),
        ),
    ]
