"""A workflow's plan: the tree of its steps, each node's state, and how one step's outcome
moves it on. Pure functions on JSON-ready dicts; ``workflow_store`` reads and writes them.

Nodes:

- a task: ``{"kind": "task", "id", "path", "queue", "args", "kwargs"}``: ``args`` and
  ``kwargs`` are the step's own; a step after another gets that step's result first;
- a chain: ``{"kind": "chain", "steps": [...]}``, run one after another;
- a group: ``{"kind": "group", "members": [...], "then": task or None, "on_failure"}``, whose
  members run at once and whose ``then`` gets the list of their results.

Every node also has ``state`` (WAITING, RUNNING, SUCCESSFUL or FAILED), and once finished a
``result`` (its return value; a group's is the list of its members', or its callback's) or an
``error`` naming the task whose failure ended it. A result stays in the plan only until it is
handed on (to the next step, a group's list or its callback), so the plan holds each result in
one place, and only those still to be handed on: the root's, and the members' of groups that
have not finished. A group holds at most ``limit`` bytes of its members' results (the backend's
MAX_PAYLOAD_BYTES, the most its callback could be given): past it, it drops them and, once its
members have finished, fails its callback (or itself) with ``PayloadTooLarge``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..compat import Task
from .serialization import dumps

Node = dict[str, Any]
# The call of each step of a plan, by its node's id: its task, args and kwargs.
StepCalls = dict[int, tuple[Task, list[Any], dict[str, Any]]]

WAITING = "WAITING"
RUNNING = "RUNNING"
SUCCESSFUL = "SUCCESSFUL"
FAILED = "FAILED"
FINISHED = (SUCCESSFUL, FAILED)
ON_FAILURE = ("skip", "run")  # what a group's callback does when members failed
SKIPPED = "django_sqltasks.exceptions.WorkflowStepSkipped"
PAYLOAD_TOO_LARGE = "django_sqltasks.exceptions.PayloadTooLarge"


@dataclass(slots=True)
class Release:
    """A step whose turn has come: its task row is made due with these arguments."""

    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]


@dataclass(slots=True)
class Moves:
    """What one outcome changes beyond the plan itself."""

    releases: list[Release] = field(default_factory=list)
    # Steps that will never run: task id, error class path and text they are failed with.
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    finished: bool = False  # the whole workflow is over (see the root's state)


def leaves(node: Node) -> Iterator[Node]:
    """The task nodes under ``node``, in plan order (a group's callback last)."""
    kind = node["kind"]
    if kind == "task":
        yield node
    elif kind == "chain":
        for step in node["steps"]:
            yield from leaves(step)
    else:
        for member in node["members"]:
            yield from leaves(member)
        if node["then"] is not None:
            yield from leaves(node["then"])


def children(node: Node) -> list[Node]:
    """The nodes directly under ``node``."""
    if node["kind"] == "chain":
        return list(node["steps"])
    if node["kind"] == "group":
        return [*node["members"], *([node["then"]] if node["then"] is not None else [])]
    return []


def start(node: Node, prefix: list[Any], extra: dict[str, Any] | None = None) -> list[Release]:
    """Mark ``node`` RUNNING and return the steps that run first, ``prefix`` before their own
    arguments and ``extra`` among their keyword arguments."""
    node["state"] = RUNNING
    kind = node["kind"]
    if kind == "task":
        return [Release(node["id"], [*prefix, *node["args"]], {**node["kwargs"], **(extra or {})})]
    if kind == "chain":
        return start(node["steps"][0], prefix, extra)
    return [release for member in node["members"] for release in start(member, prefix, extra)]


def finish(
    root: Node,
    task_id: str,
    succeeded: bool,
    value: Any,
    error_class: str | None,
    limit: int | None = None,
) -> Moves:
    """Record that the task ``task_id`` ended, and move its parents on; a task not in the plan,
    or known to have ended already, changes nothing. A group holds at most ``limit`` bytes of
    its members' results (None: no bound)."""
    moves = Moves()
    path = _path_to(root, task_id)
    if path is None or path[-1]["state"] in FINISHED:
        return moves
    leaf = path[-1]
    if succeeded:
        _settle(leaf, SUCCESSFUL, result=value)
    else:
        error = {"task_id": task_id, "path": leaf["path"], "error": error_class or ""}
        _settle(leaf, FAILED, error=error)
    for parent, child in zip(reversed(path[:-1]), reversed(path[1:]), strict=True):
        if not _moved(parent, child, moves, limit):
            return moves
    moves.finished = True
    return moves


def group_of(root: Node, task_id: str) -> Node | None:
    """The innermost unfinished group that task ``task_id`` runs in as a member (or within a
    member), not as its callback; None if there is none."""
    path = _path_to(root, task_id)
    if path is None:
        return None
    for parent, child in zip(reversed(path[:-1]), reversed(path[1:]), strict=True):
        if parent["kind"] == "group" and child is not parent["then"]:
            return parent if parent["state"] not in FINISHED else None
    return None


def add_members(group: Node, members: list[Node]) -> list[Release]:
    """Add ``members`` to the running ``group`` and start them: its callback waits for them
    too, and gets their results after the others'."""
    group["members"].extend(members)
    return [release for member in members for release in start(member, [])]


def failed_step(root: Node) -> dict[str, str] | None:
    """The task whose failure ended the workflow (or a part of it), if one did; or the error of
    a group that failed without a failed task (its results were too large)."""
    for node in leaves(root):
        if node["state"] == FAILED and node.get("error", {}).get("task_id") == node["id"]:
            return dict(node["error"])
    if root["state"] == FAILED and "message" in root.get("error", {}):
        return dict(root["error"])
    return None


def skip_message(error: dict[str, str]) -> str:
    """The error text of a step that will never run because of ``error``."""
    if "message" in error:
        return f"This workflow step never ran: {error['message']}"
    return (
        f"This workflow step never ran: step {error['path']} (task {error['task_id']}) failed "
        f"with {error['error'] or 'an error'} before its turn came."
    )


def cancel(root: Node) -> list[str]:
    """Mark every unfinished node FAILED (a cancelled workflow); return its unfinished tasks."""
    ids = [leaf["id"] for leaf in leaves(root) if leaf["state"] not in FINISHED]
    _fail_unfinished(root, {"task_id": "", "path": "", "error": "cancelled"})
    return ids


# Internals -------------------------------------------------------------------------------


def _path_to(node: Node, task_id: str) -> list[Node] | None:
    if node["kind"] == "task":
        return [node] if node["id"] == task_id else None
    for child in children(node):
        path = _path_to(child, task_id)
        if path is not None:
            return [node, *path]
    return None


def _settle(
    node: Node, state: str, *, result: Any = None, error: dict[str, str] | None = None
) -> None:
    node["state"] = state
    if state == SUCCESSFUL:
        node["result"] = result
    else:
        node["error"] = error


def _skip(node: Node, error: dict[str, str], moves: Moves, error_class: str = SKIPPED) -> None:
    """Fail every task under ``node`` that has not started: it never will."""
    for leaf in leaves(node):
        if leaf["state"] == WAITING:
            moves.skipped.append((leaf["id"], error_class, skip_message(error)))
    _fail_unfinished(node, error)


def _fail_unfinished(node: Node, error: dict[str, str]) -> None:
    for child in children(node):
        _fail_unfinished(child, error)
    if node["state"] not in FINISHED:
        _settle(node, FAILED, error=error)


def _moved(parent: Node, child: Node, moves: Moves, limit: int | None) -> bool:
    """Move ``parent`` on now that ``child`` has ended; return whether ``parent`` ended too."""
    if parent["kind"] == "chain":
        steps = parent["steps"]
        index = next(i for i, step in enumerate(steps) if step is child)
        if child["state"] == FAILED:
            for later in steps[index + 1 :]:
                _skip(later, child["error"], moves)
            _settle(parent, FAILED, error=child["error"])
            return True
        result = child.pop("result", None)  # handed on: the plan keeps it in one place
        if index + 1 < len(steps):
            moves.releases.extend(start(steps[index + 1], [result]))
            return False
        _settle(parent, SUCCESSFUL, result=result)
        return True
    if child is parent["then"]:
        _settle(parent, child["state"], result=child.pop("result", None), error=child.get("error"))
        return True
    members = parent["members"]
    if child["state"] == SUCCESSFUL:
        _hold(parent, child, limit)
    if any(member["state"] not in FINISHED for member in members):
        return False
    results = [m.pop("result", None) for m in members]
    failures = [{"index": i, **m["error"]} for i, m in enumerate(members) if m["state"] == FAILED]
    callback = parent["then"]
    if failures and (callback is None or parent["on_failure"] == "skip"):
        if callback is not None:
            _skip(callback, _first_error(failures), moves)
        _settle(parent, FAILED, error=_first_error(failures))
        return True
    if "held_over" in parent:
        _too_large(parent, moves)
        return True
    if callback is None:
        _settle(parent, SUCCESSFUL, result=results)
        return True
    extra = {"failures": failures} if parent["on_failure"] == "run" else None
    moves.releases.extend(start(callback, [results], extra))
    return False


def _hold(group: Node, member: Node, limit: int | None) -> None:
    """Count ``member``'s result against what ``group`` may hand on; past ``limit`` bytes, drop
    the results it holds: its callback could not be given them."""
    if limit is None:
        return
    held = group.get("held_bytes", 0) + len(dumps(member.get("result")))
    group["held_bytes"] = held
    if held > limit:
        group["held_over"] = limit
        for other in group["members"]:
            other.pop("result", None)


def _too_large(group: Node, moves: Moves) -> None:
    """Fail ``group``, whose members' results are over the limit, and its callback, which
    never runs: the message names MAX_PAYLOAD_BYTES and the size."""
    callback = group["then"]
    given = "its group's" if callback is not None else "a group's"
    message = (
        f"the results of {given} {len(group['members'])} members encode to "
        f"{group['held_bytes']:,} bytes together, over the MAX_PAYLOAD_BYTES limit of "
        f"{group['held_over']:,} bytes on what one step is given: return smaller results "
        "(store large data elsewhere and return its key). The members succeeded; each "
        "result is its own task's return value."
    )
    if callback is None:
        error = {"task_id": "", "path": "", "error": PAYLOAD_TOO_LARGE, "message": message}
    else:
        error = {"task_id": callback["id"], "path": callback["path"], "error": PAYLOAD_TOO_LARGE}
        moves.skipped.append(
            (callback["id"], PAYLOAD_TOO_LARGE, skip_message({"message": message}))
        )
        _settle(callback, FAILED, error=error)
    _settle(group, FAILED, error=error)


def _first_error(failures: list[dict[str, Any]]) -> dict[str, str]:
    keys = ("task_id", "path", "error", "message")
    return {key: failures[0][key] for key in keys if key in failures[0]}
