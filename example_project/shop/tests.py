# ruff: noqa: PT009 - a Django TestCase, written as Django projects write them
"""The example's own tests, written with django_sqltasks.testing (see docs/testing.md).

Run them with ``.venv/bin/python example_project/manage.py test shop``.
"""

from __future__ import annotations

from django.test import TestCase

from django_sqltasks import chain, signature
from django_sqltasks.testing import capture_tasks, run_tasks

from .tasks import (
    PaymentDeclined,
    charge_card,
    email_receipt,
    fetch_exchange_rate,
    rebuild_search_index,
    send_order_confirmation,
)


class OrderTaskTests(TestCase):
    def test_confirmation_is_enqueued_on_the_emails_queue_and_runs(self) -> None:
        with capture_tasks() as captured:
            send_order_confirmation.enqueue(order_id=7, email="ada@example.com")
        captured.assert_enqueued(
            send_order_confirmation,
            kwargs={"order_id": 7, "email": "ada@example.com"},
            queue="emails",
        )
        captured.assert_not_enqueued(charge_card)
        [result] = run_tasks()
        self.assertEqual(result.return_value, {"order_id": 7, "sent_to": "ada@example.com"})

    def test_a_declined_charge_fails_with_its_error(self) -> None:
        charge_card.enqueue(order_id=8, amount_cents=1_000_00)
        [result] = run_tasks()
        self.assertEqual(result.status, "FAILED")
        self.assertEqual(
            result.errors[0].exception_class_path,
            f"{PaymentDeclined.__module__}.{PaymentDeclined.__qualname__}",
        )

    def test_a_task_reports_its_progress(self) -> None:
        rebuild_search_index.enqueue(reason="test")
        [result] = run_tasks()
        self.assertEqual((result.progress, result.progress_note), (1.0, "indexed customers"))
        self.assertEqual(dict(result.metadata), {"reason": "test", "shards": 3})

    def test_an_async_task_runs_too(self) -> None:
        fetch_exchange_rate.enqueue("EUR")
        [result] = run_tasks()
        self.assertEqual(result.return_value, 0.92)

    def test_a_paid_order_gets_its_receipt_and_a_declined_one_none(self) -> None:
        paid = chain(
            signature(charge_card, order_id=4, amount_cents=40_00),
            signature(email_receipt, email="ada@example.com"),
        ).enqueue()
        declined = chain(
            signature(charge_card, order_id=5, amount_cents=400_00),
            signature(email_receipt, email="ada@example.com"),
        ).enqueue()
        run_tasks()
        paid.refresh()
        declined.refresh()
        self.assertEqual(
            paid.return_value, {"receipt_for": 4, "amount_cents": 40_00, "to": "ada@example.com"}
        )
        self.assertEqual(declined.status, "FAILED")
        self.assertEqual(declined.failed_step["path"], "shop.tasks.charge_card")
