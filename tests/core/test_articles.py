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
