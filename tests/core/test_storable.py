"""Text a worker writes is made storable: NUL and lone surrogates escaped, a long text cut in
the middle, saying how much was cut and keeping its end (where a traceback names the error)."""

from __future__ import annotations

from django_sqltasks.core.storable import (
    MAX_ERROR_CLASS_CHARS,
    MAX_TRACEBACK_CHARS,
    escape,
    storable,
    storable_class_path,
    storable_traceback,
)


def test_nul_and_lone_surrogates_are_escaped_and_other_text_kept() -> None:
    assert escape("plain") == "plain"
    assert escape("caf\u00e9") == "caf\u00e9"
    assert escape("a\x00b") == "a\\x00b"
    assert escape("name-\udcff") == "name-\\udcff"
    assert escape("name-\udcff").encode("utf-8")  # now valid UTF-8


def test_a_long_text_is_cut_to_its_limit_keeping_its_start_and_its_end() -> None:
    text = "S" * 500 + "M" * 5000 + "ValueError: boom"
    kept = storable(text, 1000, "traceback")
    assert len(kept) <= 1000
    assert kept.startswith("S") and kept.endswith("ValueError: boom")
    assert "characters cut: a stored traceback keeps at most 1,000 characters" in kept
    assert storable("short", 1000) == "short"


def test_tracebacks_and_class_paths_have_their_own_limits() -> None:
    assert len(storable_traceback("x" * (MAX_TRACEBACK_CHARS * 2))) <= MAX_TRACEBACK_CHARS
    path = storable_class_path("a." * MAX_ERROR_CLASS_CHARS)
    assert len(path) <= MAX_ERROR_CLASS_CHARS and "exception class path" in path
