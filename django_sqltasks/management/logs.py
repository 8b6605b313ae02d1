"""The worker's log output: one level for this package's logger and Django's tasks logger."""

from __future__ import annotations

import logging

from django.conf import settings

from ..compat import TASKS_LOGGER

# Django's ``django.tasks`` (``django_tasks`` on 5.2) logs each task's start and finish; the
# worker's own lines come from ``django_sqltasks``. -v and --loglevel govern both.
LOGGERS = ("django_sqltasks", TASKS_LOGGER)
VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(verbosity: int, level: int | None = None) -> int:
    """Set both loggers to ``level`` (else the one ``verbosity`` means) and return it; at the
    default verbosity without DEBUG, Django's tasks logger shows only warnings and errors.

    A logger the project's LOGGING gives handlers of its own, or whose records a configured root
    logger takes, keeps them. Otherwise it gets one stderr handler and stops propagating, so that
    each record is printed once whether or not DEBUG's console handler would also print it.
    """
    explicit = level is not None
    if level is None:
        level = VERBOSITY_LEVELS.get(verbosity, logging.DEBUG)
    root_configured = bool(logging.getLogger().handlers)
    handler: logging.Handler | None = None
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if name == TASKS_LOGGER and not explicit and verbosity == 1 and not settings.DEBUG:
            # Django's own line per task start and finish, which its default logging shows only
            # with DEBUG: at the default verbosity, a production worker neither prints nor
            # builds them (two records per task cost a fifth of a fast worker's time). Its
            # failures (ERROR) still show; -v 2 or --loglevel INFO shows every line.
            logger.setLevel(max(level, logging.WARNING))
        else:
            logger.setLevel(level)
        if logger.handlers or root_configured:
            continue
        if handler is None:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
        logger.propagate = False
    return level
