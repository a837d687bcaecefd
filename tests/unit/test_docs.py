"""README.md and the pages under docs/: the settings table is the generator's, never typed, and every
relative link (to a file, or to a heading of a Markdown file) resolves."""

import re
from pathlib import Path

import pytest

from servelab.core.paths import REPO_ROOT
from servelab.core.settings import CONFIGURATION_DOC, TABLE_BEGIN, TABLE_END, markdown_table, table_in, with_table

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_the_settings_table_is_what_the_generator_writes():
    doc = CONFIGURATION_DOC.read_text()
    assert doc.count(TABLE_BEGIN) == doc.count(TABLE_END) == 1
    assert table_in(doc) == markdown_table(), "regenerate it with `python -m servelab.core.settings`"


def test_the_generator_replaces_only_what_lies_between_the_markers():
    doc = f"before\n{TABLE_BEGIN}\nanything\n{TABLE_END}\nafter\n"
    assert with_table(doc) == f"before\n{TABLE_BEGIN}\n{markdown_table()}\n{TABLE_END}\nafter\n"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``: lower case, punctuation dropped, spaces to
    hyphens, a repeated one numbered."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", FENCE.sub("", page.read_text()), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def links(page: Path) -> list[str]:
    text = SPAN.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def test_the_anchor_rule_is_github_s():
    page = REPO_ROOT / "docker" / "README.md"
    assert "run-for-real-on-this-kind-of-machine-servelab-containers" in anchors(page)
    assert "variables-each-container-reads" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO_ROOT)}")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: " + "; ".join(broken)
