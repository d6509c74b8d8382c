"""The README stays an entry point and every documentation page is reachable (`make docs` builds the site)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def nav_pages() -> set[str]:
    """The pages `mkdocs.yml`'s nav lists (`- Title: page.md`), read without a YAML parser."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return set(re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", nav, flags=re.M))


def test_the_readme_is_an_entry_point_of_at_most_250_lines_that_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail to a page under docs/"
    assert lines[3].startswith("make demo") and lines[4].startswith("make test"), lines[:6]


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    pages = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    listed = nav_pages()
    assert pages - listed == set(), f"add these pages to mkdocs.yml's nav: {sorted(pages - listed)}"
    assert listed - pages == set(), f"mkdocs.yml's nav lists pages that do not exist: {sorted(listed - pages)}"


def test_the_readmes_links_into_docs_reach_a_page_and_its_heading() -> None:
    # MkDocs checks the links between pages; the README is outside the site, so its links are checked here
    for target, anchor in re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", README.read_text()):
        page = ROOT / target
        assert page.is_file(), f"README.md links to {target}, which does not exist"
        if anchor:
            slugs = {slug(h) for h in re.findall(r"^#+\s+(.+)$", page.read_text(), flags=re.M)}
            assert anchor in slugs, f"README.md links to {target}#{anchor}; headings there: {sorted(slugs)}"


def slug(heading: str) -> str:
    """The anchor Python-Markdown's `toc` gives a heading (lower case, punctuation dropped, spaces to dashes)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")
