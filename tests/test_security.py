"""The gauntlet, security: no pickle, rows name only Task objects, SQL takes values as
parameters, and the admin's task controls need their permissions."""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_sqltasks.compat import InvalidTask, TaskResultStatus
from django_sqltasks.core.options import BackendOptions, OptionError
from django_sqltasks.core.resolve import _import_task
from django_sqltasks.models import TaskRecord
from django_sqltasks.worker import Worker
from django_sqltasks.worker.attempt import forget_tasks
from tests import tasks
from tests.conftest import set_backend_options
from tests.factories import staff_client

RunWorker = Callable[..., Worker]
PACKAGE = Path(__file__).resolve().parent.parent / "django_sqltasks"
TASK_NOT_FOUND = "django_sqltasks.exceptions.TaskNotFound"


@functools.cache
def _parsed() -> tuple[tuple[Path, tuple[ast.AST, ...]], ...]:
    """Every module of the package (but its migrations) and its nodes, parsed once for the scans
    of this file, which only read them (a parse of the package: about a second of CPU)."""
    return tuple(
        (path, tuple(ast.walk(ast.parse(path.read_text(), filename=str(path)))))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
    )


def package_nodes() -> Iterator[tuple[Path, ast.AST]]:
    """Each node of each module of the package, with its module's path."""
    for path, nodes in _parsed():
        for node in nodes:
            yield path, node


# No pickle -----------------------------------------------------------------------------------


UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve"}
UNSAFE_CALLS = {"eval", "exec", "__import__"}


def test_no_pickle_eval_or_exec_anywhere_in_the_package() -> None:
    found = []
    for path, node in package_nodes():
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module.split(".")[0]]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            names = [node.func.id] if node.func.id in UNSAFE_CALLS else []
        elif isinstance(node, ast.Attribute) and node.attr in {"load", "loads"}:
            base = node.value
            if isinstance(base, ast.Name) and base.id in UNSAFE_MODULES | {"yaml"}:
                names = [base.id]
        bad = [n for n in names if n in UNSAFE_MODULES | UNSAFE_CALLS | {"yaml"}]
        found += [f"{path.name}:{node.lineno} {n}" for n in bad]
    assert found == []


# A row names a Task, or nothing runs ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "task_path",
    ["os.system", "subprocess.check_call", "builtins.exec", "shutil.rmtree", "posix.system"],
)
def test_a_row_cannot_call_anything_but_a_task(
    run_worker: RunWorker, tmp_path: Path, task_path: str
) -> None:
    target = tmp_path / "pwned"
    calls: dict[str, list[Any]] = {
        "os.system": [f"touch {target}"],
        "posix.system": [f"touch {target}"],
        "subprocess.check_call": [["touch", str(target)]],
        "builtins.exec": [f"open({str(target)!r}, 'w').close()"],
        "shutil.rmtree": [str(tmp_path)],
    }
    record = TaskRecord.objects.create(
        task_path=task_path, backend_name="default", args=calls[task_path]
    )
    run_worker()
    record.refresh_from_db()
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[0]["exception_class_path"] == TASK_NOT_FOUND
    assert "not a Task" in record.errors[0]["traceback"]
    assert tmp_path.exists()
    assert not target.exists()


# SQL takes values as parameters --------------------------------------------------------------


