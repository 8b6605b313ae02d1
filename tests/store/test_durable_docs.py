"""The worked examples of docs/durable.md, run as written: each page's code block is the module
of a user's app, beside small stand-ins for the modules of theirs it imports (mail, a payment
provider, a file reader), and a worker runs it on the test database."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.utils import timezone

from django_sqltasks import get_workflow
from django_sqltasks.compat import TaskResultStatus
from django_sqltasks.models import StepRecord, TaskRecord
from django_sqltasks.worker import Worker
from tests.conftest import ROOT, set_backend_options

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("django.tasks" not in sys.modules, reason="the docs import django.tasks"),
]

RunWorker = Callable[..., Worker]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "durable.md").read_text(), re.S)


def block(first_line: str) -> str:
    [code] = [code for code in BLOCKS if first_line in code]
    return code


@pytest.fixture
def app(settings: Any) -> Iterator[Callable[..., types.ModuleType]]:
    """Make modules of a user's app: ``app(name, code or None, **attributes)``."""
    set_backend_options(settings, TASK_MODULES=["accounts", "shop", "imports", "flows"])
    made: list[str] = []

    def module(name: str, code: str | None = None, **attributes: Any) -> types.ModuleType:
        made.append(name)
        mod = sys.modules[name] = types.ModuleType(name)
        mod.__dict__.update(attributes)
        if code is not None:
            exec(compile(code, f"docs/durable.md ({name})", "exec"), mod.__dict__)
        return mod

    yield module
    for name in made:
        sys.modules.pop(name, None)


def time_passes(result: Any) -> None:
    """What the days of a sleep or a timeout do: its wake time and its task's are past."""
    past = timezone.now() - timedelta(seconds=1)
    StepRecord.objects.filter(task_id=result.id, state="waiting").update(wake_at=past)
    TaskRecord.objects.filter(pk=result.id).update(available_at=past)


def row(result: Any) -> TaskRecord:
    return TaskRecord.objects.get(pk=result.id)


def test_the_signup_flow(app: Any, run_worker: RunWorker) -> None:
    sent: list[str] = []

    def mail(kind: str) -> Callable[[int], bool]:
        def send(user_id: int) -> bool:
            sent.append(f"{kind} {user_id}")
            return True

        return send

    app("accounts")
    app("accounts.models", User=User)
    app("accounts.mail", send_welcome=mail("welcome"), send_reminder=mail("reminder"))
    tasks = app("accounts.tasks", block("def onboard("))
    idle = User.objects.create(username="idle", is_active=False)
    keen = User.objects.create(username="keen", is_active=False)
    first, second = tasks.onboard.enqueue(idle.pk), tasks.onboard.enqueue(keen.pk)
    run_worker()
    assert row(first).status == TaskResultStatus.READY
    assert row(first).available_at > timezone.now() + timedelta(days=2, hours=23)
    User.objects.filter(pk=keen.pk).update(is_active=True)
    time_passes(first)
    time_passes(second)
    run_worker()
    assert row(first).status == row(second).status == TaskResultStatus.SUCCESSFUL
    expected = [f"welcome {idle.pk}", f"welcome {keen.pk}", f"reminder {idle.pk}"]
    assert sorted(sent) == sorted(expected)  # no reminder for the user who activated


class Order:
    """A stand-in for the shop's model: the example reads one order and marks it."""

    rows: dict[int, Order]  # set per test

    def __init__(self, pk: int, total_cents: int) -> None:
        self.pk, self.total_cents, self.charge_id, self.state = pk, total_cents, "", "new"

    class objects:  # as a model's manager is named
        @staticmethod
        def get(pk: int) -> Order:
            return Order.rows[pk]

        @staticmethod
        def filter(charge_id: str) -> Any:
            found = [o for o in Order.rows.values() if o.charge_id == charge_id]
            return types.SimpleNamespace(update=lambda **f: [o.__dict__.update(f) for o in found])

    def fulfil(self, amount: int) -> int:
        self.state = f"fulfilled {amount}"
        return amount


def test_the_payment(app: Any, run_worker: RunWorker) -> None:
    charges: list[str] = []

    def create_charge(total_cents: int, idempotency_key: str) -> dict[str, Any]:
        charges.append(idempotency_key)
        charge_id = "ch_" + idempotency_key.replace(":", "_")
        for order in Order.rows.values():
            if order.total_cents == total_cents:
                order.charge_id = charge_id
        return {"id": charge_id}

    Order.rows = {1: Order(1, 1234), 2: Order(2, 99)}
    app("shop")
    app("shop.models", Order=Order)
    app(
        "shop.provider",
        create_charge=create_charge,
        cancel_charge=lambda charge_id: charge_id,
        verify=lambda request: __import__("json").loads(request.body),
    )
    shop = app("shop.tasks", block("def take_payment("))
    paid, expired = shop.take_payment.enqueue(1), shop.take_payment.enqueue(2)
    run_worker()
    assert row(paid).status == row(expired).status == TaskResultStatus.READY
    body = {"charge_id": Order.rows[1].charge_id, "amount": 1234}
    webhook = RequestFactory().post("/hook", body, content_type="application/json")
    assert shop.webhook(webhook).status_code == 200
    assert shop.webhook(webhook).status_code == 200  # sent twice: resumes once
    time_passes(expired)  # 24 hours and no webhook
    run_worker()
    assert (row(paid).status, row(paid).return_value) == (TaskResultStatus.SUCCESSFUL, "paid")
    assert row(expired).return_value == "expired"
    assert Order.rows[1].state == "fulfilled 1234"
    assert sorted(charges) == sorted([f"{paid.id}:charge", f"{expired.id}:charge"])  # once each


def test_the_batch_import_resumes_at_the_chunk_where_it_failed(
    app: Any, run_worker: RunWorker, tmp_path: Path
) -> None:
    chunks: list[int] = []

    def import_rows(path: str, start: int, count: int) -> int:
        if start == 1000 and 1000 not in chunks:
            chunks.append(start)
            raise ConnectionError("the import failed at its third chunk")
        chunks.append(start)
        return len(Path(path).read_text().splitlines()[start : start + count])

    path = tmp_path / "rows.csv"
    path.write_text("".join(f"{i}\n" for i in range(2200)))
    app("imports")
    app(
        "imports.files",
        count_rows=lambda p: len(Path(p).read_text().splitlines()),
        import_rows=import_rows,
    )
    imports = app("imports.tasks", block("def import_file("))
    result = imports.import_file.enqueue(str(path))
    run_worker()
    assert row(result).status == TaskResultStatus.READY  # its retry, after a backoff
    time_passes(result)
    run_worker()
    assert (row(result).status, row(result).return_value) == (TaskResultStatus.SUCCESSFUL, 2200)
    assert chunks == [0, 500, 1000, 1000, 1500, 2000]  # 0 and 500 were not read again


def test_the_open_batch(app: Any, run_worker: RunWorker) -> None:
    app("flows")
    flows = app(
        "flows.tasks",
        "from django.tasks import task\n\n\n@task\ndef merge(results):\n    return results\n\n\n"
        + block("def fetch_page(").replace("group(fetch_page", "workflow = group(fetch_page"),
        http_get=lambda url, page: {"pages": 3, "items": [f"{url}#{page}"]},
        url="https://example.com/list",
    )
    run_worker()
    done = get_workflow(flows.workflow.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == [[f"https://example.com/list#{n}"] for n in (1, 2, 3)]
