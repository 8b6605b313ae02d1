"""What the docs state of the package, counted against the package: the admin's pages and the
demo's tasks."""

from __future__ import annotations

from django.contrib import admin

from tests.conftest import ROOT

NUMBERS = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_the_docs_count_the_admin_pages_and_the_demo_s_tasks() -> None:
    pages = [m for m in admin.site._registry if m._meta.app_label == "django_sqltasks"]
    admin_doc = (ROOT / "docs" / "admin.md").read_text()
    assert f"adds {NUMBERS[len(pages)]} pages" in admin_doc
    for model in pages:
        assert f"**{model._meta.verbose_name_plural.title()}**" in admin_doc.title()
    # What the admin's Cancel does, as docs/admin.md's table of actions says it.
    assert "| `READY`, `RUNNING` |" in admin_doc
    demo = (ROOT / "example_project/shop/management/commands/demo.py").read_text()
    enqueued = demo.count("Enqueued(")
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    assert f"enqueues {NUMBERS[enqueued]} things" in quickstart
    table = quickstart.split("TASK ", 1)[1].split("```", 1)[0].strip().splitlines()[1:]
    assert len(table) == enqueued, table
