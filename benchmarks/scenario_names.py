"""The scenarios' names, for the command line (which imports no scenario's dependencies)."""

from __future__ import annotations

THROUGHPUT_SCENARIOS = ("noop", "sleep")
ALL_SCENARIOS = ("noop", "sleep", "latency", "busy", "http", "bulk")
# Run only when named (--scenarios fairness): django-sqltasks alone, see benchmarks/fairness.py
# and benchmarks/waiters.py.
EXTRA_SCENARIOS = ("fairness", "waiters")
