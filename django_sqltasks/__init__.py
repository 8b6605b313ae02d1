"""django-sqltasks: a Django Tasks backend that keeps every task in the project's own database."""

from .backend import SQLTaskBackend
from .exceptions import Snooze
from .workflows import chain, group, signature

__all__ = ["SQLTaskBackend", "Snooze", "chain", "group", "signature"]
__version__ = "0.1.0"
