"""Why a task failed, at a glance: the list's error column and the failed task's page."""

from __future__ import annotations

import traceback

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.core import error_text
from tests.factories import superuser_client, task_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_() -> Client:
    return superuser_client()


def formatted(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


def error(class_path: str, text: str) -> list[dict[str, str]]:
    return [{"exception_class_path": class_path, "traceback": text}]


FAILURES = [
    (
        "builtins.ValueError",
        formatted(ValueError("no such order\nsecond line")),
        "ValueError: no such order",
    ),
    (
        "django_sqltasks.exceptions.TaskCancelled",
        "Cancelled in the admin by op before it started.",
        "TaskCancelled: Cancelled in the admin by op before it started.",
    ),
    (
        "django_sqltasks.exceptions.TaskTimeout",
        "The task ran over its timeout of 5s.",
        "TaskTimeout: The task ran over its timeout of 5s.",
    ),
    ("builtins.KeyError", formatted(KeyError("sku")), "KeyError: 'sku'"),
    ("builtins.RuntimeError", formatted(RuntimeError()), "RuntimeError"),
]


@pytest.mark.parametrize(("class_path", "text", "summary"), FAILURES)
def test_summary_is_the_class_and_the_message_s_first_line(
    class_path: str, text: str, summary: str
) -> None:
    assert error_text.summary(error(class_path, text)[0]) == summary


def test_the_list_tells_failures_apart_in_an_error_column(client_: Client) -> None:
    for class_path, text, _ in FAILURES:
        task_row(TaskResultStatus.FAILED, errors=error(class_path, text))
    task_row(TaskResultStatus.SUCCESSFUL)
    body = client_.get(reverse("admin:django_sqltasks_taskrecord_changelist")).content.decode()
    assert '<th scope="col" class="column-error_summary">' in body
    for _, _, summary in FAILURES:
        assert f'title="{summary}"'.replace("'", "&#x27;") in body
    assert "second line" not in body  # the first line only


def test_a_long_message_is_cut_in_the_list_and_whole_in_its_tooltip(client_: Client) -> None:
    message = "x" * 300
    task_row(TaskResultStatus.FAILED, errors=error("app.Boom", f"{message}\nmore"))
    body = client_.get(reverse("admin:django_sqltasks_taskrecord_changelist")).content.decode()
    assert f'title="Boom: {message}"' in body
    assert f">Boom: {'x' * 73}…<" in body


def test_a_failed_task_s_page_opens_on_its_outcome(client_: Client) -> None:
    failed = task_row(TaskResultStatus.FAILED, errors=error(*FAILURES[0][:2]))
    ok = task_row(TaskResultStatus.SUCCESSFUL)
    url = "admin:django_sqltasks_taskrecord_change"
    body = client_.get(reverse(url, args=[failed.pk])).content.decode()
    assert body.index("Outcome") < body.index("field-task_path") < body.index("Attempts")
    assert '<p class="sqltasks-error-message">no such order</p>' in body
    body = client_.get(reverse(url, args=[ok.pk])).content.decode()
    assert body.index("field-task_path") < body.index("Outcome")  # others keep their order


def test_breadcrumbs_name_the_app_then_the_list(client_: Client) -> None:
    body = client_.get(reverse("admin:django_sqltasks_taskrecord_changelist")).content.decode()
    app = reverse("admin:app_list", args=["django_sqltasks"])
    assert f'<a href="{app}">Task queue</a>' in body  # not "Home > Tasks > Tasks"
