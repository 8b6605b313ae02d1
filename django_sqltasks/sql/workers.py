"""Statements on the worker table: the leases that tell live workers from dead ones."""

from __future__ import annotations

from django.db.backends.utils import CursorWrapper

from ..core.claim_cost import ClaimCost
from .vendor import Vendor

# The worker row's columns that a heartbeat publishes its claims' cost in, after its time.
CLAIM_COLUMNS = (
    "claim_count",
    "claim_rows",
    "claim_mean",
    "claim_p99",
    "claim_max",
    "claim_full_passes",
    "claim_full_pass_max",
)


class WorkerStatements(Vendor):
    """A worker's heartbeat, and which workers are alive by the database's clock."""

    def heartbeat(
        self, cursor: CursorWrapper, worker_id: str, claims: ClaimCost | None = None
    ) -> bool:
        """Renew ``worker_id``'s lease by the database's clock, and publish what its
        ``claims`` cost as of now (None: leave what the row says, as a supervisor renewing
        its child's lease does); False if its row is gone."""
        now, params = self._now_sql()
        if claims is None:
            cursor.execute(
                f"UPDATE {self.workers} SET heartbeat_at = {now} WHERE id = %s",
                [*params, worker_id],
            )
            return cursor.rowcount > 0
        values = [
            claims.count,
            claims.rows,
            claims.mean,
            claims.p99,
            claims.max,
            claims.full_passes,
            claims.full_pass_max,
        ]
        cursor.execute(
            f"UPDATE {self.workers} SET heartbeat_at = {now}, claim_measured_at = {now}, "
            + ", ".join(f"{column} = %s" for column in CLAIM_COLUMNS)
            + " WHERE id = %s",
            [*params, *params, *values, worker_id],
        )
        return cursor.rowcount > 0

    def live_worker(
        self, cursor: CursorWrapper, worker_id: str, lease_timeout: float
    ) -> tuple[int, str, str] | None:
        """The pid, host and process identity of ``worker_id`` if it heartbeat within
        ``lease_timeout`` seconds."""
        since, params = self._ago_sql(lease_timeout)
        cursor.execute(
            f"SELECT pid, hostname, process FROM {self.workers} "
            f"WHERE id = %s AND heartbeat_at >= {since}",
            [worker_id, *params],
        )
        row = cursor.fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def live_workers_like(
        self, cursor: CursorWrapper, prefix: str, lease_timeout: float
    ) -> list[tuple[str, int, str, str]]:
        """The id, pid, host and process identity of workers whose id starts with ``prefix``
        and that heartbeat within ``lease_timeout`` seconds."""
        since, params = self._ago_sql(lease_timeout)
        # "!" escapes: a backslash would need escaping itself in MySQL's string literals.
        escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
        cursor.execute(
            f"SELECT id, pid, hostname, process FROM {self.workers} "
            f"WHERE id LIKE %s ESCAPE '!' AND heartbeat_at >= {since}",
            [escaped + "%", *params],
        )
        return [(row[0], row[1], row[2], row[3]) for row in cursor.fetchall()]

    def forget_dead_workers(self, cursor: CursorWrapper, lease_timeout: float) -> int:
        """Delete the rows of workers silent for over ``lease_timeout`` seconds."""
        since, params = self._ago_sql(lease_timeout)
        cursor.execute(f"DELETE FROM {self.workers} WHERE heartbeat_at < {since}", params)
        return cursor.rowcount
