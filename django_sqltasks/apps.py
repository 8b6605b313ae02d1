from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class SQLTasksConfig(AppConfig):
    name = "django_sqltasks"
    verbose_name = _("Tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the database checks)
