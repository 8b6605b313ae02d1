"""System checks and the migrations' agreement with the models."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_sqltasks import SQLTaskBackend
from django_sqltasks.compat import InvalidTaskBackend, task_backends
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.ops import checks
from django_sqltasks.sql import dialect_for
from tests import tasks

BASE = {"BACKEND": "django_sqltasks.SQLTaskBackend", "QUEUES": ["default"]}


def backend_with(options: dict[str, Any]) -> SQLTaskBackend:
    return SQLTaskBackend("custom", {**BASE, "OPTIONS": options})


def messages(backend: SQLTaskBackend) -> list[tuple[str, str]]:
    return [(m.id or "", m.msg) for m in backend.check()]


def test_default_configuration_passes() -> None:
    assert messages(task_backends["default"]) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"LEASE": 5}, "unknown option(s) LEASE"),
        ({"LEASE_TIMEOUT": 0}, "['LEASE_TIMEOUT'] must be a positive number of seconds"),
        ({"POLL_INTERVAL": "1"}, "['POLL_INTERVAL'] must be a positive number of seconds"),
        ({"HEARTBEAT_INTERVAL": 20}, "must be at most half of LEASE_TIMEOUT"),
        ({"MAX_PAYLOAD_BYTES": 0}, "['MAX_PAYLOAD_BYTES'] must be a positive integer or None"),
        ({"DATABASE": ""}, "['DATABASE'] must be a database alias"),
        ({"MAX_RESCUES": -1}, "['MAX_RESCUES'] must be a whole number (0 or more) or None"),
        ({"MAX_RESCUES": 2.5}, "['MAX_RESCUES'] must be a whole number (0 or more) or None"),
        (
            {"PRUNE_UNCLAIMED_EVENT_DAYS": "7"},
            "['PRUNE_UNCLAIMED_EVENT_DAYS'] must be a number of days (0 or more) or None",
        ),
    ],
)
def test_invalid_options_are_reported_by_name(options: dict[str, Any], message: str) -> None:
    backend = backend_with(options)
    found = messages(backend)
    assert len(found) == 1
    assert found[0][0] == "django_sqltasks.E002"
    assert message in found[0][1]
    assert "TASKS['custom']['OPTIONS']" in found[0][1]


def test_unknown_database_alias_is_reported() -> None:
    found = messages(backend_with({"DATABASE": "replica"}))
    assert found == [
        (
            "django_sqltasks.E003",
            "TASKS['custom']['OPTIONS']['DATABASE'] is 'replica', which is not in DATABASES.",
        )
    ]


def test_a_queue_limit_on_a_queue_outside_queues_is_reported() -> None:
    found = messages(backend_with({"QUEUE_LIMITS": {"emials": {"concurrency": 2}}}))
    assert found == [
        (
            "django_sqltasks.E013",
            "TASKS['custom']['OPTIONS']['QUEUE_LIMITS'] limits 'emials', which is not in "
            "QUEUES: no task can be in it, so the limit would hold nothing.",
        )
    ]
    assert messages(backend_with({"QUEUE_LIMITS": {"default": {"rate": "5/s"}}})) == []


def test_enqueue_refuses_to_run_with_invalid_options() -> None:
    with (
        override_settings(TASKS={"default": {**BASE, "OPTIONS": {"POLL_INTERVAL": -1}}}),
        pytest.raises(InvalidTaskBackend, match="POLL_INTERVAL"),
    ):
        tasks.noop.enqueue()


def test_missing_app_is_reported() -> None:
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]):
        found = list(backend_with({}).check())
    assert [m.id for m in found] == ["django_sqltasks.E001"]
    assert "the django_sqltasks app is not installed" in found[0].msg
    assert found[0].hint == "Add 'django_sqltasks' to INSTALLED_APPS, then run migrate."


def test_options_parse_keeps_defaults() -> None:
    opts = BackendOptions.parse("x", {})
    assert opts.lease_timeout == 30 and opts.poll_interval == 1 and opts.database is None
    with pytest.raises(OptionError):
        BackendOptions.parse("x", {"nope": 1})


@pytest.mark.django_db
def test_supported_database_version_passes() -> None:
    assert checks.unsupported_version(connection.alias) is None
    assert list(checks.check_database_versions(databases=[connection.alias])) == []


def test_too_old_version_message_names_what_is_needed() -> None:
    from django_sqltasks.sql.postgresql import MIN_VERSION as MIN_POSTGRESQL
    from django_sqltasks.sql.sqlite import MIN_VERSION as MIN_SQLITE

    dialect = dialect_for(connection)
    dialect_product = dialect.product
    try:
        dialect.product = "SQLite"
        assert dialect._too_old((3, 31, 1), MIN_SQLITE) == (
            "Database 'default' runs SQLite 3.31.1; django-sqltasks needs SQLite 3.35 or newer."
        )
        dialect.product = "PostgreSQL"
        assert "needs PostgreSQL 13 or newer" in dialect._too_old((12, 5), MIN_POSTGRESQL)
    finally:
        dialect.product = dialect_product


@pytest.mark.django_db
def test_models_and_migrations_agree() -> None:
    out = io.StringIO()
    call_command("makemigrations", "django_sqltasks", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def _postgres(name: str) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.postgresql", "NAME": name, "PORT": 6432}


# The check reads DATABASES only (it makes no connection), so adding aliases for a test is safe.
extra_databases = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


@pytest.mark.parametrize(
    ("databases", "options", "message"),
    [
        (
            {},
            {"LISTEN_DATABASE": "direct"},
            "TASKS['custom']['OPTIONS']['LISTEN_DATABASE'] is 'direct', which is not in DATABASES.",
        ),
        (
            {"tasks": _postgres("app"), "direct": _postgres("app")},
            {"DATABASE": "tasks", "LISTEN_DATABASE": "direct", "NOTIFY": False},
            "TASKS['custom']['OPTIONS']['LISTEN_DATABASE'] is 'direct', but NOTIFY is False: "
            "enqueues send no notification and workers do not listen, so the option would do "
            "nothing.",
        ),
        (
            {"tasks": _postgres("app"), "direct": {"ENGINE": "django.db.backends.sqlite3"}},
            {"DATABASE": "tasks", "LISTEN_DATABASE": "direct"},
            "TASKS['custom']['OPTIONS']['LISTEN_DATABASE'] is 'direct', but "
            "DATABASES['direct'] is sqlite, not PostgreSQL: only PostgreSQL workers listen for new "
            "tasks.",
        ),
        (
            {"tasks": {"ENGINE": "django.db.backends.sqlite3"}, "direct": _postgres("app")},
            {"DATABASE": "tasks", "LISTEN_DATABASE": "direct"},
            "TASKS['custom']['OPTIONS']['LISTEN_DATABASE'] is 'direct', but "
            "DATABASES['tasks'] is sqlite, not PostgreSQL: only PostgreSQL workers listen for new "
            "tasks.",
        ),
        (
            {"tasks": _postgres("app"), "direct": _postgres("app_direct")},
            {"DATABASE": "tasks", "LISTEN_DATABASE": "direct"},
            "TASKS['custom']['OPTIONS']['LISTEN_DATABASE'] is 'direct', whose NAME "
            "'app_direct' is not the NAME of the tasks' database 'tasks' ('app'): a NOTIFY "
            "reaches only the sessions of the database it is sent in, so the workers would "
            "never be woken.",
        ),
    ],
    ids=["unknown-alias", "notify-off", "not-postgresql", "tasks-not-postgresql", "other-name"],
)
@extra_databases
def test_a_listen_database_that_cannot_work_is_reported(
    settings: Any, databases: dict[str, Any], options: dict[str, Any], message: str
) -> None:
    settings.DATABASES = {**settings.DATABASES, **databases}
    found = messages(backend_with(options))
    assert found == [("django_sqltasks.E015", message)]


@extra_databases
def test_a_listen_database_reaching_the_same_database_passes(settings: Any) -> None:
    settings.DATABASES = {
        **settings.DATABASES,
        "tasks": _postgres("app"),
        "direct": {**_postgres("app"), "PORT": 5432},
    }
    assert messages(backend_with({"DATABASE": "tasks", "LISTEN_DATABASE": "direct"})) == []
    found = messages(backend_with({"LISTEN_DATABASE": ""}))
    assert found[0][0] == "django_sqltasks.E002"
    assert "['LISTEN_DATABASE'] must be a database alias" in found[0][1]


@extra_databases
@pytest.mark.parametrize(
    ("pool", "warned"),
    [
        (True, None),  # psycopg_pool's default size, 4: three for the tasks
        ({"min_size": 1, "max_size": 1}, 1),
        ({"min_size": 1}, 1),  # max_size defaults to min_size
        ({"min_size": 1, "max_size": 2}, None),
        ({"min_size": 2, "max_size": 10}, None),
    ],
)
def test_a_pool_too_small_for_a_worker_s_own_connections_is_reported(
    settings: Any, pool: Any, warned: int | None
) -> None:
    settings.DATABASES = {
        **settings.DATABASES,
        "tasks": {**_postgres("app"), "OPTIONS": {"pool": pool}},
    }
    found = messages(backend_with({"DATABASE": "tasks"}))
    if warned is None:
        assert found == []
        return
    assert found == [
        (
            "django_sqltasks.W006",
            f"DATABASES['tasks']['OPTIONS']['pool'] allows {warned} connection(s) (max_size), "
            "and a worker holds 1 of its own from it (its database thread's, which also "
            "writes outcomes): its tasks that use the ORM would wait for a connection, and fail "
            "after the pool's timeout.",
        )
    ]
