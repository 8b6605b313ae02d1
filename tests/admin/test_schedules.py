"""The admin's periodic tasks: made and edited there, checked field by field, with a preview of
their next runs; those of settings' PERIODIC editable only in 'enabled'."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from django_sqltasks.models import ScheduleRecord
from django_sqltasks.store.schedules import sync_settings
from tests.conftest import set_backend_options

pytestmark = pytest.mark.django_db

TICK = "tests.tasks.tick"
ADD = "admin:django_sqltasks_schedulerecord_add"
CHANGELIST = "admin:django_sqltasks_schedulerecord_changelist"


@pytest.fixture
def client() -> Client:
    # No password: hashing one costs more than the test.
    user = User.objects.create(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def form(**fields: Any) -> dict[str, Any]:
    data = {
        "backend_name": "default",
        "name": "nightly",
        "enabled": "on",
        "task_path": TICK,
        "args": "[]",
        "kwargs": "{}",
        "cron": "0 3 * * *",
        "time_zone": "Europe/Paris",
        "every": "",
        "queue_name": "",
        "priority": "",
    }
    data.update(fields)
    return {k: v for k, v in data.items() if v is not None}


def change_url(row: ScheduleRecord) -> str:
    return reverse("admin:django_sqltasks_schedulerecord_change", args=[row.pk])


def test_a_schedule_made_in_the_admin_shows_its_next_runs(client: Client) -> None:
    response = client.post(
        reverse(ADD), form(kwargs='{"label": "nightly"}', queue_name="other", priority="5")
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    row = ScheduleRecord.objects.get(name="nightly")
    assert (row.origin, row.enabled, row.last_slot, row.revision) == ("admin", True, None, 0)
    assert (row.cron, row.time_zone, row.every) == ("0 3 * * *", "Europe/Paris", None)
    assert (row.kwargs, row.queue_name, row.priority) == ({"label": "nightly"}, "other", 5)
    body = client.get(change_url(row)).content.decode()
    assert body.count("<li><time datetime=") == 5
    first = body.split('<time datetime="')[1].split('"')[0]
    run = datetime.fromisoformat(first)
    assert (run.hour, run.minute) in {(1, 0), (2, 0)}  # 03:00 in Paris: 02:00 UTC, or 01:00
    assert "Europe/Paris" in body
    listing = client.get(reverse(CHANGELIST)).content.decode()
    assert "0 3 * * * (Europe/Paris)" in listing and "nightly" in listing


def test_the_add_page_starts_with_empty_arguments(client: Client) -> None:
    body = client.get(reverse(ADD)).content.decode()
    assert ">\n[]</textarea>" in body and ">\n{}</textarea>" in body


def test_the_add_page_offers_the_declared_tasks_and_the_queues(client: Client) -> None:
    """Typed freely (the form checks them), with the project's tasks and QUEUES offered."""
    body = client.get(reverse(ADD)).content.decode()
    assert 'list="id_task_path_options"' in body and '<datalist id="id_task_path_options">' in body
    assert '<option value="tests.tasks.noop">' in body
    assert 'list="id_queue_name_options"' in body
    for queue in ("default", "other", "slow"):
        assert f'<option value="{queue}">' in body


