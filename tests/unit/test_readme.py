"""The README's promises: the two commands first, short, and pointing each reader to where they start."""

from pathlib import Path

README_PATH = Path(__file__).resolve().parents[2] / "README.md"
README = README_PATH.read_text()


def test_two_commands_come_first():
    first_block = README.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block


def test_the_readme_stays_short():
    """Issue 27: what it is, the commands, where each reader starts, the ways to run it, the layout and
    links; everything else is a page under docs/ (docs/README.md lists them)."""
    assert README_PATH.stat().st_size <= 10_500, "move the detail into a page under docs/"


def test_each_reader_is_pointed_where_they_start():
    for where in ("notebooks/0_intro.md", "docs/instructors.md", "docs/gpu/README.md", "docs/README.md",
                  "make gpu-check", "docs/configuration.md"):
        assert where in README, where