SQL_WORDS = re.compile(
    r"\b(SELECT|UPDATE|INSERT|DELETE|WHERE|SET|COPY|LISTEN|VALUES|JOIN|RETURNING|FROM|PRAGMA)\b"
    r"|json_|JSON_"
)
# What SQL f-strings may interpolate: quoted table names, constant column lists and channel
# names, placeholder lists ("%s, %s"), and SQL fragments built by the same rules. A new name
# here needs a reviewer to check it carries no value; values go in the parameter list.
STRUCTURAL = {
    "self.tasks",
    "self.events",  # the event table's quoted name
    "self.workers",
    "self.paused",  # the paused-queue table's quoted name
    "self._not_in_paused",  # "NOT IN (SELECT queue_name FROM <paused> ... = %s ...)"
    "self.dialect.tasks",
    "CHANNEL",
    "FINISHED_CHANNEL",  # the channel of finished tasks' NOTIFY: a constant name
    "IDS_PER_NOTIFY",  # an int constant: how many finished ids one NOTIFY carries
    # The NOTIFY of finished ids, as a CTE: fixed text built once from the constants above.
    "ANNOUNCE_OUTCOMES",
    "ANNOUNCE_GIVEN_UP",
    "', '.join(['%s'] * len(task_ids))",  # one placeholder per id
    "COLUMNS",
    "RETURNING",
    "INSERT_RECORD",
    "returning",
    "', '.join(INSERT_COLUMNS)",
    "', '.join(OUTCOME_COLUMNS)",
    "', '.join(columns)",
    "marks",
    "rows",
    "queue_sql",
    "where",
    "error",
    "derived",
    "sql",
    "column",
    "class_sql",
    "traceback_sql",
    "j",
    "kind",
    "dialect.tasks",
    "self._json_placeholder",  # "%s" or "%s::jsonb": a placeholder
    "CLAIM_SET",  # what a claim writes on each row it takes: fixed text with placeholders
    "RUNNING_BY_ID",  # an outcome's condition that its row is RUNNING: fixed text
    "IDS_UNSEEN",  # an outcome's ids as a parameter the planner cannot read: fixed text
    # sql/wake_ring.py: the ring's advisory lock class and slot numbers, ints (int() of what
    # the code computes: a crc32, a slot the server returned; SLOTS and HEAD constants), and
    # the channel named by them. Sent on the LISTEN connection by the simple query protocol,
    # which takes no parameters.
    "int(key)",
    "SLOTS",
    "HEAD",
    "held",
    "slot_channel(key, slot)",
    "wake_ring.slot_channel(key, slot)",
    "commit",  # the claim's set_config of synchronous_commit (CLAIM_SYNCHRONOUS_COMMIT), or ""
    # A requeue's status and finished_at (constants, or a CASE on a placeholder's condition)
    # and its rescue count increment: fixed SQL text.
    # sql/postgresql.py's park and send of a durable wait: the wake time ("NULL" or
    # statement_timestamp() plus a placeholder's seconds) and the NOTIFY ("" or a pg_notify
    # of the CHANNEL constant): fixed SQL text.
    "wake",
    "notified",
    "status_sql",
    "finished_sql",
    "rescues_sql",
    # sql/partitions.py: DDL names every table and index through q() (a quoted identifier, the
    # names made from the model's table name), and writes as literals only its constants: a
    # finished status of HISTORY, a partition's bounds (UTC midnights it computes) and the
    # lock timeout; "old" is the old table's quoted name; the conditions are "column = %s".
    "old",
    "status",
    "start.isoformat()",
    "end.isoformat()",
    "DDL_LOCK_TIMEOUT",
    "' AND '.join(conditions)",
    # A requeue's due time: a CASE on the suspects' marks (placeholders) between them and the
    # database's clock.
    "available_sql",
    # The database's clock for writes (a constant function: statement_timestamp()), and a
    # retry's due time built from it and the outcome's delay column (MariaDB).
    "self._write_clock",
    "later",
    # The database's clock: a constant function (now(), UTC_TIMESTAMP(6)), or "%s" with the
    # process's time as a parameter; an interval ago adds a placeholder for the seconds.
    "now",
    "since",
    "live_since",
    # The live partition's autovacuum settings: a constant list of numbers (LIVE_STORAGE).
    "LIVE_STORAGE",
    # The claim's marks (sql/marks.py): int constants placing a priority in the marks' arrays
    # (the walk's start above the highest priority, the arrays' offset, the lowest priority
    # less one), and a time as ISO text by a fixed to_char of a column or a clock function.
    "WALK_START",
    "offset",
    "TASK_MIN_PRIORITY - 1",
    "_utc_text('f.at')",
    "_utc_text('statement_timestamp()')",
    # The claim's walk over priorities: the ready index's leading conditions (placeholders for
    # the values), the table with that index's name (a constant) forced, the probe statements
    # built from them, the recursive CTE that holds them, and fixed ORDER BY text.
    "prefix",
    "source",
    "probe",
    "earliest",
    "span",
    "priorities",
    "order",
    # A PostgreSQL-only index's condition (indexes.py): fixed text the model's Meta gives, as
    # Django's own Index(condition=...) is.
    "self.where",
    # json_insert() of an error into a column (sql/expressions.py): the column and the item as
    # the compiler compiled them, their values in the parameters beside.
    "sql_column",
    "sql_item",
    # The queues' skip scan (sql/lists.py): the table's quoted name and fixed conditions whose
    # backend name is a placeholder.
    "table",
    "waiting",
    # An outcome's guard by the claim's attempt (sql/outcomes.py): "" or " AND attempts = %s".
    "same_claim",
    # A step's record (sql/steps.py): the steps table's quoted name, its constant column list
    # and one placeholder per column.
    "self.steps",
    "', '.join(STEP_COLUMNS)",
    "values",
    # SQLite's busy timeout for the health probe (sql/probes.py): an int it computes (a
    # PRAGMA takes no parameter).
    "busy_ms",
}


