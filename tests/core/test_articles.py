"""A noun with its article, as messages name a value's class."""

from __future__ import annotations

import pytest

from django_sqltasks.core.articles import a_or_an


@pytest.mark.parametrize(
    ("noun", "said"),
    [("dict", "a dict"), ("int", "an int"), ("ImmediateBackend", "an ImmediateBackend")],
)
def test_a_noun_gets_the_article_of_its_first_letter(noun: str, said: str) -> None:
    assert a_or_an(noun) == said


def test_an_empty_noun_is_not_taken_for_a_vowel() -> None:
    # "" is in every string: the first letter, not the first slice, is looked up.
    assert a_or_an("") == "a "
