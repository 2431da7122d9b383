"""The README and docs/ stay true to the tree: every relative link points at a file that exists,
and the README stays a short product page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    links = [target.split("#")[0] for target in LINK.findall(page.read_text())]
    return [t for t in links if t and not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links to files that do not exist"


def test_the_readme_is_a_short_product_page():
    assert len((ROOT / "README.md").read_text().splitlines()) < 200
