"""The tasks a project declares: every ``@task`` of the ``tasks`` module of each installed app
and of each package of the backends' TASK_MODULES, and of any module of those already loaded.
What the admin's "By task" filter lists, so that it covers every task, however rarely it runs."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from functools import lru_cache

from ..compat import Task
from ..core.resolve import allowed_modules

TASKS_MODULE = "tasks"  # the module of an app or package where its tasks are declared


@lru_cache(maxsize=1)
def declared_task_paths() -> tuple[str, ...]:
    """The module paths of the declared tasks, sorted (read once per process)."""
    prefixes = allowed_modules()
    for prefix in sorted(prefixes):
        for name in (prefix, f"{prefix}.{TASKS_MODULE}"):
            if name not in sys.modules and _exists(name):
                try:
                    importlib.import_module(name)
                except Exception:
                    continue
    paths: set[str] = set()
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(p + ".") for p in prefixes):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Task) and value.module_path.rpartition(".")[0] == name:
                paths.add(value.module_path)
    return tuple(sorted(paths))


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that is not a package, or has no spec
        return False


def declared_tags() -> tuple[str, ...]:
    """The tags the declared tasks set with ``@task(tags=...)``, sorted."""
    tags: set[str] = set()
    for path in declared_task_paths():
        module, _, name = path.rpartition(".")
        task = getattr(sys.modules.get(module), name, None)
        tags.update(getattr(task, "tags", ()) or ())
    return tuple(sorted(tags))
