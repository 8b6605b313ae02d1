"""The ``mixed`` profile: a task queue in a database that also serves the app (issue 44).

``python -m benchmarks mixed`` (see ``benchmarks.mixed.cli``) starts a private PostgreSQL 15 with
autovacuum at its defaults, puts a steady rate of tasks through django-sqltasks and through the
classic SKIP LOCKED table, one after the other, and holds snapshots in the middle of each run
(analytics sessions, a ``pg_dump``). django-sqltasks' task is ``touch`` in
benchmarks/projects/tasks.py (an installed app's, so that its worker imports it).
"""
