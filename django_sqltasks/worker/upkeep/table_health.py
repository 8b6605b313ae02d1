"""Read the task table's health (dead rows, autovacuum, an old transaction holding cleanup
back) now and then, and log each warning once, when it appears, and once when it clears."""

from __future__ import annotations

from ...ops import health
from . import Guarded, Service


class TableHealth(Service):
    """Two cheap statements on PostgreSQL's statistics views (about 1 ms), two on MariaDB's
    information_schema, none on SQLite, once an ``interval``."""

    def __init__(self, *, database: str, interval: float) -> None:
        super().__init__(interval=interval)
        self.database = database
        self._watch = health.Watch(database)  # the warnings already logged

    def work(self, guarded: Guarded) -> None:
        found = guarded("Reading the task table's health", self.read)
        if found is not None:
            self._watch.update(found)  # logs each warning once, when it appears

    def read(self) -> list[health.HealthWarning]:
        return health.warnings(health.read(self.database), self.database)
