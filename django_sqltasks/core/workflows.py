"""Workflows: chains of tasks that hand each result to the next, and groups of tasks run at once
whose callback gets all their results. See docs/workflows.md.

    from django_sqltasks import chain, group

    chain(fetch.s(url), parse.s(), store.s()).enqueue()
    group(resize.s(1), resize.s(2)).then(notify.s(), on_failure="run").enqueue()

Each step is a task row of its own, enqueued with the workflow and made due by the worker that
stores the outcome of the step before it, in that same transaction (``workflow_store``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union

from asgiref.sync import sync_to_async
from django.db import transaction

from ..compat import InvalidTaskBackend, Task, TaskResult
from ..exceptions import InvalidWorkflow
from .backends import sql_backend
from .workflow_plan import FINISHED, ON_FAILURE, Node, StepCalls, failed_step, leaves


class StoredWorkflow(Protocol):
    """What a workflow's row (``models.WorkflowRecord``) holds."""

    id: Any
    backend_name: str
    status: str
    plan: Any


MAX_WORKFLOW_TASKS = 1000  # tasks in one workflow: every step's outcome rewrites its plan


class Signature:
    """A task with some of its arguments: one step of a workflow (``task.s(*args, **kwargs)``).

    A step that follows another is called with that step's result first, then these arguments.
    """

    __slots__ = ("args", "kwargs", "task")

    def __init__(
        self, task: Task, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"A workflow step needs a task (a @task function), not {task!r}.")
        self.task = task
        self.args = list(args)
        self.kwargs = dict(kwargs or {})

    def __repr__(self) -> str:
        return f"<Signature {self.task.module_path} args={self.args!r} kwargs={self.kwargs!r}>"


def signature(task: Task, *args: Any, **kwargs: Any) -> Signature:
    """Return ``task`` with these arguments, as a step (``task.s(...)`` where it has no ``s``)."""
    return Signature(task, args, kwargs)


Step = Union[Signature, Task, "Chain", "Group"]


class Workflow:
    """What chains and groups share: building their plan and enqueueing it."""

    def _node(self, tasks: StepCalls) -> Node:
        raise NotImplementedError

    def enqueue(self, *args: Any, **kwargs: Any) -> WorkflowResult:
        """Write the workflow and all its tasks; the first steps get ``args`` and ``kwargs``
        before their own. The writes join the caller's transaction."""
        tasks: StepCalls = {}
        root = self._node(tasks)
        backends = {task.backend for task, _, _ in tasks.values()}
        if len(backends) > 1:
            raise InvalidWorkflow(
                f"Every task of a workflow must use one backend; these use {sorted(backends)}."
            )
        alias = backends.pop()
        try:
            backend = sql_backend(alias)
        except InvalidTaskBackend as e:
            raise InvalidWorkflow(f"Workflows need the SQLTaskBackend: {e}") from e
        return backend.enqueue_workflow(root, tasks, list(args), kwargs)

    async def aenqueue(self, *args: Any, **kwargs: Any) -> WorkflowResult:
        """Async ``enqueue``: one thread hop, in a transaction of its own."""

        def write() -> WorkflowResult:
            with transaction.atomic(using=self._database()):
                return self.enqueue(*args, **kwargs)

        result: WorkflowResult = await sync_to_async(write)()
        return result

    def _database(self) -> str:
        tasks: StepCalls = {}
        self._node(tasks)
        task = next(iter(tasks.values()))[0]
        database: str = task.get_backend().database  # type: ignore[attr-defined]
        return database


class Chain(Workflow):
    """Steps run one after another, each getting the result of the one before."""

    def __init__(self, *steps: Step) -> None:
        if not steps:
            raise TypeError("chain() needs at least one step.")
        self.steps = [_as_step(step, "chain()", i) for i, step in enumerate(steps)]

    def _node(self, tasks: StepCalls) -> Node:
        return {"kind": "chain", "state": "WAITING", "steps": [_node(s, tasks) for s in self.steps]}

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self.steps))})"


class Group(Workflow):
    """Members run at once; ``then()`` adds a callback that gets the list of their results."""

    def __init__(
        self, *members: Step, callback: Signature | None = None, on_failure: str = "skip"
    ) -> None:
        if not members:
            raise TypeError("group() needs at least one member.")
        self.members = [_as_step(member, "group()", i) for i, member in enumerate(members)]
        self.callback = callback
        self.on_failure = on_failure

    def then(self, callback: Signature | Task, *, on_failure: str = "skip") -> Group:
        """Return this group with ``callback``, run once every member has finished.

        ``on_failure="skip"``: if a member failed, the callback never runs (it is marked
        FAILED, naming the member). ``"run"``: it runs anyway, with ``None`` for each failed
        member's result and a ``failures`` keyword argument listing them.
        """
        if isinstance(callback, Task):
            callback = Signature(callback)
        if not isinstance(callback, Signature):
            raise TypeError(
                f"then() takes a task or a task.s(...) signature, not {callback!r}: to run "
                "several steps after a group, put the group in a chain."
            )
        if on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be 'skip' or 'run', not {on_failure!r}.")
        return Group(*self.members, callback=callback, on_failure=on_failure)

    def _node(self, tasks: StepCalls) -> Node:
        return {
            "kind": "group",
            "state": "WAITING",
            "members": [_node(m, tasks) for m in self.members],
            "then": None if self.callback is None else _node(self.callback, tasks),
            "on_failure": self.on_failure,
        }

    def __repr__(self) -> str:
        then = "" if self.callback is None else f".then({self.callback!r})"
        return f"group({', '.join(map(repr, self.members))}){then}"


