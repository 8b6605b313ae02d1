"""PostgreSQL's LISTEN/NOTIFY channels: new tasks, announced by queue, and finished tasks, by
id, for ``result.wait()``; and the SQL that announces the finished rows of a statement."""

from __future__ import annotations

CHANNEL = "sqltasks"  # LISTEN/NOTIFY channel; payload: the queue name of the enqueued task(s)
# The channel of finished tasks, for ``result.wait()``; payload: their ids, comma-separated.
FINISHED_CHANNEL = "sqltasks_finished"
# Ids per notification: 200 ids of 36 characters and their commas are 7,399 bytes, under
# PostgreSQL's payload limit of 8,000.
IDS_PER_NOTIFY = 200


def _announce_finished_sql(rows: str, where: str) -> str:
    """A query that sends the ids of ``rows`` (a CTE with ``id`` and ``status``) matching
    ``where`` on FINISHED_CHANNEL, IDS_PER_NOTIFY to a notification. It yields one row (how
    many it sent), so a statement that joins it as a CTE always runs it."""
    return f"""
        SELECT count(pg_notify('{FINISHED_CHANNEL}', g.ids)) FROM (
            SELECT string_agg(f.id::text, ',') AS ids FROM (
                SELECT id, row_number() OVER () AS n FROM {rows} WHERE {where}
            ) AS f
            GROUP BY (f.n - 1) / {IDS_PER_NOTIFY}
        ) AS g
    """


# Fixed SQL text: the tasks an outcome batch finished (not those it sent back to READY), and
# the tasks a rescue failed out of rescues, each as the CTE ``done`` returns them.
ANNOUNCE_OUTCOMES = _announce_finished_sql("done", "status <> 'READY'")
ANNOUNCE_GIVEN_UP = _announce_finished_sql("done", "status = 'FAILED'")
