"""The limit keys (``sql/limit_keys.py`` and each database's form): found one probe a key, and
claimed in their scope; on the active database."""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqltasks.sql.dialect import Dialect
from tests.sql.support import WORKER, claim_batch, new_task


@pytest.mark.django_db(transaction=True)
def test_limit_keys_are_found_one_probe_a_key_and_claimed_in_their_scope(
    dialect: Dialect,
) -> None:
    from django_sqltasks.sql import Scope

    tasks = [new_task(limit_key=key) for key in ("b", "a", "a", "c")] + [new_task()]
    with connection.cursor() as cursor:
        dialect.insert(cursor, tasks)
        assert dialect.limit_keys(cursor, "default", after="", count=10) == ["a", "b", "c"]
        assert dialect.limit_keys(cursor, "default", after="a", count=1) == ["b"]
        assert dialect.limit_keys(cursor, "other", after="", count=10) == []
        limited = dialect.claim(
            cursor,
            backend_name="default",
            queue_names=None,
            worker_id=WORKER,
            limit=10,
            scope=Scope(limit_key="a"),
        )
    assert sorted(r.id for r in limited) == sorted(t.id for t in tasks[1:3])
    # The main claim takes only the task of no limit.
    assert [r.id for r in claim_batch(dialect)] == [tasks[4].id]
