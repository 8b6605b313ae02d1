"""The admin: one module per page. Django's autodiscover imports this package, and so the pages."""

from . import events, limits, overview, queue_limits, schedules, subject, tasks, workers  # noqa: F401  (registers each page's ModelAdmin)
