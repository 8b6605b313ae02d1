"""The public surface: every import line the README, the docs and the example project show runs,
every name ``django_sqltasks`` exports resolves, and importing the package loads nothing else."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

import django_sqltasks
from tests.conftest import ROOT

FENCE = re.compile(r"^\s*```")
IMPORT = re.compile(r"^(from django_sqltasks[\w.]* import |import django_sqltasks\b)")
# An import written in the prose: `from django_sqltasks import TaskQuery`.
INLINE = re.compile(r"`((?:from django_sqltasks[\w.]* import |import django_sqltasks\b)[^`]*)`")
# Pages a user reads: the README and docs/ (docs/design/ holds contributors' plans).
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "example_project").rglob("*.py"))


def code_blocks(text: str) -> list[str]:
    """Return the lines inside the fenced code blocks of a Markdown page, dedented."""
    lines, inside = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif inside:
            lines.append(line.strip())
    return lines


def import_statements(lines: list[str]) -> list[str]:
    """Return each import of django_sqltasks, a parenthesised one joined into one statement."""
    statements = []
    rest = iter(lines)
    for line in rest:
        if not IMPORT.match(line):
            continue
        statement = line
        if "(" in line and ")" not in line:
            for more in rest:
                statement += " " + more
                if ")" in more:
                    break
        statements.append(statement.split("#")[0].strip())
    return statements


def documented_imports() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        found += [(page.name, s) for s in import_statements(code_blocks(text))]
        found += [(page.name, s) for s in INLINE.findall(text.replace("\n", " "))]
    for example in EXAMPLES:
        lines = [line.strip() for line in example.read_text().splitlines()]
        found += [(example.name, s) for s in import_statements(lines)]
    return sorted(set(found))


def test_the_docs_show_imports() -> None:
    pages = {page for page, _ in documented_imports()}
    assert {"tasks.md", "testing.md", "workflows.md", "metrics.md", "demo.py"} <= pages
    assert ("changelog.md", "from django_sqltasks import TaskQuery") in documented_imports()


@pytest.mark.parametrize(("page", "statement"), documented_imports())
def test_documented_import_runs(page: str, statement: str) -> None:
    exec(compile(statement, page, "exec"), {})


@pytest.mark.parametrize("name", django_sqltasks.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(django_sqltasks, name) is not None
    assert name in dir(django_sqltasks)


def test_an_unknown_name_says_so() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        django_sqltasks.Nothing  # noqa: B018


def test_importing_the_package_loads_nothing_else() -> None:
    code = (
        "import sys, django_sqltasks; "
        "print(sorted(m for m in sys.modules if m.startswith('django_sqltasks')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['django_sqltasks']"


def only_re_exports(tree: ast.Module) -> bool:
    """Whether a module's body is nothing but imports, ``__all__`` and docstrings."""
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else []
        if [getattr(t, "id", None) for t in targets] == ["__all__"]:
            continue
        return False
    return bool(tree.body)


def test_no_module_only_re_exports() -> None:
    """Every module of the package holds code of its own: no module exists to give names another
    path (a package's ``__init__.py`` gathers its modules' names, as ``models`` must for Django).
    The paths removed before the first release stay removed."""
    package = ROOT / "django_sqltasks"
    modules = [p for p in package.rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 100
    shims = [
        str(p.relative_to(package)) for p in modules if only_re_exports(ast.parse(p.read_text()))
    ]
    assert shims == []
    for old in ("admin_subject", "subject", "metrics", "results", "workflows", "progress_report"):
        assert not (package / f"{old}.py").exists(), old
