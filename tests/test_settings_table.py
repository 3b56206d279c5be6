"""The README's settings table is the code's (issue 21: one table, generated, kept in step).

Every setting the middleware, a Node, a Tier or a Route takes has a ``#:`` comment where it
is declared, and README.md holds the table tests/settings_table.py renders from them. A new
setting without a comment, or a README out of step, fails here; ``GIUL_WRITE_DOCS=1 python
-m pytest tests/test_settings_table.py`` writes the table anew.
"""

from __future__ import annotations

import os
from pathlib import Path

import settings_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_setting_says_what_it_does() -> None:
    assert settings_table.missing_docs() == []


def test_the_readme_holds_the_generated_table() -> None:
    text = README.read_text()
    start, end = text.find(settings_table.START), text.find(settings_table.END)
    assert start >= 0 and end > start, f"README.md lacks the markers {settings_table.START!r}"
    table = settings_table.render()
    current = text[start:end + len(settings_table.END)]
    if current != table and os.environ.get("GIUL_WRITE_DOCS") == "1":
        README.write_text(text[:start] + table + text[end + len(settings_table.END):])
        current = table
    assert current == table, "README.md's settings table is out of step: GIUL_WRITE_DOCS=1 rewrites it"


def test_the_configuration_page_holds_the_budget_table() -> None:
    page = README.parent / "docs" / "configuration.md"
    text = page.read_text()
    start, end = text.find(settings_table.BUDGET_START), text.find(settings_table.END)
    assert start >= 0 and end > start, f"{page} lacks the markers {settings_table.BUDGET_START!r}"
    table = settings_table.render_budget()
    current = text[start:end + len(settings_table.END)]
    if current != table and os.environ.get("GIUL_WRITE_DOCS") == "1":
        page.write_text(text[:start] + table + text[end + len(settings_table.END):])
        current = table
    assert current == table, "configuration.md's Budget table is out of step: GIUL_WRITE_DOCS=1 rewrites it"


def test_a_setting_without_a_comment_is_found() -> None:
    import dataclasses

    @dataclasses.dataclass
    class Sample:
        #: Said.
        said: int = 1
        unsaid: int = 2

    assert settings_table.field_docs(Sample) == {"said": "Said.", "unsaid": ""}
