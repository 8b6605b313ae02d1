"""Turning dotted paths from stored rows into tasks: the trust boundary.

A row is trusted to *name* a module, never to bring code. A task path is imported only if its
module is already loaded or belongs to an installed app (or to the backend's TASK_MODULES), it
must name a ``Task`` object, and the backend whose row names it must be one that may run it:
the backend the task is declared for, or another django-sqltasks backend keeping its tasks in
the same database (``may_run``).
Anything else is refused before it can run; reading such a row (``task.result_from_row``)
returns its stored result with a stand-in task that says why.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from functools import lru_cache

from django.apps import AppConfig, apps
from django.utils.module_loading import import_string

from ..compat import InvalidTaskBackend, Task, task_backends
from ..exceptions import TaskBackendMismatch, TaskNotFound
from .articles import a_or_an
from .backends import backend_config, sql_backend


def resolve_task(task_path: str, *, backend: str | None = None) -> Task:
    """Import ``task_path`` and check that it names a ``Task``; raise ``TaskNotFound`` if not.

    The module is imported only if it is already loaded or belongs to an allowed package (see
    ``allowed_modules``). With ``backend``, the task must also be declared for that backend.
    """
    _check_importable(task_path, backend)
    task = _import_task(task_path)
    if backend is not None:
        check_backend(task, backend)
    return task


@lru_cache(maxsize=1024)
def _import_task(task_path: str) -> Task:
    try:
        obj = import_string(task_path)
    except ImportError as e:
        raise TaskNotFound(f"Task path {task_path!r} does not import: {e}") from e
    if not isinstance(obj, Task):
        raise TaskNotFound(
            f"Task path {task_path!r} names {a_or_an(type(obj).__name__)}, not a Task: only "
            "functions "
            "decorated with @task can be run."
        )
    return obj


def _check_importable(task_path: str, backend: str | None) -> None:
    """Refuse, without importing anything, a path whose module the project has not vouched for."""
    module, _, _ = task_path.rpartition(".")
    if not module or not all(part.isidentifier() for part in task_path.split(".")):
        raise TaskNotFound(
            f"Task path {task_path!r} does not import: it is not a dotted path of Python names."
        )
    if module in sys.modules:
        return  # importing it again runs nothing
    if any(module == p or module.startswith(p + ".") for p in allowed_modules(backend)):
        return
    raise TaskNotFound(
        f"Task path {task_path!r} does not import here, and was not imported: module "
        f"{module!r} is not loaded and is not part of an installed app or of the backend's "
        "TASK_MODULES. A stored task may only name modules of this project."
    )


def unimportable_by_workers(task_path: str, backend: str) -> str | None:
    """Why a worker of ``backend`` would refuse to import the module of ``task_path`` (it is
    loaded here, in the enqueuing process, but a worker imports only what the project vouches
    for); None if it would import it, or if the apps are still loading (a task declared while
    they load is checked again when it is enqueued)."""
    if not apps.apps_ready:
        return None
    module = task_path.rpartition(".")[0]
    if any(module == p or module.startswith(p + ".") for p in allowed_modules(backend)):
        return None
    return (
        f"Task {task_path} is defined in module {module!r}, which a worker does not import: "
        "it is not part of an installed app or of the backend's TASK_MODULES, so the worker "
        "would fail the task with TaskNotFound. Define it in an installed app's tasks.py, add "
        "its app to INSTALLED_APPS, or add its package to OPTIONS['TASK_MODULES']."
    )


def allowed_modules(backend: str | None = None) -> set[str]:
    """The packages a stored task path may import: the TASK_MODULES option of ``backend`` (of
    every django-sqltasks backend when None), or the installed apps where it is not set."""
    aliases: Iterable[str] = [backend] if backend is not None else task_backends.settings
    configured: list[tuple[str, ...] | None] = []
    for alias in aliases:
        config = backend_config(alias)  # None: unknown, broken, or another kind of backend
        if config is not None:
            configured.append(config.task_modules)
    if not configured:
        configured.append(None)
    prefixes: set[str] = set()
    for modules in configured:
        if modules is None:
            prefixes.update(app.name for app in _installed_apps())
        else:
            prefixes.update(modules)
    return prefixes


def _installed_apps() -> Iterable[AppConfig]:
    """The installed apps, with those a test's ``available_apps`` hides while it runs: the
    project's workers import every installed app, so its tasks may be enqueued meanwhile.

    ``available_apps`` (Django's TransactionTestCase) narrows the registry to some of the same
    app configs, the whole set kept aside; ``override_settings(INSTALLED_APPS=...)`` builds new
    ones, which are the project's installed apps for as long as it lasts."""
    current = apps.app_configs
    if apps.stored_app_configs:
        whole = apps.stored_app_configs[-1]
        if all(whole.get(label) is config for label, config in current.items()):
            return list(whole.values())
    return list(current.values())


def check_backend(task: Task, backend: str) -> None:
    """Refuse a task whose row names ``backend`` when that backend may not run it (see
    ``may_run``)."""
    refusal = may_run(backend, task.backend)
    if refusal is not None:
        raise TaskBackendMismatch(
            f"Task {task.module_path} is declared for backend {task.backend!r}, {refusal}: a "
            f"worker of {backend!r} does not run it. Enqueue it through its own backend, or "
            f"declare it with @task(backend={backend!r})."
        )


def may_run(backend: str, declared: str) -> str | None:
    """Why backend ``backend`` may not run a task declared for backend ``declared``; None if
    it may.

    A backend runs its own tasks, and those of another django-sqltasks backend whose tasks live
    in the same database (``task.using(backend=...)``): whoever can write a row naming such a
    task for ``backend`` could as well have named ``declared``, whose workers would run it, so
    accepting it gives a row no task it could not already start. A task declared for a backend
    of another kind, or one keeping its tasks in another database, is refused: a row in this
    database must not reach code that only another database's rows (or another kind of
    backend) may start.
    """
    if backend == declared:
        return None
    try:
        mine, theirs = sql_backend(backend), sql_backend(declared)
    except InvalidTaskBackend:
        return f"which is not a django-sqltasks backend sharing {backend!r}'s table"
    if mine.database != theirs.database:
        return (
            f"whose tasks are in database {theirs.database!r}, not {mine.database!r} "
            f"where {backend!r} keeps its own"
        )
    return None
