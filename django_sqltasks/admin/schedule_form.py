"""The form of the admin's periodic tasks page: each field checked as a worker would read it,
with errors that name the field and the rule, and the whole entry parsed before it is saved, so
that nothing the page accepts can stop a scheduler tick."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django import forms
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..core.backends import SQLBackend, sql_backends
from ..core.binding import check_binds
from ..core.resolve import resolve_task
from ..core.schedules import (
    ScheduleError,
    check_cron,
    check_every,
    check_priority,
    check_queue_name,
    check_task_path,
    check_time_zone,
    parse_schedule,
)
from ..core.serialization import check_arguments, dumps, text_problem
from ..exceptions import UnknownQueue
from ..models import ScheduleRecord
from ..ops.declared import declared_task_paths
from ..store.flow import check_queue
from ..store.schedules import backend_time_zone, entry_of

if TYPE_CHECKING:
    ScheduleFormBase = forms.ModelForm[ScheduleRecord]
else:
    ScheduleFormBase = forms.ModelForm

# The fields the page edits; of a schedule from settings, only ``enabled``.
DEFINITION = (
    "task_path",
    "args",
    "kwargs",
    "cron",
    "time_zone",
    "every",
    "queue_name",
    "priority",
)
EDITABLE = ("backend_name", "name", "enabled", *DEFINITION)
THIS = "This field"  # the start of Django's own field errors ("This field is required.")


class JSONText(forms.CharField):
    """JSON typed in a text area: shown as JSON, read back as data. Unlike Django's
    ``forms.JSONField``, a document nested past Python's recursion limit is a form error,
    not a 500."""

    widget = forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "vLargeTextField"})

    def __init__(self, *, kind: type, **kwargs: Any) -> None:
        self.kind = kind
        super().__init__(strip=True, required=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return value
        return json.dumps(self.kind() if value is None else value, ensure_ascii=False)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if not text:
            return self.kind()
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            # ValueError: not JSON, or an integer of more digits than Python reads.
            raise forms.ValidationError(
                _("Enter valid JSON (%(kind)s): %(error)s"),
                params={"kind": "a list" if self.kind is list else "an object", "error": e},
            ) from e
        if not isinstance(data, self.kind):
            raise forms.ValidationError(
                _("Enter a JSON %(kind)s, such as %(example)s."),
                params={
                    "kind": "list" if self.kind is list else "object",
                    "example": '[1, "a"]' if self.kind is list else '{"name": "value"}',
                },
            )
        return data

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (self.kind() if initial is None else initial)
        except forms.ValidationError:
            return True


class Suggesting(forms.TextInput):
    """A text input that offers ``options`` (a ``<datalist>``) and still takes any text, which
    the form then checks: a task the scan did not find, a queue of a backend without QUEUES."""

    def __init__(self, options: Iterable[str], attrs: dict[str, Any] | None = None) -> None:
        super().__init__(attrs)
        self.options = list(options)

    def render(
        self, name: str, value: Any, attrs: dict[str, Any] | None = None, renderer: Any = None
    ) -> SafeString:
        list_id = f"{(attrs or {}).get('id') or name}_options"
        field = super().render(name, value, {**(attrs or {}), "list": list_id}, renderer)
        options = format_html_join("", '<option value="{}">', ((o,) for o in self.options))
        return format_html('{}<datalist id="{}">{}</datalist>', field, list_id, options)


class ScheduleForm(ScheduleFormBase):
    """The checks of a PERIODIC entry, each error on its field; then the task is imported
    (within the trust boundary the workers keep) and the arguments bound to its function."""

    backend_name = forms.ChoiceField(label=_("Backend"))
    args = JSONText(
        kind=list, label=_("Arguments (args)"), help_text=_('A JSON list, such as [1, "a"].')
    )
    kwargs = JSONText(
        kind=dict,
        label=_("Keyword arguments (kwargs)"),
        help_text=_('A JSON object, such as {"base": "EUR"}.'),
    )

    class Meta:
        model = ScheduleRecord
        fields = EDITABLE
        help_texts = {
            "task_path": _("The dotted path of a @task function, such as reports.tasks.build."),
            "cron": _(
                "A cron expression, such as 0 3 * * * (03:00 every day) or */15 * * * *. "
                "Give cron or every, not both."
            ),
            "time_zone": _(
                "For cron: the IANA zone its wall clock is read in, such as Europe/Paris. "
                "Blank: the backend's TIME_ZONE."
            ),
            "every": _("Seconds between runs, 1 to 31,622,400 (366 days), aligned to the epoch."),
            "queue_name": _("Blank: the task's own queue."),
            "priority": _("-100 to 100. Blank: the task's own priority."),
            "enabled": _("Takes effect at the workers' next scheduler tick."),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        backends = sql_backends()
        if "task_path" in self.fields:
            self.fields["task_path"].widget = Suggesting(
                declared_task_paths(), {"class": "vTextField"}
            )
        if "queue_name" in self.fields:
            queues = sorted({q for backend in backends.values() for q in backend.queues})
            self.fields["queue_name"].widget = Suggesting(queues, {"class": "vTextField"})
        if "backend_name" in self.fields:
            aliases = sorted(backends)
            field = self.fields["backend_name"]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [(a, a) for a in aliases]
            if len(aliases) == 1 and not self.instance.pk:
                field.initial = aliases[0]

    def _checked(self, name: str, check: Any) -> Any:
        value = self.cleaned_data.get(name)
        if value in (None, ""):
            return value
        try:
            return check(THIS, value)
        except ScheduleError as e:
            raise forms.ValidationError(str(e)) from e

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        problem = text_problem(name)
        if problem is not None:
            raise forms.ValidationError(f"{THIS} {problem}.")
        return name

    def clean_task_path(self) -> str:
        path: str = self._checked("task_path", check_task_path)
        return path

    def clean_cron(self) -> str:
        cron: str = self._checked("cron", check_cron)
        return cron.strip()

    def clean_time_zone(self) -> str:
        zone: str = self._checked("time_zone", check_time_zone)
        return zone

    def clean_every(self) -> float | None:
        every: float | None = self._checked("every", check_every)
        return every

    def clean_queue_name(self) -> str:
        queue: str = self._checked("queue_name", check_queue_name)
        return queue

    def clean_priority(self) -> int | None:
        priority: int | None = self._checked("priority", check_priority)
        return priority

    def clean_args(self) -> list[Any]:
        return self._arguments("args")

    def clean_kwargs(self) -> dict[str, Any]:
        return self._arguments("kwargs")

    def _arguments(self, name: str) -> Any:
        value = self.cleaned_data.get(name)
        try:
            if name == "args":
                check_arguments(value, {})
            else:
                check_arguments([], value)
        except TypeError as e:  # InvalidTaskArguments names the argument and the rule
            raise forms.ValidationError(str(e)) from e
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        backend = self._backend(data)
        if backend is None:
            return data
        # Of a schedule from settings, the form holds 'enabled' only: nothing else to check.
        if self.instance.pk is None or self.instance.origin == ScheduleRecord.ADMIN:
            self._check_timing(data)
            self._check_name(data, backend)
            if not self.errors:
                self._check_task(data, backend)
        return data

    def _backend(self, data: dict[str, Any]) -> SQLBackend | None:
        alias = data.get("backend_name") or self.instance.backend_name
        backend = sql_backends().get(alias)
        if backend is None:
            self.add_error(None, f"{alias!r} is not a django-sqltasks backend of TASKS.")
        return backend

    def _check_timing(self, data: dict[str, Any]) -> None:
        cron, every = data.get("cron"), data.get("every")
        if bool(cron) == (every is not None):
            message = _("Give a cron expression or an interval in seconds (every), not both.")
            if not cron:
                message = _("Give a cron expression or an interval in seconds (every).")
            self.add_error("cron", message)
        elif every is not None and data.get("time_zone"):
            self.add_error(
                "time_zone",
                _(
                    "A time zone applies to cron only: every counts seconds from the Unix "
                    "epoch, the same in every time zone. Leave it blank."
                ),
            )

    def _check_name(self, data: dict[str, Any], backend: SQLBackend) -> None:
        if data.get("name") in backend.config.periodic:
            self.add_error(
                "name",
                _(
                    "OPTIONS['PERIODIC'] of backend %(alias)s declares a schedule of this name; "
                    "it would replace this one when a worker starts. Choose another name."
                )
                % {"alias": backend.alias},
            )

    def _check_task(self, data: dict[str, Any], backend: SQLBackend) -> None:
        try:
            task = resolve_task(data["task_path"], backend=backend.alias)
        except Exception as e:  # TaskNotFound, TaskBackendMismatch: they say why
            self.add_error("task_path", str(e))
            return
        queue = data.get("queue_name")
        if queue:
            try:
                check_queue(backend.alias, backend.queues, queue)
            except UnknownQueue as e:
                self.add_error("queue_name", str(e))
                return
        args, kwargs = data.get("args") or [], data.get("kwargs") or {}
        try:
            check_binds(task, args, kwargs)
            task.using(queue_name=queue or None, priority=data.get("priority"))
        except Exception as e:  # InvalidTaskArguments, InvalidTask: they say why
            self.add_error("kwargs" if kwargs else "args", str(e))
            return
        limit = backend.config.max_payload_bytes
        size = len(dumps(args).encode()) + len(dumps(kwargs).encode())
        if limit is not None and size > limit:
            self.add_error(
                "args",
                f"The arguments take {size:,} bytes as JSON, over the backend's "
                f"MAX_PAYLOAD_BYTES ({limit:,}).",
            )
            return
        # The whole entry, as a worker reads it: nothing above should let a bad one through.
        row = ScheduleRecord(**{k: data.get(k) for k in DEFINITION})
        row.args, row.kwargs = args, kwargs
        try:
            parse_schedule(str(_("This schedule")), "", entry_of(row), backend_time_zone(backend))
        except ScheduleError as e:
            self.add_error(None, str(e))
