"""Connection settings for the PostgreSQL connections opened outside Django's own."""

from __future__ import annotations

from typing import Any

from django.db import connections

# Keys Django adds for its own cursor classes and adapters; our plain connections skip them.
DJANGO_ONLY = ("cursor_factory", "context", "server_side_binding")


def connection_params(database: str) -> dict[str, Any]:
    """psycopg ``connect()`` keyword arguments for ``DATABASES[database]``."""
    params = connections[database].get_connection_params()
    for key in DJANGO_ONLY:
        params.pop(key, None)
    return params