def sql_fstrings() -> Iterator[tuple[str, ast.JoinedStr]]:
    for path, node in package_nodes():
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if SQL_WORDS.search(text):
                yield f"{path.relative_to(PACKAGE)}:{node.lineno}", node


def test_sql_fstrings_interpolate_only_names_and_placeholders() -> None:
    found = list(sql_fstrings())
    assert len(found) > 10, "the scan found no SQL: has the package moved?"
    unknown = [
        f"{where} {{{ast.unparse(v.value)}}}"
        for where, node in found
        for v in node.values
        if isinstance(v, ast.FormattedValue)
        and ast.unparse(v.value) not in STRUCTURAL
        and not ast.unparse(v.value).startswith("q(")  # sql/partitions.py: a quoted name
    ]
    assert unknown == [], "review these: values must be parameters, not part of the SQL text"


def test_no_sql_is_built_with_percent_or_format() -> None:
    found = []
    for path, node in package_nodes():
        text = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                text = node.left.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant)
            and isinstance(node.func.value.value, str)
        ):
            text = node.func.value.value
        if text is not None and SQL_WORDS.search(text):
            found.append(f"{path.name}:{node.lineno}")
    assert found == []


HOSTILE = [
    "'; DROP TABLE django_sqltasks_taskrecord; --",
    '"; DROP TABLE django_sqltasks_taskrecord; --',
    "\\'; DELETE FROM django_sqltasks_workerrecord; --",
    "%s %(x)s {0} $1 ? :name",
    "Robert'); UPDATE django_sqltasks_taskrecord SET status='FAILED'; --",
]


@pytest.mark.django_db(transaction=True)
def test_hostile_strings_are_stored_and_run_as_plain_data(
    run_worker: RunWorker, settings: Any
) -> None:
    queue = HOSTILE[0][:64]
    default = settings.TASKS["default"]
    settings.TASKS = {
        **settings.TASKS,
        "default": {**default, "QUEUES": [*default["QUEUES"], queue]},
    }
    bystander = tasks.add.enqueue(1, 2)
    results = [tasks.echo.using(queue_name=queue).enqueue(*HOSTILE, **{h: h for h in HOSTILE})]
    results += [tasks.echo.enqueue(h) for h in HOSTILE]
    for hostile in HOSTILE:  # a worker id and a queue filter made of SQL
        run_worker(worker_id=hostile[:64], queue_names=[queue, hostile, "default"])
    assert TaskRecord.objects.count() == len(results) + 1
    for result in results:
        stored = tasks.echo.get_result(result.id)
        assert stored.status == TaskResultStatus.SUCCESSFUL
        assert stored.return_value == {"args": list(result.args), "kwargs": result.kwargs}
    assert TaskRecord.objects.get(id=results[0].id).queue_name == queue
    assert tasks.add.get_result(bystander.id).return_value == 3
    assert TaskRecord.objects.get(id=bystander.id).worker_ids[0] in [h[:64] for h in HOSTILE]
    with pytest.raises(Exception, match="DROP TABLE"):
        tasks.echo.get_backend().get_result(HOSTILE[0])


@pytest.mark.django_db(transaction=True)
def test_a_hostile_worker_id_survives_a_rescue(run_worker: RunWorker) -> None:
    """The rescue writes the lost worker's id into an error message inside SQL."""
    hostile = HOSTILE[4][:64]
    record = TaskRecord.objects.create(
        task_path="tests.tasks.noop",
        backend_name="default",
        status=TaskResultStatus.RUNNING,
        owner=hostile,
        attempts=1,
        worker_ids=[hostile],
    )
    run_worker()
    record.refresh_from_db()
    assert record.status == TaskResultStatus.SUCCESSFUL
    assert f"Worker {hostile} stopped heartbeating" in record.errors[0]["traceback"]
    assert set(TaskRecord.objects.values_list("status", flat=True)) == {"SUCCESSFUL"}


