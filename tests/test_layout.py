"""The tests are laid out like the code: a module's tests sit under the folder of its layer."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import DJANGO_API_MODULES

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "django_sqltasks"
# Test files at the top that test the package as a whole rather than one module of it.
WHOLE_PACKAGE = {
    "test_conformance.py": "the Django Tasks backend contract, point by point",
    "test_contract.py": "Django's Tasks API as Django's own tests use it",
    "test_public_api.py": "the names the package exports (__init__.py)",
    "test_security.py": "what no module of the package may do",
    "test_docs.py": "what the docs count of the package (its admin pages, the demo's tasks)",
    "test_benchmarks.py": "the benchmark harness's command line without its dependencies",
    "test_layout.py": "this file",
}


def test_every_test_file_sits_under_the_layer_it_tests() -> None:
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        folder = path.parent.relative_to(TESTS)
        if folder == Path("."):
            module = path.name.removeprefix("test_")
            exists = (PACKAGE / module).exists() or (PACKAGE / module.removesuffix(".py")).is_dir()
            if path.name not in WHOLE_PACKAGE and not exists:
                misplaced.append(f"{path.name}: no django_sqltasks/{module} at the top")
        elif folder.parts[-1] == "browser":  # the admin's pages in a real browser
            if not (PACKAGE / folder.parent).is_dir():
                misplaced.append(f"{folder}: no django_sqltasks/{folder.parent}")
        elif not (PACKAGE / folder).is_dir():
            misplaced.append(f"{folder / path.name}: no django_sqltasks/{folder}")
    assert misplaced == []


# Test files of tests/sql/ that test something other than one module of django_sqltasks/sql/.
SQL_NOT_A_MODULE = {"test_snapshots.py": "the committed SQL snapshots (sql/snapshots/)"}


def test_the_sql_tests_are_split_by_statement_group() -> None:
    """Each SQL test file is named after the module of django_sqltasks/sql/ whose statements it
    tests (test_claims.py: sql/claims.py), so a statement's tests are found by its module."""
    unmatched = [
        path.name
        for path in sorted((TESTS / "sql").glob("test_*.py"))
        if path.name not in SQL_NOT_A_MODULE
        and not (PACKAGE / "sql" / path.name.removeprefix("test_")).exists()
    ]
    assert unmatched == []


def test_contributing_says_where_each_top_level_file_is_and_why() -> None:
    """The support modules and the whole-package test files at the top of tests/ are each named
    in CONTRIBUTING.md's "Where a test goes" (tasks_*.py as one row)."""
    text = (TESTS.parent / "CONTRIBUTING.md").read_text()
    section = text.split("### Where a test goes", 1)[1].split("\n## ", 1)[0]
    unnamed = [
        path.name
        for path in sorted(TESTS.glob("*.py"))
        if path.name != "__init__.py"
        and not (path.name.startswith("tasks_") and "`tasks_*.py`" in section)
        and not (path.name.startswith("test_") and path.name not in WHOLE_PACKAGE)
        and f"`{path.name}`" not in section
    ]
    assert unnamed == []


def test_the_django_5_2_leg_names_test_modules_that_exist() -> None:
    """The django_api marker is given by module path: a test file moved or renamed must be
    renamed there too, or the Django 5.2 leg silently stops running it."""
    missing = [
        name
        for name in DJANGO_API_MODULES
        if not (TESTS.parent / (name.replace(".", "/") + ".py")).exists()
    ]
    assert missing == []
