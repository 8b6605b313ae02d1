"""A workflow on its tasks' pages in the admin."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks import chain, group
from django_sqltasks.testing import run_tasks
from tests import tasks_workflows as wf

pytestmark = pytest.mark.django_db


def page(client: Client, task_id: str) -> str:
    url = reverse("admin:django_sqltasks_taskrecord_change", args=[task_id])
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_a_step_page_shows_its_workflow_and_the_step_that_failed(admin_client: Client) -> None:
    workflow = chain(
        wf.add.s(1, 1), group(wf.boom.s(), wf.double.s()).then(wf.sum_of.s()), wf.double.s()
    ).enqueue()
    run_tasks()
    html = page(admin_client, workflow.task_ids[-1])
    assert f"Workflow {workflow.id}" in html
    assert 'data-status="FAILED"' in html
    for task_id in workflow.task_ids:
        assert reverse("admin:django_sqltasks_taskrecord_change", args=[task_id]) in html
    assert "failed at <code>tests.tasks_workflows.boom</code>" in html
    assert html.count("this step failed") == 1
    assert "group: at once, then the last step (on failure: skip)" in html


def test_a_waiting_step_shows_as_waiting(admin_client: Client) -> None:
    workflow = chain(wf.add.s(1, 1), wf.double.s()).enqueue()
    html = page(admin_client, workflow.task_ids[0])
    assert 'data-status="WAITING"' in html
    assert 'data-status="READY"' in html


def test_a_task_of_no_workflow_has_no_workflow_section(admin_client: Client) -> None:
    result = wf.add.enqueue(1, 2)
    assert "sqltasks-workflow" not in page(admin_client, result.id)
