"""django-sqltasks: a Django Tasks backend that keeps every task in the project's own database."""

from .backend import SQLTaskBackend
from .core.workflows import chain, group, signature
from .exceptions import Snooze

__all__ = ["SQLTaskBackend", "Snooze", "chain", "group", "signature"]
__version__ = "0.1.0"
