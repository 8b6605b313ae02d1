"""Add the days of partitions of finished tasks ahead (PostgreSQL's partitioned table; nothing
elsewhere): ``store.partitions.add_days``."""

from __future__ import annotations

from ...store.partitions import add_days
from . import Guarded, Service


class PartitionDays(Service):
    """A catalog read once an ``interval``, and a few DDL statements once a day."""

    def __init__(self, *, database: str, interval: float) -> None:
        super().__init__(interval=interval)
        self.database = database

    def work(self, guarded: Guarded) -> None:
        guarded("Adding partitions of finished tasks", self.add)

    def add(self) -> int:
        return add_days(self.database)