# The admin's task controls need their permissions --------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("button", "status"), [("retry", "FAILED"), ("cancel", "READY")])
def test_detail_page_controls_refuse_a_user_without_their_permission(
    button: str, status: str
) -> None:
    record = TaskRecord.objects.create(
        task_path="tests.tasks.noop", backend_name="default", status=status
    )
    url = reverse(f"admin:django_sqltasks_taskrecord_{button}", args=[record.pk])
    assert Client().post(url).status_code == 302  # anonymous: to the login page
    assert staff_client("view_taskrecord").post(url).status_code == 403
    record.refresh_from_db()
    assert record.status == status


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["retry_tasks", "cancel_tasks", "delete_selected"])
def test_changelist_actions_refuse_a_view_only_user(action: str) -> None:
    rows = [
        TaskRecord.objects.create(task_path="tests.tasks.noop", backend_name="default", status=s)
        for s in ("READY", "FAILED", "SUCCESSFUL")
    ]
    client = staff_client("view_taskrecord")
    response = client.post(
        reverse("admin:django_sqltasks_taskrecord_changelist"),
        {"action": action, "_selected_action": [str(r.pk) for r in rows]},
    )
    assert response.status_code in (200, 302, 403)
    assert sorted(TaskRecord.objects.values_list("status", flat=True)) == [
        "FAILED",
        "READY",
        "SUCCESSFUL",
    ]


# A row names modules of this project, never others -------------------------------------------


@pytest.fixture
def unload() -> Iterator[None]:
    """Forget tests.tasks_unloaded after the test, so each test starts with it not loaded."""
    sys.modules.pop("tests.tasks_unloaded", None)
    yield
    sys.modules.pop("tests.tasks_unloaded", None)
    _import_task.cache_clear()
    forget_tasks()


def run_row(run_worker: RunWorker, task_path: str) -> TaskRecord:
    record = TaskRecord.objects.create(task_path=task_path, backend_name="default")
    run_worker()
    record.refresh_from_db()
    return record


@pytest.mark.django_db(transaction=True)
def test_a_row_naming_a_module_outside_the_project_does_not_import_it(
    run_worker: RunWorker,
) -> None:
    assert "this" not in sys.modules
    record = run_row(run_worker, "this.s")
    assert "this" not in sys.modules, "the worker ran `import this`"
    assert record.status == TaskResultStatus.FAILED
    assert record.errors[0]["exception_class_path"] == TASK_NOT_FOUND
    assert "module 'this' is not loaded" in record.errors[0]["traceback"]


@pytest.mark.django_db(transaction=True)
def test_modules_of_installed_apps_are_imported_by_default(
    run_worker: RunWorker, unload: None
) -> None:
    record = run_row(run_worker, "tests.tasks_unloaded.unloaded")
    assert record.status == TaskResultStatus.SUCCESSFUL, record.errors
    assert record.return_value == "ran"


@pytest.mark.django_db(transaction=True)
def test_task_modules_narrows_what_a_row_may_import(
    run_worker: RunWorker, settings: Any, unload: None
) -> None:
    set_backend_options(settings, TASK_MODULES=["tests.tasks"])
    record = run_row(run_worker, "tests.tasks_unloaded.unloaded")
    assert "tests.tasks_unloaded" not in sys.modules
    assert record.errors[0]["exception_class_path"] == TASK_NOT_FOUND
    assert tasks.add.enqueue(1, 2)  # tests.tasks is loaded, and allowed besides
    set_backend_options(settings, TASK_MODULES=["tests.tasks_unloaded"])
    assert run_row(run_worker, "tests.tasks_unloaded.unloaded").return_value == "ran"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tests", "must be a list of module names (or None), not 'tests'"),
        (
            ["tests..tasks"],
            "must hold dotted module names such as 'myapp.tasks', not 'tests..tasks'",
        ),
        ([3], "not 3"),
    ],
)
def test_task_modules_must_be_module_names(value: Any, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        BackendOptions.parse("default", {"TASK_MODULES": value})


@pytest.mark.django_db
def test_a_task_cannot_be_enqueued_on_a_backend_of_another_database(settings: Any) -> None:
    second = {**settings.TASKS["default"]}
    second["OPTIONS"] = {**second["OPTIONS"], "DATABASE": "second"}
    settings.TASKS = {**settings.TASKS, "second": second}
    with pytest.raises(InvalidTask, match="is declared for backend 'default', whose tasks are in"):
        tasks.noop.using(backend="second")
    assert not TaskRecord.objects.exists()
