"""The two limit pages link to each other and say what deleting a row of each does."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks.models import TaskLimit
from tests.factories import task_row

pytestmark = pytest.mark.django_db

LIMITS = "admin:django_sqltasks_tasklimit_changelist"
OVERRIDES = "admin:django_sqltasks_queuelimitoverride_changelist"


def test_the_limit_pages_link_to_each_other_and_say_what_delete_means(admin_client: Client) -> None:
    limits = admin_client.get(reverse(LIMITS)).content.decode()
    overrides = admin_client.get(reverse(OVERRIDES)).content.decode()
    assert f'href="{reverse(OVERRIDES)}"' in limits
    assert "Deleting a row here removes no limit" in limits
    assert f'href="{reverse(LIMITS)}"' in overrides
    assert "Deleting an override puts the settings' limits back" in overrides


def test_a_queue_limit_counts_its_waiting_tasks_of_and_without_a_task_limit(
    admin_client: Client,
) -> None:
    TaskLimit.objects.create(backend_name="default", key="queue:other", concurrency=2)
    task_row(queue_name="other")
    task_row(queue_name="other", limit_key="task:tests.tasks.add")
    task_row(queue_name="default")
    body = admin_client.get(reverse(LIMITS)).content.decode()
    assert '<td class="field-waiting">2</td>' in body