def chain(*steps: Step) -> Chain:
    """Return the steps as a chain: each runs once the one before succeeded, with its result."""
    return Chain(*steps)


def group(*members: Step) -> Group:
    """Return the members as a group: they run at once (add a callback with ``then()``)."""
    return Group(*members)


def _as_step(step: object, where: str, index: int) -> Signature | Chain | Group:
    if isinstance(step, Task):
        return Signature(step)
    if isinstance(step, (Signature, Chain, Group)):
        return step
    raise TypeError(
        f"{where} step {index} must be a task, a task.s(...) signature, a chain or a group, "
        f"not {step!r}."
    )


def member_nodes(
    steps: Sequence[Any],
) -> tuple[list[Node], StepCalls]:
    """The plan nodes of ``steps`` (tasks, signatures, chains or groups) to add to a running
    group, and their tasks by key (as ``Workflow.enqueue`` builds them)."""
    tasks: StepCalls = {}
    nodes = [_node(_as_step(step, "add_to_group()", i), tasks) for i, step in enumerate(steps)]
    if not nodes:
        raise InvalidWorkflow("add_to_group() needs at least one step.")
    return nodes, tasks


def _node(step: Signature | Chain | Group, tasks: dict[int, Any]) -> Node:
    if isinstance(step, Workflow):
        return step._node(tasks)
    if len(tasks) >= MAX_WORKFLOW_TASKS:
        raise InvalidWorkflow(
            f"A workflow may have at most {MAX_WORKFLOW_TASKS} tasks; this one has more: split "
            "it into workflows, or enqueue the tasks on their own."
        )
    key = len(tasks)  # replaced by the task's id once its row is made
    tasks[key] = (step.task, step.args, step.kwargs)
    return {
        "kind": "task",
        "state": "WAITING",
        "id": key,
        "path": step.task.module_path,
        "args": step.args,
        "kwargs": step.kwargs,
    }


@dataclass
class WorkflowResult:
    """A workflow as stored: its id, state, plan, and the results of its tasks."""

    id: str
    backend: str
    status: str  # RUNNING, SUCCESSFUL or FAILED
    plan: Node

    @classmethod
    def from_record(cls, record: StoredWorkflow) -> WorkflowResult:
        return cls(
            id=str(record.id), backend=record.backend_name, status=record.status, plan=record.plan
        )

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    @property
    def return_value(self) -> Any:
        """The last step's result (a chain), or the list of members' results or the callback's
        (a group); raise ``ValueError`` until the workflow has succeeded."""
        if self.status == "SUCCESSFUL":
            return self.plan.get("result")
        raise ValueError("Workflow failed" if self.status == "FAILED" else "Workflow not finished")

    @property
    def failed_step(self) -> dict[str, str] | None:
        """The task whose failure ended the workflow: ``task_id``, ``path`` and ``error``."""
        return failed_step(self.plan)

    @property
    def task_ids(self) -> list[str]:
        """The ids of the workflow's tasks, in plan order (a group's callback after it)."""
        return [leaf["id"] for leaf in leaves(self.plan)]

    @property
    def members(self) -> list[TaskResult]:
        """Every task of the workflow as it is now, in plan order."""
        backend = sql_backend(self.backend)
        return [backend.get_result(task_id) for task_id in self.task_ids]

    def refresh(self) -> None:
        """Read the workflow's state again."""
        fresh = get_workflow(self.id, backend=self.backend)
        self.status, self.plan = fresh.status, fresh.plan

    def cancel(self) -> bool:
        """Stop the workflow: its steps that have not started never run (FAILED with
        ``TaskCancelled``); running ones are asked to stop. False if it had finished."""
        cancelled = sql_backend(self.backend).cancel_workflow(self.id)
        self.refresh()
        return cancelled


def get_workflow(workflow_id: str, backend: str = "default") -> WorkflowResult:
    """Return the workflow ``workflow_id`` of the backend ``backend``; raise ``LookupError``
    naming it if there is none."""
    return sql_backend(backend).get_workflow(workflow_id)


def workflow_of(result: TaskResult) -> WorkflowResult | None:
    """Return the workflow whose step ``result`` is, or None if it is no workflow's step (or
    its workflow was pruned)."""
    return sql_backend(result.backend).workflow_of(result.id)
