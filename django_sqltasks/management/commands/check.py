"""Django's ``check``, saying in one line which database cannot be reached.

With ``--database``, Django's own checks of a JSONField (SQLite) or a UUIDField (MySQL) connect
before any of this app's, and a refused connection ended in a traceback. This command is
Django's, and only turns that into the one line the worker prints (as ``staticfiles`` extends
``runserver``).
"""

from __future__ import annotations

from django.core.management.commands import check

from ..pipes import QuietWhenPipeCloses
from ..startup import OneLineWhenUnreachable


class Command(QuietWhenPipeCloses, OneLineWhenUnreachable, check.Command):
    """Django's system check command."""
