"""The admin's queue limits: setting, changing and deleting an override, bad input refused
naming the field and the rule, and each limited queue's limits in force with their source."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from django_sqltasks.models import QueueLimitOverride
from tests.conftest import set_backend_options
from tests.factories import superuser_client

pytestmark = pytest.mark.django_db

LIST = "/admin/django_sqltasks/queuelimitoverride/"
ADD = LIST + "add/"


def add(client: Client, **fields: str) -> Any:
    data = {"backend_name": "default", "queue_name": "other", "concurrency_limit": ""}
    data["rate_limit"] = ""
    return client.post(ADD, {**data, **fields})


def test_an_override_set_changed_and_deleted_in_the_admin(settings: Any) -> None:
    set_backend_options(settings, QUEUE_LIMITS={"other": {"concurrency": 5, "rate": "100/m"}})
    client = superuser_client()
    page = client.get(LIST).content.decode()
    assert "5 (settings)" in page and "100/m (settings)" in page
    assert add(client, concurrency_limit="2").status_code == 302
    row = QueueLimitOverride.objects.get()
    assert (row.queue_name, row.concurrency, row.rate) == ("other", 2, None)
    page = client.get(LIST).content.decode()
    assert "2 (override; settings: 5)" in page and "100/m (settings)" in page
    change = f"{LIST}{row.pk}/change/"
    form = client.get(change).content.decode()
    assert 'value="2"' in form
    response = client.post(change, {"concurrency_limit": "", "rate_limit": "7/s"})
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.concurrency, row.rate, row.period) == (None, 7, 1.0)
    page = client.get(LIST).content.decode()
    assert "5 (settings)" in page and "7/s (override; settings: 100/m)" in page
    assert client.post(f"{LIST}{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not QueueLimitOverride.objects.exists()
    page = client.get(LIST).content.decode()
    assert "5 (settings)" in page and "100/m (settings)" in page


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"concurrency_limit": "0"},
            "concurrency_limit",
            "concurrency must be at least 1: a queue that",
        ),
        (
            {"concurrency_limit": "-2"},
            "concurrency_limit",
            "concurrency must be a whole number of at least",
        ),
        ({"concurrency_limit": "1e300"}, "concurrency_limit", "concurrency must be a whole number"),
        (
            {"concurrency_limit": "9" * 30},
            "concurrency_limit",
            "concurrency must be a whole number",
        ),
        ({"concurrency_limit": "many"}, "concurrency_limit", "concurrency must be a whole number"),
        ({"concurrency_limit": "\x00"}, "concurrency_limit", "Null characters are not allowed"),
        ({"rate_limit": "10"}, "rate_limit", "rate must be a string like"),
        ({"rate_limit": "10/week"}, "rate_limit", "rate must be a string like"),
        ({"rate_limit": "0/s"}, "rate_limit", "rate must allow 1 to 10,000 starts a period"),
        ({"rate_limit": "1e300/s"}, "rate_limit", "rate must be a string like"),
        ({}, None, "Give a concurrency limit, a rate limit or both"),
        (
            {"queue_name": "nope", "concurrency_limit": "2"},
            "queue_name",
            "is not a queue of backend",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_the_rule(
    fields: dict[str, str], field: str | None, message: str
) -> None:
    response = add(superuser_client(), **fields)
    assert response.status_code == 200
    form = response.context["adminform"].form
    errors = form.errors.get(field or "__all__", [])
    assert any(message in e for e in errors), form.errors
    assert not QueueLimitOverride.objects.exists()


def test_a_second_override_of_a_queue_is_refused() -> None:
    client = superuser_client()
    assert add(client, concurrency_limit="2").status_code == 302
    response = add(client, concurrency_limit="3")
    assert response.status_code == 200
    assert "already exists" in str(response.context["adminform"].form.errors)
    assert QueueLimitOverride.objects.get().concurrency == 2


def test_the_page_says_when_no_queue_is_limited() -> None:
    page = superuser_client().get(LIST).content.decode()
    assert "No queue is limited" in page
