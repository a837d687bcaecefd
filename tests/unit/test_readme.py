"""The README's promises: the two commands first."""

from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_two_commands_come_first():
    first_block = README.split("```")[1]
    assert "make lab" in first_block and "make test" in first_block
