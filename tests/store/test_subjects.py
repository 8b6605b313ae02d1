# mypy: disable-error-code="call-arg"
# (@task is typed as returning Django's Task, whose using() has no subject; see with_subject.)
"""Tasks about a model row: task.using(subject=obj), for_subject(), dedupe='subject', the
opt-in cancelling of a deleted row's READY tasks, and the row's tasks on its admin page."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.db import connection, transaction
from django.db.models.signals import post_delete
from django.test import Client, RequestFactory
from django.utils import timezone

from django_sqltasks.admin.subject import SubjectTasksMixin
from django_sqltasks.compat import InvalidTask, TaskResultStatus, task, task_backends
from django_sqltasks.core.subject import Subject
from django_sqltasks.models import TaskRecord
from django_sqltasks.store.subjects import cancel_ready_tasks, cancel_tasks_on_delete
from django_sqltasks.task import with_subject
from tests import tasks, tasks_tools
from tests.factories import plan_uses, task_row

pytestmark = pytest.mark.django_db(transaction=False)


@pytest.fixture
def user() -> User:
    return User.objects.create(username="ada")


def subject_columns(result: Any) -> tuple[str | None, str | None]:
    row = TaskRecord.objects.get(id=result.id)
    return row.subject_type, row.subject_id


def test_enqueue_with_a_subject(user: User) -> None:
    about = tasks.add.using(subject=user).enqueue(1, 2)
    plain = tasks.add.enqueue(1, 2)
    assert subject_columns(about) == ("auth.user", str(user.pk))
    assert subject_columns(plain) == (None, None)
    assert list(TaskRecord.objects.for_subject(user).values_list("id", flat=True)) == [
        uuid.UUID(about.id)
    ]
    # The subject is not an argument of the task.
    assert (about.args, about.kwargs) == ([1, 2], {})
    # It survives other using() calls, and None takes it off.
    again = tasks.add.using(subject=user).using(priority=5)
    assert subject_columns(again.enqueue(0, 0)) == ("auth.user", str(user.pk))
    assert subject_columns(again.using(subject=None).enqueue(0, 0)) == (None, None)


def test_a_plain_django_task_gets_one_through_with_subject(user: User) -> None:
    result = with_subject(tasks.add, user).enqueue(3, 4)
    assert subject_columns(result) == ("auth.user", str(user.pk))


def test_enqueue_many_and_the_transaction(user: User) -> None:
    results = task_backends["default"].enqueue_many(
        tasks.add.using(subject=user), [((1, 1), {}), ((2, 2), {})]
    )
    assert {subject_columns(r) for r in results} == {("auth.user", str(user.pk))}
    try:
        with transaction.atomic():
            tasks.add.using(subject=user).enqueue(9, 9)
            raise ZeroDivisionError
    except ZeroDivisionError:
        pass
    assert TaskRecord.objects.for_subject(user).count() == 2


@pytest.mark.django_db(transaction=True)  # aenqueue commits on its own
async def test_aenqueue_with_a_subject() -> None:
    from asgiref.sync import sync_to_async

    group = await Group.objects.acreate(name="g")
    result = await tasks.add.using(subject=group).aenqueue(1, 2)
    row = await TaskRecord.objects.aget(id=result.id)
    assert (row.subject_type, row.subject_id) == ("auth.group", str(group.pk))
    assert await sync_to_async(TaskRecord.objects.for_subject(group).count)() == 1


def test_primary_keys_of_any_kind() -> None:
    session = Session.objects.create(
        session_key="k" * 40, session_data="", expire_date=timezone.now()
    )
    task_as_subject = TaskRecord.objects.get(id=tasks.noop.enqueue().id)  # a UUID primary key
    by_session = tasks.add.using(subject=session).enqueue(1, 2)
    by_task = tasks.add.using(subject=task_as_subject).enqueue(1, 2)
    assert subject_columns(by_session) == ("sessions.session", "k" * 40)
    assert subject_columns(by_task) == ("django_sqltasks.taskrecord", str(task_as_subject.pk))
    assert TaskRecord.objects.for_subject(task_as_subject).get().id == uuid.UUID(by_task.id)


def saved(instance: Any) -> Any:
    instance._state.adding = False  # as if loaded from the database
    return instance


@pytest.mark.parametrize(
    ("subject", "message"),
    [
        (lambda: User(username="unsaved"), "has no primary key"),
        (lambda: "auth.user:1", "must be a saved model instance, not 'auth.user:1'"),
        (lambda: 42, "must be a saved model instance"),
        (
            lambda: saved(Session(session_key="a\x00b")),
            "primary key 'a\\x00b' contains a NUL character",
        ),
        (lambda: saved(Session(session_key="\ud800")), "lone surrogate"),
        (lambda: saved(Session(session_key="k" * 300)), "300 characters as text, over the 255"),
    ],
)
def test_a_bad_subject_is_refused(subject: Any, message: str) -> None:
    with pytest.raises(InvalidTask, match=message.replace("\\", "\\\\").replace("(", r"\(")):
        tasks.add.using(subject=subject())


def test_a_deleted_subject_is_refused(user: User) -> None:
    user.delete()
    with pytest.raises(InvalidTask, match="or was deleted"):
        tasks.add.using(subject=user)


def test_subject_is_not_a_task_option(user: User) -> None:
    with pytest.raises(InvalidTask, match=r"subject is set per enqueue with \.using"):
        task(subject=user)(tasks.add.func)


def test_dedupe_by_subject(user: User) -> None:
    other = User.objects.create(username="grace")
    first = tasks_tools.reindex.using(subject=user).enqueue("a")
    assert tasks_tools.reindex.using(subject=user).enqueue("b").id == first.id
    assert tasks_tools.reindex.using(subject=other).enqueue("a").id != first.id
    with pytest.raises(InvalidTask, match=r"keys its dedupe by subject .* \.using\(subject=obj\)"):
        tasks_tools.reindex.enqueue("a")


@pytest.fixture
def cancel_on_user_delete() -> Iterator[None]:
    cancel_tasks_on_delete(User)
    yield
    post_delete.disconnect(
        sender=User, dispatch_uid="django_sqltasks.cancel_tasks_on_delete:auth.user"
    )


@pytest.mark.usefixtures("cancel_on_user_delete")
def test_deleting_a_row_cancels_its_ready_tasks(user: User) -> None:
    other = User.objects.create(username="grace")
    ready = tasks.add.using(subject=user).enqueue(1, 2)
    running = task_row(TaskResultStatus.RUNNING, subject_type="auth.user", subject_id=str(user.pk))
    unrelated = tasks.add.using(subject=other).enqueue(1, 2)
    pk = user.pk
    user.delete()
    cancelled = tasks.add.get_result(ready.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.errors[-1].exception_class_path.endswith("TaskCancelled")
    assert f"auth.user:{pk} was deleted" in cancelled.errors[-1].traceback
    assert TaskRecord.objects.get(id=running.id).status == TaskResultStatus.RUNNING
    assert tasks.add.get_result(unrelated.id).status == TaskResultStatus.READY


@pytest.mark.usefixtures("cancel_on_user_delete")
def test_the_cancel_rolls_back_with_the_delete(user: User) -> None:
    ready = tasks.add.using(subject=user).enqueue(1, 2)
    try:
        with transaction.atomic():
            User.objects.filter(pk=user.pk).delete()
            raise ZeroDivisionError
    except ZeroDivisionError:
        pass
    assert tasks.add.get_result(ready.id).status == TaskResultStatus.READY


def test_without_the_policy_a_delete_cancels_nothing(user: User) -> None:
    ready = tasks.add.using(subject=user).enqueue(1, 2)
    pk = user.pk
    user.delete()
    assert tasks.add.get_result(ready.id).status == TaskResultStatus.READY
    # cancel_ready_tasks() does it by hand, for a Subject too.
    assert cancel_ready_tasks(Subject("auth.user", str(pk)), reason="gone") == 1
    assert tasks.add.get_result(ready.id).errors[-1].traceback == "gone"


def test_cancel_tasks_on_delete_takes_models_only() -> None:
    with pytest.raises(TypeError, match="takes model classes"):
        cancel_tasks_on_delete("auth.User")


class UserAdmin(SubjectTasksMixin, admin.ModelAdmin):
    pass


def test_the_admin_mixin_shows_the_rows_tasks(user: User) -> None:
    superuser = User.objects.create_superuser("admin", "a@example.com", "pw")
    shown = tasks.add.using(subject=user).enqueue(1, 2)
    tasks.add.using(subject=superuser).enqueue(3, 4)  # another row's task: not shown
    model_admin = UserAdmin(User, admin.site)
    request = RequestFactory().get("/")
    request.user = superuser
    assert "subject_tasks" not in model_admin.get_readonly_fields(request, None)
    assert "subject_tasks" in model_admin.get_readonly_fields(request, user)
    response = model_admin.change_view(request, str(user.pk))
    html = response.render().content.decode()
    assert f"/admin/django_sqltasks/taskrecord/{shown.id}/change/" in html
    assert html.count("tests.tasks.add") == 1
    assert f"subject_type=auth.user&amp;subject_id={user.pk}" in html
    # The link to all of them filters the task list by subject.
    client = Client()
    client.force_login(superuser)
    listing = client.get(
        "/admin/django_sqltasks/taskrecord/",
        {"subject_type": "auth.user", "subject_id": str(user.pk)},
    )
    assert listing.status_code == 200
    assert shown.id in listing.content.decode()
    assert model_admin.subject_tasks(superuser).count("<tr>") == 2  # header and one task
    assert "No task" in model_admin.subject_tasks(User.objects.create(username="idle"))


def test_for_subject_uses_the_subject_index(user: User) -> None:
    TaskRecord.objects.bulk_create(
        [TaskRecord(task_path="tests.tasks.noop", backend_name="default") for _ in range(2000)]
    )
    tasks.add.using(subject=user).enqueue(1, 2)
    if connection.vendor == "mysql":
        pytest.skip("MySQL's plan for a tiny table in a transaction is not stable")
    with connection.cursor() as cursor:
        cursor.execute(
            "ANALYZE" if connection.vendor == "sqlite" else "ANALYZE django_sqltasks_taskrecord"
        )
    plan = TaskRecord.objects.for_subject(user).explain()
    assert plan_uses(plan, "sqltasks_subject_idx"), plan
