"""A command whose reader goes away (``manage.py tasks_status | head``) stops quietly."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand

EXIT_PIPE_CLOSED = 1  # what Python's documentation advises for an EPIPE


class QuietWhenPipeCloses(BaseCommand):
    """End the command without a ``BrokenPipeError`` traceback when its output's reader has
    closed the pipe, as ``head`` does once it has its lines; exit ``EXIT_PIPE_CLOSED``."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            output = super().execute(*args, **options)
            # Output that fitted in the buffer meets the closed pipe here, not at exit, where
            # Python would print "Exception ignored ... BrokenPipeError".
            sys.stdout.flush()
        except BrokenPipeError:
            # Nothing more can be written there, and Python flushes stdout once more at exit:
            # point it at /dev/null, so that flush does not fail too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_PIPE_CLOSED)
        return output
