"""The system checks of one backend's configuration (OPTIONS, QUEUES), run by Django's tasks
check through ``SQLTaskBackend.check()``: no database, no models. The checks that query a
database are in ``ops/checks.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..exceptions import InvalidTaskArguments
from . import tracing
from .backends import SQLBackend
from .binding import check_binds
from .columns import MAX_NAME_LENGTH
from .resolve import resolve_task

# The connections a worker process takes from Django's pool of its tasks database and holds:
# its database thread's, which also writes its outcomes on PostgreSQL (its periodic thread takes
# one only while a tick runs: docs/worker.md).
WORKER_OWN_POOLED = 1
POOL_MIN_SIZE = 4  # psycopg_pool's default min_size (and so max_size), as "pool": True gives


def check_backend(
    backend: SQLBackend, engine_vendor: Callable[[str], str]
) -> Iterable[checks.CheckMessage]:
    """Check one backend's configuration (run by Django's tasks check); ``engine_vendor``
    names the vendor of a DATABASES ENGINE (``sql.engine_vendor``: a database's fact, from
    the layer above this one)."""
    name = f"TASKS[{backend.alias!r}]"
    if not apps.is_installed("django_sqltasks"):
        yield checks.Error(
            f"{name} uses django_sqltasks.SQLTaskBackend, but the django_sqltasks app is not "
            "installed.",
            hint="Add 'django_sqltasks' to INSTALLED_APPS, then run migrate.",
            id="django_sqltasks.E001",
        )
    if backend.options_error is not None:
        yield checks.Error(
            str(backend.options_error),
            hint="See the OPTIONS reference in the django-sqltasks documentation.",
            id="django_sqltasks.E002",
        )
        return
    too_long = [q for q in backend.queues if len(q) > MAX_NAME_LENGTH]
    if too_long:
        yield checks.Error(
            f"{name}['QUEUES'] has queue name(s) longer than {MAX_NAME_LENGTH} characters: "
            f"{', '.join(map(repr, too_long))}; no task could be stored in them.",
            hint=f"Shorten them to at most {MAX_NAME_LENGTH} characters.",
            id="django_sqltasks.E004",
        )
    database = backend.config.database
    if database is not None and database not in settings.DATABASES:
        yield checks.Error(
            f"{name}['OPTIONS']['DATABASE'] is {database!r}, which is not in DATABASES.",
            hint=f"Use one of: {', '.join(sorted(settings.DATABASES))}.",
            id="django_sqltasks.E003",
        )
    on_commit = backend.config.enqueue_on_commit
    if isinstance(on_commit, str) and on_commit not in settings.DATABASES:
        yield checks.Error(
            f"{name}['OPTIONS']['ENQUEUE_ON_COMMIT'] is {on_commit!r}, which is not in DATABASES.",
            hint="Name the database whose transactions the enqueue should wait for, or use True.",
            id="django_sqltasks.E006",
        )
    if backend.config.tracing and not tracing.available():
        yield checks.Error(
            f"{name}['OPTIONS']['TRACING'] is True, but the OpenTelemetry API is not "
            "installed: no span is made.",
            hint="pip install 'django-sqltasks[otel]' (and the OpenTelemetry SDK to export).",
            id="django_sqltasks.E012",
        )
    unknown = sorted(set(backend.config.queue_limits) - set(backend.queues))
    if backend.queues and unknown:
        yield checks.Error(
            f"{name}['OPTIONS']['QUEUE_LIMITS'] limits {', '.join(map(repr, unknown))}, which "
            f"is not in QUEUES: no task can be in it, so the limit would hold nothing.",
            hint=f"Use one of QUEUES ({', '.join(backend.queues)}), or add the queue to it.",
            id="django_sqltasks.E013",
        )
    if backend.config.listen_database is not None and apps.is_installed("django_sqltasks"):
        yield from _check_listen_database(backend, name, engine_vendor)
    if apps.is_installed("django_sqltasks"):
        yield from _check_pool(backend)
    yield from _check_periodic(backend, name)


def _check_listen_database(
    backend: SQLBackend, name: str, engine_vendor: Callable[[str], str]
) -> Iterable[checks.CheckMessage]:
    """LISTEN_DATABASE: another way to the same PostgreSQL database, for the workers' LISTEN."""
    where = f"{name}['OPTIONS']['LISTEN_DATABASE']"
    listen = backend.config.listen_database
    assert listen is not None
    database = backend.database
    databases = settings.DATABASES
    hint = (
        "Point it at an alias of DATABASES that reaches the tasks' PostgreSQL database directly "
        "(not through a pooler in transaction mode), with the same NAME."
    )
    if listen not in databases:
        yield checks.Error(
            f"{where} is {listen!r}, which is not in DATABASES.",
            hint=f"Use one of: {', '.join(sorted(databases))}.",
            id="django_sqltasks.E015",
        )
        return
    if database not in databases:
        return  # E003 says so
    if not backend.config.notify:
        yield checks.Error(
            f"{where} is {listen!r}, but NOTIFY is False: enqueues send no notification and "
            "workers do not listen, so the option would do nothing.",
            hint="Set NOTIFY to True (a NOTIFY goes through a pooler in transaction mode: it "
            "rides in the enqueue's INSERT), or remove LISTEN_DATABASE.",
            id="django_sqltasks.E015",
        )
        return
    for alias in dict.fromkeys((database, listen)):
        vendor = _vendor(databases[alias], engine_vendor)
        if vendor != "postgresql":
            yield checks.Error(
                f"{where} is {listen!r}, but DATABASES[{alias!r}] is {vendor}, not PostgreSQL: "
                "only PostgreSQL workers listen for new tasks.",
                hint=hint,
                id="django_sqltasks.E015",
            )
            return
    names = {alias: databases[alias].get("NAME") for alias in (database, listen)}
    if names[database] != names[listen]:
        yield checks.Error(
            f"{where} is {listen!r}, whose NAME {names[listen]!r} is not the NAME of the tasks' "
            f"database {database!r} ({names[database]!r}): a NOTIFY reaches only the sessions "
            "of the database it is sent in, so the workers would never be woken.",
            hint=f"{hint} In tests, give it 'TEST': {{'MIRROR': {database!r}}}.",
            id="django_sqltasks.E015",
        )


