"""The example's tasks: one of each kind the backend runs.

Arguments and return values must be JSON: pass ids and strings, not model instances or dates.
"""

from __future__ import annotations

import asyncio
import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task

from django_sqltasks import SQLTaskContext

# Made-up rates, so the example needs no network.
EXCHANGE_RATES = {"EUR": 0.92, "GBP": 0.79, "JPY": 151.4}
CARD_LIMIT_CENTS = 100_00


class PaymentDeclined(Exception):
    """The (pretend) card network refused the charge."""


@task(queue_name="emails")
def send_order_confirmation(order_id: int, email: str) -> dict[str, object]:
    """A sync task on the "emails" queue: runs on the worker's thread pool."""
    return {"order_id": order_id, "sent_to": email}


@task
async def fetch_exchange_rate(currency: str) -> float:
    """An async task: runs on the worker's event loop."""
    await asyncio.sleep(0.1)  # stands in for an HTTP call
    return EXCHANGE_RATES[currency]


@task
def charge_card(order_id: int, amount_cents: int) -> dict[str, int]:
    """A task that fails for large amounts; the error and traceback are stored on the task."""
    if amount_cents > CARD_LIMIT_CENTS:
        raise PaymentDeclined(f"Order {order_id}: {amount_cents} cents is over the card limit.")
    return {"order_id": order_id, "charged_cents": amount_cents}


@task(queue_name="emails")
def email_receipt(charge: dict[str, int], email: str) -> dict[str, object]:
    """The second step of a chain: gets charge_card's result first (see the demo)."""
    return {"receipt_for": charge["order_id"], "amount_cents": charge["charged_cents"], "to": email}


@task
def render_invoice(order_id: int, seconds: float = 1.5) -> str:
    """A slow sync task: it holds one of the worker's slots while it sleeps."""
    time.sleep(seconds)
    return f"invoice-{order_id}.pdf"


SEARCH_SHARDS = ("orders", "products", "customers")


@task(takes_context=True)
def rebuild_search_index(context: SQLTaskContext, reason: str) -> dict[str, object]:
    """A task that receives its context: its own id, which attempt this is, and
    set_progress and set_metadata, which the admin and get_result show."""
    context.set_metadata(reason=reason, shards=len(SEARCH_SHARDS))
    for done, shard in enumerate(SEARCH_SHARDS, start=1):
        context.set_progress(done / len(SEARCH_SHARDS), f"indexed {shard}")
    return {"task_id": context.task_result.id, "attempt": context.attempt, "reason": reason}
