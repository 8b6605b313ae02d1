"""Tasks the hardening tests enqueue: hostile dedupe keys, a task of another backend."""

from __future__ import annotations

from typing import Any

from django_sqltasks.compat import task


@task(dedupe=lambda kind: {"nul": "a\x00b", "surrogate": "\ud800", "int": 7}.get(kind, kind))
def hostile_key(kind: str) -> str:
    return kind


@task
def nested(value: Any) -> Any:
    return value


def stand_in() -> None:
    """Not a task: a stale row points here after a deploy renamed the task."""


@task(backend="immediate")
def on_immediate(path: str) -> None:
    """Declared for the immediate backend: a row of the default backend must not run it."""
    with open(path, "w") as f:
        f.write("ran")
