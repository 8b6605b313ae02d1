"""Two JSON endpoints: enqueue a task from an async view, and read any task's result by id."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

try:
    from django.tasks import TaskResult, TaskResultStatus, default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskResult, TaskResultStatus, default_task_backend
    from django_tasks.exceptions import TaskResultDoesNotExist

from .tasks import EXCHANGE_RATES, fetch_exchange_rate, send_order_confirmation


@require_GET
def index(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        {
            "endpoints": {
                "POST /orders/<order_id>/confirm/?email=...": "enqueue send_order_confirmation",
                "POST /rates/<currency>/": "enqueue fetch_exchange_rate, for one of "
                + ", ".join(EXCHANGE_RATES),
                "GET /tasks/<task_id>/": "show a task's status and result",
                "/admin/": "browse every task",
            }
        }
    )


@csrf_exempt  # so the example can be driven with curl; keep CSRF on in a real project
@require_POST
async def confirm_order(request: HttpRequest, order_id: int) -> JsonResponse:
    email = request.GET.get("email", "customer@example.com")
    result = await send_order_confirmation.aenqueue(order_id=order_id, email=email)
    return JsonResponse(describe(result), status=202)


@csrf_exempt
@require_POST
async def exchange_rate(request: HttpRequest, currency: str) -> JsonResponse:
    currency = currency.upper()
    if currency not in EXCHANGE_RATES:
        return JsonResponse({"error": f"Unknown currency {currency!r}."}, status=400)
    result = await fetch_exchange_rate.aenqueue(currency)
    return JsonResponse(describe(result), status=202)


@require_GET
async def task_detail(request: HttpRequest, task_id: str) -> JsonResponse:
    try:
        result = await default_task_backend.aget_result(task_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": f"No task with id {task_id!r}."}, status=404)
    return JsonResponse(describe(result))


def describe(result: TaskResult) -> dict[str, Any]:
    """Return what a client wants to know about a task, as JSON-ready values."""
    data: dict[str, Any] = {
        "task_id": result.id,
        "task": result.task.module_path,
        "status": result.status,
        "queue": result.task.queue_name,
        "attempts": result.attempts,
        "enqueued_at": result.enqueued_at,
        "finished_at": result.finished_at,
        "url": f"/tasks/{result.id}/",
    }
    if result.status == TaskResultStatus.SUCCESSFUL:
        data["return_value"] = result.return_value
    if result.errors:
        data["errors"] = [error.exception_class_path for error in result.errors]
    return data
