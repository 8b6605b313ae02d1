"""The tasks system check: this app's replaces Django's, and a backend that cannot be loaded is
one error while the others are still checked."""

from __future__ import annotations

import sys

import pytest
from django.core import checks
from django.test import override_settings
from django.urls import clear_url_caches

from django_sqltasks.compat import task_backends
from django_sqltasks.core import tasks_check

WRONG_PATH = {
    "default": {"BACKEND": "django_sqltasks.SQLTasksBackend"},  # "Tasks": a typo
    "other": {"BACKEND": "django_sqltasks.backend.SQLTaskBackend", "QUEUES": ["x" * 300]},
}


@pytest.mark.django_db
def test_a_wrong_backend_path_is_one_check_error_and_the_others_are_still_checked() -> None:
    with override_settings(TASKS=WRONG_PATH):
        # The database checks too (check --database), which look up this app's backends.
        found = checks.run_checks(databases=["default"])
    ids = [message.id for message in found]
    assert ids.count("django_sqltasks.E020") == 1
    assert "django_sqltasks.E004" in ids  # the other backend's queue name, still checked
    [error] = [message for message in found if message.id == "django_sqltasks.E020"]
    assert error.msg == (
        "TASKS['default']['BACKEND'] is 'django_sqltasks.SQLTasksBackend', which cannot be "
        'loaded: Module "django_sqltasks" does not define a "SQLTasksBackend" attribute/class'
    )
    assert "'django_sqltasks.backend.SQLTaskBackend'" in str(error.hint)


def test_djangos_own_tasks_check_is_replaced() -> None:
    """Django's check raises at the first backend it cannot load (a 70-line traceback from
    ``manage.py check``); only this app's runs."""
    registered = checks.registry.registry.registered_checks
    names = {f"{check.__module__}.{check.__name__}" for check in registered}
    assert f"{tasks_check.__name__}.check_tasks" in names
    module = type(task_backends).__module__
    assert f"{module}.checks.check_tasks" not in names


@pytest.mark.django_db
def test_a_wrong_backend_path_met_by_the_url_check_is_e020_not_a_traceback() -> None:
    """Django's URL checks import the URLconf, whose views declare tasks, which build their
    backend: a BACKEND typo raised there first (a 97-line traceback from ``manage.py check``).
    It is E020, and one warning that the URLconf was not checked."""
    sys.modules.pop("tests.urls_task_at_import", None)
    with override_settings(TASKS=WRONG_PATH, ROOT_URLCONF="tests.urls_task_at_import"):
        clear_url_caches()
        try:
            found = checks.run_checks(databases=["default"])
        finally:
            sys.modules.pop("tests.urls_task_at_import", None)
            clear_url_caches()
    ids = [message.id for message in found]
    assert ids.count("django_sqltasks.E020") == 1
    assert ids.count("django_sqltasks.W021") == 1, ids
