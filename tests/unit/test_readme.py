"""The README's promises: the two commands first, the configuration table in sync with the settings."""

from pathlib import Path

from servelab.settings import markdown_table

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_two_commands_come_first():
    first_block = README.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block


def test_configuration_table_matches_the_settings():
    start = README.index("<!-- settings table")
    end = README.index("<!-- end of settings table -->")
    table = README[start:end].split("\n", 1)[1].strip()
    assert table == markdown_table(), "regenerate it with `python -m servelab.settings`"
