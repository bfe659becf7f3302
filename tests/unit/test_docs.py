"""The documentation names every setting the code reads."""

from __future__ import annotations

from pathlib import Path

from hongbao.settings import settings_table

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_configuration_page_lists_every_setting() -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    missing = [name for name, _, _ in settings_table() if f"`{name}`" not in page]
    assert not missing, f"docs/configuration.md does not list {missing}"
