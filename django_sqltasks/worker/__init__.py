"""The worker: claims due tasks and runs them, one role per module (see ``runner``)."""

from .runner import MAX_WORKER_ID_LENGTH, Worker

__all__ = ["MAX_WORKER_ID_LENGTH", "Worker"]
