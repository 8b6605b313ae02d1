"""The SQL tests' fixture: the active database's dialect."""

from __future__ import annotations

import pytest
from django.db import connection

from django_sqltasks.sql import dialect_for
from django_sqltasks.sql.dialect import Dialect


@pytest.fixture
def dialect() -> Dialect:
    return dialect_for(connection)
