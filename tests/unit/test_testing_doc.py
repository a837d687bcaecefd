"""docs/testing.md: its timing table is the generator's (tests/tier_durations.py), never typed, and its tiers
are the folders under tests/."""

from pathlib import Path

import tier_durations
from tier_durations import BEGIN, DOC, END, TIERS, between_markers, read_table, table, tier_of, with_table

TESTS = Path(tier_durations.__file__).parent
TEXT = DOC.read_text()


def test_the_timing_table_is_what_the_generator_writes():
    assert TEXT.count(BEGIN) == TEXT.count(END) == 1
    generated = between_markers(TEXT)
    assert generated == table(read_table(generated))
    assert [row.split("|")[1].strip().strip("`") for row in generated.splitlines()[2:5]] == list(TIERS)


def test_the_generator_replaces_only_what_lies_between_the_markers():
    record = {"tests/unit": {"tests": 3, "passed": 2, "skipped": 1, "failed": 0, "seconds": 4.5,
                             "recorded": "2030-01-02", "cpus": 2, "load": 1.5}}
    doc = f"before\n{BEGIN}\nanything\n{END}\nafter\n"
    assert with_table(doc, record) == f"before\n{BEGIN}\n{table(record)}\n{END}\nafter\n"
    assert read_table(between_markers(with_table(doc, record))) == record
    assert "| `tests/integration` | not recorded yet |" in table(record)


def test_tiers_are_the_folders_that_hold_tests():
    folders = {f"tests/{path.parent.name}" for path in TESTS.glob("*/test_*.py")}
    assert folders == set(TIERS)
    assert tier_of("tests/unit/test_x.py::test_y[a/b]") == "tests/unit"
    assert tier_of("tests/test_x.py::test_z") == "tests/test_x.py"  # a file outside the tiers: its own row
