"""The ``scale`` profile: a month of finished tasks, then the admin, the claim, a day's prune and
the enqueue timed beside it (``python -m benchmarks scale --help``)."""
