from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from benchmarks.projects.enqueue import aenqueue
from benchmarks.projects.tasks import noop


async def enqueue_view(request: HttpRequest) -> HttpResponse:
    """Enqueue one NoOp task per request, as an async view of a real project would."""
    await aenqueue(noop)
    return HttpResponse(b"ok", content_type="text/plain")