def _check_pool(backend: SQLBackend) -> Iterable[checks.CheckMessage]:
    """Django's connection pool of the tasks database: room for a worker's task threads."""
    database = backend.database
    pool = settings.DATABASES.get(database, {}).get("OPTIONS", {}).get("pool")
    if not pool:
        return
    size = pool_max_size(pool)
    if size is not None and size <= WORKER_OWN_POOLED:
        yield checks.Warning(
            f"DATABASES[{database!r}]['OPTIONS']['pool'] allows {size} connection(s) "
            f"(max_size), and a worker holds {WORKER_OWN_POOLED} of its own from it (its "
            "database thread's, which also writes outcomes): its tasks that use the ORM would "
            "wait for a connection, and fail after the pool's timeout.",
            hint=f"Set 'max_size' to {WORKER_OWN_POOLED} plus the tasks a worker process "
            "should run on the ORM at once (docs: The worker, Database connections).",
            id="django_sqltasks.W006",
        )


def pool_max_size(pool: Any) -> int | None:
    """The most connections Django's ``OPTIONS["pool"]`` allows (psycopg_pool's defaults:
    ``min_size`` 4, ``max_size`` its ``min_size``); None if it cannot tell."""
    if pool is True:
        return POOL_MIN_SIZE
    if not isinstance(pool, Mapping):
        return None
    size = pool.get("max_size") or pool.get("min_size", POOL_MIN_SIZE)
    return size if isinstance(size, int) else None


def _vendor(database: Mapping[str, Any], engine_vendor: Callable[[str], str]) -> str:
    """The vendor of a DATABASES entry's ENGINE, or why there is none."""
    engine = str(database.get("ENGINE") or "")
    try:
        return engine_vendor(engine)
    except ImproperlyConfigured:
        return f"the engine {engine!r}, which does not load"


def _check_periodic(backend: SQLBackend, name: str) -> Iterable[checks.CheckMessage]:
    for schedule in backend.config.periodic.values():
        try:
            task = resolve_task(schedule.task_path, backend=backend.alias)
        except Exception as e:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]: {e}",
                hint="Point 'task' at a function decorated with @task.",
                id="django_sqltasks.E005",
            )
            continue
        try:
            check_binds(task, schedule.args, schedule.kwargs)
        except InvalidTaskArguments as e:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]: {e}",
                hint="Give 'args' and 'kwargs' that the task's function takes.",
                id="django_sqltasks.E005",
            )
        queue = schedule.queue_name
        if queue is not None and backend.queues and queue not in backend.queues:
            yield checks.Error(
                f"{name}['OPTIONS']['PERIODIC'][{schedule.name!r}]['queue_name'] is "
                f"{queue!r}, which is not in QUEUES.",
                hint=f"Use one of QUEUES ({', '.join(backend.queues)}), or add it.",
                id="django_sqltasks.E005",
            )
