"""Side-by-side benchmark suite for django-sqltasks and its peers.

Run ``python -m benchmarks run --help``. See ``docs/benchmarks.md`` for the method.
"""