def test_an_interval_schedule(client: Client) -> None:
    response = client.post(reverse(ADD), form(cron="", time_zone="", every="90"))
    assert response.status_code == 302
    assert ScheduleRecord.objects.get(name="nightly").every == 90.0


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        # cron
        ({"cron": "nope"}, "cron", "is not a valid cron expression"),
        ({"cron": "61 * * * *"}, "cron", "is not a valid cron expression"),
        ({"cron": "0 0 31 2 *"}, "cron", "never fires: &#x27;0 0 31 2 *&#x27; names no date"),
        ({"cron": "* * * * *\x00"}, "cron", "Null characters are not allowed"),
        ({"cron": "*" * 5000}, "cron", "at most 200 characters"),
        ({"cron": "", "every": ""}, "cron", "Give a cron expression or an interval"),
        ({"every": "60"}, "cron", "not both"),
        # every
        *[
            ({"cron": "", "time_zone": "", "every": every}, "every", message)
            for every, message in [
                ("0", "must be a number of seconds from 1"),
                ("0.5", "must be a number of seconds from 1"),
                ("-5", "must be a number of seconds from 1"),
                ("1e300", "must be a number of seconds from 1"),
                ("40000000", "must be a number of seconds from 1"),
                ("nan", "Enter a number"),
                ("inf", "Enter a number"),
                ("sixty", "Enter a number"),
            ]
        ],
        ({"cron": "", "every": "60"}, "time_zone", "A time zone applies to cron only"),
        # time zone
        ({"time_zone": "Mars/Base"}, "time_zone", "must be an IANA time zone name"),
        ({"time_zone": "../../etc/passwd"}, "time_zone", "must be an IANA time zone name"),
        ({"time_zone": "/etc/passwd"}, "time_zone", "must be an IANA time zone name"),
        ({"time_zone": "x" * 500}, "time_zone", "at most 64 characters"),
        # five fields: croniter reads a sixth (seconds), which the field and the docs do not
        ({"cron": "*/10 * * * * *"}, "cron", "must have five fields"),
        ({"cron": "0 3 * * * 2030"}, "cron", "must have five fields"),
        # task path
        ({"task_path": "tick"}, "task_path", "must be the dotted path of a @task function"),
        ({"task_path": "tests.tasks.renamed_since"}, "task_path", "does not import"),
        ({"task_path": "tests.tasks.NOT_A_TASK"}, "task_path", "not a Task"),
        ({"task_path": "this.s"}, "task_path", "was not imported"),
        ({"task_path": "os.system"}, "task_path", "not a Task"),
        ({"task_path": "tests.tasks_hardening.on_immediate"}, "task_path", "declared for backend"),
        ({"task_path": "a." * 300}, "task_path", "at most 255 characters"),
        # arguments
        ({"args": "[NaN]"}, "args", "args[0] is nan, which JSON cannot represent"),
        ({"kwargs": '{"label": Infinity}'}, "kwargs", "kwargs[&#x27;label&#x27;] is inf"),
        ({"args": '["\\ud800"]'}, "args", "contains a lone surrogate"),
        ({"args": '["a\\u0000b"]'}, "args", "contains a NUL character"),
        ({"kwargs": '{"\\u0000": 1}'}, "kwargs", "contains a NUL character"),
        ({"args": "[" + "9" * 30 + "]"}, "args", "outside the signed 64-bit range"),
        ({"args": "[" + "9" * 5000 + "]"}, "args", "Enter valid JSON"),
        ({"args": DEEP}, "args", "Enter valid JSON"),
        ({"args": "[" * 40 + "]" * 40}, "args", "nested more than 30 levels deep"),
        ({"args": "{not json"}, "args", "Enter valid JSON"),
        ({"args": '{"a": 1}'}, "args", "Enter a JSON list"),
        ({"kwargs": "[1]"}, "kwargs", "Enter a JSON object"),
        ({"kwargs": '{"unexpected": 1}'}, "kwargs", "unexpected keyword argument"),
        ({"args": "[1, 2, 3]"}, "args", "too many positional arguments"),
        ({"args": '["' + "x" * 1_100_000 + '"]'}, "args", "over the backend&#x27;s MAX_PAYLOAD"),
        # queue, priority, name
        ({"queue_name": "nowhere"}, "queue_name", "is not a queue of backend"),
        ({"priority": "101"}, "priority", "must be a whole number from -100 to 100"),
        ({"priority": "-1000"}, "priority", "must be a whole number from -100 to 100"),
        ({"name": ""}, "name", "This field is required"),
        ({"name": "n" * 201}, "name", "at most 200 characters"),
        ({"backend_name": "immediate"}, "backend_name", "Select a valid choice"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_bad_input_is_a_form_error_on_its_field(
    client: Client, fields: dict[str, Any], field: str, message: str
) -> None:
    response = client.post(reverse(ADD), form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors, errors
    assert message in response.content.decode(), errors
    assert not ScheduleRecord.objects.exists()


def test_a_name_of_settings_periodic_is_refused(client: Client, settings: Any) -> None:
    set_backend_options(settings, PERIODIC={"nightly": {"task": TICK, "every": 60}})
    response = client.post(reverse(ADD), form())
    assert "declares a schedule of this name" in response.content.decode()
    assert not ScheduleRecord.objects.exists()


def _settings_row(settings: Any) -> ScheduleRecord:
    set_backend_options(settings, PERIODIC={"from-settings": {"task": TICK, "every": 60}})
    from django_sqltasks.compat import task_backends

    sync_settings(task_backends["default"])  # as a worker does at its start
    return ScheduleRecord.objects.get(name="from-settings")


def test_a_schedule_from_settings_is_edited_in_enabled_only(client: Client, settings: Any) -> None:
    row = _settings_row(settings)
    body = client.get(change_url(row)).content.decode()
    assert "only &#x27;enabled&#x27; is changed here" in body
    assert 'name="enabled"' in body and 'name="every"' not in body and 'name="cron"' not in body
    assert "deletelink" not in body
    response = client.post(change_url(row), {"every": "5", "cron": "* * * * *"})
    assert response.status_code == 302  # enabled unticked; the rest is not a field of the form
    row.refresh_from_db()
    assert (row.enabled, row.every, row.cron, row.revision) == (False, 60.0, "", 1)
    delete = reverse("admin:django_sqltasks_schedulerecord_delete", args=[row.pk])
    assert client.post(delete, {"post": "yes"}).status_code == 403


def test_a_schedule_removed_from_settings_says_so(client: Client, settings: Any) -> None:
    row = _settings_row(settings)
    set_backend_options(settings, PERIODIC={})
    from django_sqltasks.compat import task_backends

    assert sync_settings(task_backends["default"]).removed == ["from-settings"]
    row.refresh_from_db()
    assert (row.origin, row.enabled) == ("removed", False)
    listing = client.get(reverse(CHANGELIST)).content.decode()
    assert "removed from settings" in listing
    body = client.get(change_url(row)).content.decode()
    assert "disabled, not deleted" in body and 'name="enabled"' not in body


def test_a_save_writes_only_what_it_changed(client: Client) -> None:
    """A worker's election between the page's load and its save is not undone."""
    client.post(reverse(ADD), form(cron="", time_zone="", every="60"))
    row = ScheduleRecord.objects.get()
    slot = datetime(2030, 1, 1, 10, 0, tzinfo=datetime.now().astimezone().tzinfo)
    ScheduleRecord.objects.filter(pk=row.pk).update(last_slot=slot)  # a worker's election
    data = form(cron="", time_zone="", every="60", priority="7")
    assert client.post(change_url(row), data).status_code == 302
    row.refresh_from_db()
    assert (row.priority, row.last_slot, row.revision) == (7, slot, 1)
    # A new timing starts afresh: the next slot of the new timing is its first run.
    assert client.post(change_url(row), {**data, "every": "120"}).status_code == 302
    row.refresh_from_db()
    assert (row.every, row.last_slot, row.revision) == (120.0, None, 2)


def test_enable_and_disable_actions(client: Client, settings: Any) -> None:
    row = _settings_row(settings)
    ScheduleRecord.objects.filter(pk=row.pk).update(last_slot=datetime(2030, 1, 1).astimezone())
    url = reverse(CHANGELIST)
    client.post(url, {"action": "disable_selected", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert (row.enabled, row.revision) == (False, 1)
    response = client.post(
        url, {"action": "enable_selected", "_selected_action": [row.pk]}, follow=True
    )
    assert "Enabled 1 periodic task(s)." in response.content.decode()
    row.refresh_from_db()
    assert (row.enabled, row.last_slot, row.revision) == (True, None, 2)


def test_a_broken_row_shows_why_instead_of_a_500(client: Client) -> None:
    row = ScheduleRecord.objects.create(
        backend_name="default", name="broken", origin="admin", task_path=TICK, cron="61 * * * *"
    )
    assert "is not a valid cron expression" in client.get(reverse(CHANGELIST)).content.decode()
    body = client.get(change_url(row)).content.decode()
    assert "This schedule cannot run" in body


# A browser cannot send a lone surrogate (it encodes text as UTF-8, and Django decodes what is
# not UTF-8 with replacement characters), but a form is also a Python API.
@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"cron": "\ud800 * * * *"}, "cron", "is not a valid cron expression"),
        ({"time_zone": "Europe/Paris\ud800"}, "time_zone", "must be an IANA time zone name"),
        ({"task_path": "tests.tasks.\ud800"}, "task_path", "must be the dotted path"),
        ({"queue_name": "q\ud800"}, "queue_name", "must be a queue name"),
        ({"name": "n\ud800"}, "name", "contains a lone surrogate"),
    ],
)
def test_lone_surrogates_are_form_errors(fields: dict[str, Any], field: str, message: str) -> None:
    from django_sqltasks.admin.schedule_form import ScheduleForm

    bound = ScheduleForm(data=form(**fields))
    assert not bound.is_valid()
    assert field in bound.errors
    assert message in " ".join(bound.errors[field])


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"cron": "*/15 * * * *", "time_zone": "Asia/Tokyo"}, "Asia/Tokyo"),
        ({"every": "3600"}, "<li><time"),
        ({"cron": "nope"}, "is not a valid cron expression"),
        ({"cron": "0 0 31 2 *"}, "never fires"),
        ({"cron": "* * * * *\x00"}, "is not a valid cron expression"),
        ({"cron": "* * * * *", "time_zone": "../../etc/passwd"}, "IANA time zone"),
        ({"every": "nan"}, "must be a number of seconds from 1"),
        ({"every": "1e400"}, "must be a number of seconds from 1"),
        ({"every": "soon"}, "every must be a number of seconds"),
        ({"cron": "* * * * *", "every": "60"}, "needs exactly one of"),
        ({}, "Give a cron expression or an interval to see the next runs."),
    ],
)
def test_the_preview_of_a_timing_being_typed(
    client: Client, params: dict[str, str], expected: str
) -> None:
    url = reverse("admin:django_sqltasks_schedulerecord_preview")
    response = client.get(url, {"backend_name": "default", **params})
    assert response.status_code == 200
    body = response.content.decode()
    assert expected in body, body
    # The schedule being typed has no name yet: its errors do not read "Schedule '' of ...".
    assert "Schedule &#x27;&#x27;" not in body and "[&#x27;" not in body, body
    if "<li>" in expected:
        assert body.count("<li><time") == 5


def test_the_preview_needs_a_staff_user_with_the_permission() -> None:
    url = reverse("admin:django_sqltasks_schedulerecord_preview")
    assert Client().get(url, {"every": "60"}).status_code == 302  # to the login page
    clerk = User.objects.create(username="clerk", is_staff=True)
    client = Client()
    client.force_login(clerk)
    assert client.get(url, {"every": "60"}).status_code == 403


def test_the_delete_action_keeps_schedules_from_settings(client: Client, settings: Any) -> None:
    kept = _settings_row(settings)
    made = ScheduleRecord.objects.create(
        backend_name="default", name="made", origin="admin", task_path=TICK, every=60
    )
    url = reverse(CHANGELIST)
    selected = {"action": "delete_selected", "_selected_action": [kept.pk, made.pk]}
    response = client.post(url, selected)
    assert "1 periodic task(s) from OPTIONS[&#x27;PERIODIC&#x27;] were not deleted" in (
        response.content.decode()
    )
    client.post(url, {**selected, "post": "yes"})
    assert list(ScheduleRecord.objects.values_list("name", flat=True)) == ["from-settings"]
