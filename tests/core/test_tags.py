"""Tags set at enqueue: checked, stored, shown on the list and the task page, and filtered."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks.compat import InvalidTask
from django_sqltasks.core.tags import MAX_TAG_LENGTH, MAX_TAGS
from django_sqltasks.models import TaskRecord
from tests import tasks

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:django_sqltasks_taskrecord_changelist"


def test_tags_of_the_declaration_and_of_using_are_stored() -> None:
    declared = tasks.tagged.enqueue("ORD-1")
    replaced = tasks.tagged.using(tags=["urgent"]).enqueue("ORD-2")
    plain = tasks.add.enqueue(1, 2)
    assert TaskRecord.objects.get(pk=declared.id).tags == ["billing", "tenant:acme"]
    assert TaskRecord.objects.get(pk=replaced.id).tags == ["urgent"]
    assert TaskRecord.objects.get(pk=plain.id).tags is None  # NULL: out of the tag index


def test_tags_are_stored_by_enqueue_many_and_aenqueue_alike() -> None:
    backend = tasks.tagged.get_backend()
    results = backend.enqueue_many(tasks.tagged, [(("A",), {}), (("B",), {})])
    stored = TaskRecord.objects.filter(pk__in=[r.id for r in results])
    assert [r.tags for r in stored] == [["billing", "tenant:acme"]] * 2


@pytest.mark.parametrize(
    ("tags", "rule"),
    [
        ("billing", "not 'billing'"),
        ([1], "1 is not"),
        (["with space"], "'with space' is not"),
        (['quote"'], "is not"),
        ([""], "'' is not"),
        (["x" * (MAX_TAG_LENGTH + 1)], "is not"),
        ([f"t{i}" for i in range(MAX_TAGS + 1)], f"{MAX_TAGS + 1} given"),
        ({"a": 1}, "not {'a': 1}"),
    ],
)
def test_bad_tags_are_refused_naming_the_field_and_rule(tags: Any, rule: str) -> None:
    task: Any = tasks.add  # an SQLTask: Django's Task.using() has no tags
    with pytest.raises(InvalidTask) as raised:
        task.using(tags=tags)
    message = str(raised.value)
    assert message.startswith("tags must be a list of at most") and rule in message


def test_tags_are_shown_and_filtered(admin_client: Client) -> None:
    tagged = tasks.tagged.enqueue("ORD-1")
    add: Any = tasks.add  # an SQLTask: Django's Task.using() has no tags
    other = add.using(tags=["tenant:other"]).enqueue(1, 2)
    listed = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert 'class="sqltasks-tag" href="/admin/django_sqltasks/taskrecord/?tag=billing"' in listed
    assert "?tag=tenant%3Aacme" in listed  # the declared tags are the filter's choices
    filtered = admin_client.get(reverse(CHANGELIST), {"tag": "billing"}).content.decode()
    assert tagged.id in filtered and other.id not in filtered
    # A tag set with using() is no choice of the filter, but its URL filters all the same.
    by_url = admin_client.get(reverse(CHANGELIST), {"tag": "tenant:other"}).content.decode()
    assert other.id in by_url and tagged.id not in by_url
    page = admin_client.get(
        reverse("admin:django_sqltasks_taskrecord_change", args=[tagged.id])
    ).content.decode()
    assert ">tenant:acme</a>" in page


def test_a_filter_for_a_tag_no_task_can_have_is_empty(admin_client: Client) -> None:
    tasks.tagged.enqueue("ORD-1")
    body = admin_client.get(reverse(CHANGELIST), {"tag": '%_\\"'}).content.decode()
    assert '<span class="sqltasks-count">0</span>' in body
