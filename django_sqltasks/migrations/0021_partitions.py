# PostgreSQL: the task table becomes partitioned (live tasks apart, finished ones by status and
# day), so pruning drops old days instead of deleting rows (docs/databases.md). The model and
# Django's state do not change. A table of more than 100,000 tasks is left for
# 'manage.py tasks_partition', which converts it while workers run (docs/operations.md); run it
# first, and this migration then finds the table partitioned. MariaDB, MySQL, SQLite: nothing.
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def partition(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # A migration loads before its code may be imported at the top: the store needs the models.
    from django_sqltasks.store.partitions import convert_at_migrate

    convert_at_migrate(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0020_schedule_due_worker_process'),
    ]

    operations = [
        # Reversing keeps the partitioned table: every earlier migration's reverse works on it.
        migrations.RunPython(partition, migrations.RunPython.noop, elidable=False),
    ]
