"""The configured django-sqltasks backends: each found by its alias, with its parsed OPTIONS,
without importing the backend module (which sits above every layer that needs this)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from django.conf import settings as django_settings

from ..compat import InvalidTaskBackend, task_backends
from .options import BackendOptions, OptionError


class SQLBackend(Protocol):
    """What the layers below the backend may use of a ``SQLTaskBackend``."""

    @property
    def alias(self) -> str: ...

    @property
    def queues(self) -> Collection[str]: ...

    @property
    def config(self) -> BackendOptions: ...

    @property
    def options_error(self) -> OptionError | None: ...

    @property
    def tracing(self) -> Any: ...

    @property
    def database(self) -> str: ...

    def validate_task(self, task: Any) -> None: ...

    def get_result(self, result_id: str) -> Any: ...

    def pause_queue(self, queue_name: str) -> bool: ...

    def resume_queue(self, queue_name: str) -> bool: ...

    def paused_queues(self) -> list[str]: ...

    def run_now(self, result_id: str) -> bool: ...

    def set_queue_limit(
        self, queue_name: str, *, concurrency: int | None = None, rate: str | None = None
    ) -> bool: ...

    def clear_queue_limit(self, queue_name: str) -> bool: ...

    def check_usable(self) -> None: ...

    def new_row(self, task: Any, args: Any, kwargs: Any) -> tuple[Any, Any]: ...

    def enqueue_workflow(
        self, root: Any, tasks: dict[int, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> Any: ...

    def get_workflow(self, workflow_id: str) -> Any: ...

    def workflow_of(self, result_id: str) -> Any: ...

    def cancel_workflow(self, workflow_id: str) -> bool: ...


def is_sql_backend(backend: object) -> bool:
    """Whether ``backend`` is a django-sqltasks backend (a ``SQLTaskBackend``, or a subclass)."""
    return isinstance(getattr(backend, "config", None), BackendOptions)


def queues_on(database: str) -> dict[str, set[str]]:
    """The QUEUES of each django-sqltasks backend keeping its tasks in ``database``."""
    return {
        alias: set(backend.queues)
        for alias, backend in sql_backends().items()
        if backend.database == database
    }


def sql_backends() -> dict[str, SQLBackend]:
    """The configured django-sqltasks backends, by alias (others are left out, and so are
    those whose BACKEND fails to load: check error E020 reports them)."""
    found: dict[str, SQLBackend] = {}
    for alias in django_settings.TASKS:
        try:
            backend = task_backends[alias]
        except InvalidTaskBackend:
            continue
        if is_sql_backend(backend):
            found[alias] = backend  # type: ignore[assignment]
    return found


def sql_backend(alias: str) -> SQLBackend:
    """The django-sqltasks backend named ``alias``; raise ``InvalidTaskBackend`` for an unknown
    alias or a backend of another kind, naming it."""
    backend = task_backends[alias]  # raises InvalidTaskBackend for an unknown alias
    if not is_sql_backend(backend):
        raise InvalidTaskBackend(
            f"{alias!r} is not a django_sqltasks SQLTaskBackend (its BACKEND is "
            f"{type(backend).__qualname__})."
        )
    return backend  # type: ignore[return-value]


def backend_config(alias: str) -> BackendOptions | None:
    """The parsed OPTIONS of django-sqltasks backend ``alias``; None for an unknown or broken
    alias, or a backend of another kind."""
    try:
        backend = task_backends[alias]
    except Exception:  # an unknown alias, or one whose backend fails to build
        return None
    config = getattr(backend, "config", None)
    return config if isinstance(config, BackendOptions) else None
