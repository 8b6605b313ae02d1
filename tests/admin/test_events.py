"""The admin's list of durable tasks' events: what became of each (sent for nobody, awaited,
taken), filtered by it; only an unclaimed one may be deleted."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks import send_event
from django_sqltasks.models import EventRecord

pytestmark = pytest.mark.django_db

LIST = "admin:django_sqltasks_eventrecord_changelist"


@pytest.fixture
def three() -> dict[str, EventRecord]:
    send_event("order.paid", "nobody-waits")
    waiting = EventRecord.objects.create(name="order.paid", key="awaited", task_id=uuid.uuid4())
    send_event("order.paid", "awaited-and-sent")
    EventRecord.objects.filter(key="awaited-and-sent").update(task_id=uuid.uuid4())
    return {
        "unclaimed": EventRecord.objects.get(key="nobody-waits"),
        "waiting": waiting,
        "received": EventRecord.objects.get(key="awaited-and-sent"),
    }


def test_unclaimed_events_are_listed_and_filtered(
    admin_client: Client, three: dict[str, EventRecord]
) -> None:
    html = admin_client.get(reverse(LIST)).content.decode()
    for key in ("nobody-waits", "awaited", "awaited-and-sent"):
        assert key in html
    assert "sent, no task waits for it" in html
    for state, event in three.items():
        html = admin_client.get(reverse(LIST), {"state": state}).content.decode()
        assert f">{event.key}<" in html, state
        others = [e.key for s, e in three.items() if s != state]
        assert not any(f">{key}<" in html for key in others), state


def test_only_an_unclaimed_event_may_be_deleted(
    admin_client: Client, three: dict[str, EventRecord]
) -> None:
    """The row of an awaited event is where its wait and the send meet: deleting it would let
    the send store the payload for nobody, and the task would wait for ever."""
    for state in ("waiting", "received"):
        url = reverse("admin:django_sqltasks_eventrecord_delete", args=[three[state].pk])
        assert admin_client.post(url, {"post": "yes"}).status_code == 403
    response = admin_client.post(
        reverse(LIST),
        {
            "action": "delete_selected",
            "post": "yes",
            "_selected_action": [e.pk for e in three.values()],
        },
    )
    assert response.status_code == 302
    messages = [m.message for m in response.wsgi_request._messages]
    assert "2 selected event(s) are awaited or taken by a task and were kept" in messages[0]
    assert set(EventRecord.objects.values_list("key", flat=True)) == {
        "awaited",
        "awaited-and-sent",
    }
