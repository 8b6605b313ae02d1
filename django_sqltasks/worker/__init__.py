"""The worker: claims due tasks and runs them, one role per module (see ``runner``)."""

from .checks import MAX_WORKER_ID_LENGTH
from .runner import Worker

__all__ = ["MAX_WORKER_ID_LENGTH", "Worker"]
