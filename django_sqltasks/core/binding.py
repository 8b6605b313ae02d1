"""Whether a call's arguments fit its task's function, checked when it is enqueued, so that a
wrong call fails in the caller's code rather than later, in a worker."""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

from ..compat import Task
from ..exceptions import InvalidTaskArguments


@lru_cache(maxsize=1024)
def _signature(func: Any, takes_context: bool) -> inspect.Signature | None:
    """The parameters a caller passes to ``func`` (its context left out); None if Python
    cannot tell (some builtins and C functions)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    if takes_context:  # the worker passes the context first; Django checked it is there
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


# (func, takes_context, number of args, keyword names) of calls that fit: whether a call binds
# depends on nothing else, so a fitting shape is bound once. Refused shapes are not kept.
_fitting: dict[tuple[Any, bool, int, frozenset[str]], bool] = {}
MAX_FITTING = 4096  # shapes remembered; forgotten all at once when full


def check_binds(task: Task, args: Any, kwargs: Any) -> None:
    """Raise ``InvalidTaskArguments`` (a ``TypeError``) naming the task when ``args`` and
    ``kwargs`` do not fit its function's parameters, as Python would when calling it."""
    shape: tuple[Any, bool, int, frozenset[str]] | None
    try:
        shape = (task.func, bool(task.takes_context), len(args), frozenset(kwargs))
        if shape in _fitting:
            return
    except TypeError:  # an unhashable function object: bind every call
        shape = None
    _bind(task, args, kwargs)
    if shape is not None:
        if len(_fitting) >= MAX_FITTING:
            _fitting.clear()
        _fitting[shape] = True


CONTEXT_PARAMETERS = ("context", "ctx")  # first parameters that say a task wants its context


def forgot_context(task: Task) -> bool:
    """Whether ``task`` looks written for a context it is not given: its function's first
    parameter is named ``context`` (or ``ctx``), and it is not declared ``takes_context``."""
    if task.takes_context:
        return False
    try:
        first = next(iter(inspect.signature(task.func).parameters), None)
    except (TypeError, ValueError):
        return False
    return first in CONTEXT_PARAMETERS


def context_hint(task: Task) -> str:
    return (
        f"{task.name}'s first parameter reads as its context, but the task is not declared "
        "with takes_context=True, so no context is passed to it: declare it "
        "@task(takes_context=True)"
    )


def add_context_hint(task: Task, exc: BaseException) -> None:
    """Note on ``exc`` (an attribute of a context looked up on something else) that ``task``
    was not given a context, where it looks written for one (Python 3.11+'s notes)."""
    from .progress import SQLTaskContext

    if (
        isinstance(exc, AttributeError)
        and getattr(exc, "name", None) in dir(SQLTaskContext)
        and hasattr(exc, "add_note")
        and forgot_context(task)
    ):
        exc.add_note(context_hint(task) + ".")


def _bind(task: Task, args: Any, kwargs: Any) -> None:
    try:
        signature = _signature(task.func, bool(task.takes_context))
    except TypeError:  # an unhashable function object: look it up each time
        signature = _signature.__wrapped__(task.func, bool(task.takes_context))
    if signature is None:
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        hint = f" ({context_hint(task)})" if forgot_context(task) else ""
        raise InvalidTaskArguments(
            f"Task {task.module_path}({_names(signature)}) cannot be called with these "
            f"arguments: {e}{hint}."
        ) from None


def _names(signature: inspect.Signature) -> str:
    """The parameters as a caller writes them, without their annotations."""
    bare = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return str(inspect.Signature(bare))[1:-1]
