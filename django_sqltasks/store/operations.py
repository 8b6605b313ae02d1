"""What the backend asks of ``store/``: reads, waits, cancels, queue control and workflows of
one backend, behind one door. The backend loads whenever a ``@task`` is declared, possibly
before Django's app registry is ready, and ``store/`` imports the models: it makes this object
at its first call (``SQLTaskBackend.store``), and each of its methods hands over to here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..compat import TaskResult
from ..core.limits import parse_override
from ..core.workflow_plan import Node, StepCalls
from ..core.workflows import WorkflowResult
from . import control, flow, new_workflows, queue_limits, results, waiting, workflows

if TYPE_CHECKING:
    from ..backend import SQLTaskBackend


class Operations:
    """The store's side of one backend's public methods (their docstrings are there)."""

    def __init__(self, backend: SQLTaskBackend) -> None:
        self.backend = backend
        self.alias = backend.alias

    def get_result(self, result_id: str) -> TaskResult:
        return results.get_result(self.backend.database, self.alias, result_id)

    def wait_result(self, result_id: str, timeout: float | None) -> TaskResult:
        return waiting.wait_result(self.backend, result_id, timeout)

    async def await_result(self, result_id: str, timeout: float | None) -> TaskResult:
        return await waiting.await_result(self.backend, result_id, timeout)

    def cancel(self, result_id: str) -> bool:
        return control.cancel_by_id(self.backend.database, self.alias, result_id)

    def _queue(self, queue_name: str) -> str:
        """``queue_name``, once the backend is usable and the name one of its QUEUES."""
        self.backend.check_usable()
        return flow.check_queue(self.alias, self.backend.queues, queue_name)

    def pause_queue(self, queue_name: str) -> bool:
        name = self._queue(queue_name)
        return flow.pause(self.backend.database, self.alias, name)

    def resume_queue(self, queue_name: str) -> bool:
        name = self._queue(queue_name)
        notify = self.backend.config.notify
        return flow.resume(self.backend.database, self.alias, name, announce=notify)

    def set_queue_limit(self, queue_name: str, concurrency: int | None, rate: str | None) -> bool:
        name = self._queue(queue_name)
        limit = parse_override(concurrency, rate, fields=("concurrency", "rate"))
        return queue_limits.set_override(
            self.backend.database, self.alias, name, limit, announce=self.backend.config.notify
        )

    def clear_queue_limit(self, queue_name: str) -> bool:
        name = self._queue(queue_name)
        return queue_limits.clear_override(
            self.backend.database, self.alias, name, announce=self.backend.config.notify
        )

    def queue_limits(self) -> list[Any]:
        self.backend.check_usable()
        config = self.backend.config
        return queue_limits.states(self.backend.database, self.alias, config.queue_limits)

    def paused_queues(self) -> list[str]:
        self.backend.check_usable()
        return flow.paused(self.backend.database, self.alias)

    def run_now(self, result_id: str) -> bool:
        self.backend.check_usable()
        notify = self.backend.config.notify
        return flow.run_now(self.backend.database, self.alias, result_id, announce=notify)

    def enqueue_workflow(
        self, root: Node, tasks: StepCalls, args: list[Any], kwargs: dict[str, Any]
    ) -> WorkflowResult:
        record = new_workflows.enqueue(self.backend, root, tasks, args, kwargs)
        return WorkflowResult.from_record(record)

    def get_workflow(self, workflow_id: str) -> WorkflowResult:
        record = workflows.get(self.backend.database, self.alias, workflow_id)
        return WorkflowResult.from_record(record)

    def workflow_of(self, result_id: str) -> WorkflowResult | None:
        record = workflows.of_task(self.backend.database, self.alias, result_id)
        return None if record is None else WorkflowResult.from_record(record)

    def cancel_workflow(self, workflow_id: str) -> bool:
        return workflows.cancel(self.backend.database, workflow_id)
