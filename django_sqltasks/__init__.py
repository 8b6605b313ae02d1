"""django-sqltasks: a Django Tasks backend that keeps every task in the project's own database."""

from .backend import SQLTaskBackend

__all__ = ["SQLTaskBackend"]
__version__ = "0.1.0"
