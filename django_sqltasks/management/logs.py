"""The worker's log output: one level for this package's logger and Django's tasks logger."""

from __future__ import annotations

import logging

from django_sqltasks.compat import TASKS_LOGGER

# Django's ``django.tasks`` (``django_tasks`` on 5.2) logs each task's start and finish; the
# worker's own lines come from ``django_sqltasks``. -v and --loglevel govern both.
LOGGERS = ("django_sqltasks", TASKS_LOGGER)
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(verbosity: int, level: int | None = None) -> int:
    """Set both loggers to ``level`` (else the one ``verbosity`` means) and return it.

    A logger the project's LOGGING gives handlers of its own, or whose records a configured root
    logger takes, keeps them. Otherwise it gets one stderr handler and stops propagating, so that
    each record is printed once whether or not DEBUG's console handler would also print it.
    """
    if level is None:
        level = VERBOSITY_LEVELS.get(verbosity, logging.DEBUG)
    root_configured = bool(logging.getLogger().handlers)
    handler: logging.Handler | None = None
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if logger.handlers or root_configured:
            continue
        if handler is None:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
        logger.propagate = False
    return level
