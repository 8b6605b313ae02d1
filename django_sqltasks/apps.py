from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SQLTasksConfig(AppConfig):
    name = "django_sqltasks"
    # Not "Tasks": the task list's breadcrumb would read "Home > Tasks > Tasks".
    verbose_name = _("Task queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # In ready(), as Django advises for checks: apps.py is imported before the apps are ready.
        from .core import tasks_check
        from .ops import checks  # noqa: F401  (registers the database checks)

        tasks_check.replace_djangos_check()
