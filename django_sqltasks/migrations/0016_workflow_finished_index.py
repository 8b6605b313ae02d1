from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_sqltasks', '0015_workflows'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='workflowrecord',
            index=models.Index(fields=['backend_name', 'status', 'finished_at'], name='sqltasks_workflow_finished_idx'),
        ),
    ]
