"""docs/testing.md's durations block is written by a run of the whole suite (tests/tier_durations.py), never
typed; partial runs leave it alone. The writer is checked on real files in tmp_path, and the plugin in real
pytest sessions (pytester) over a three-tier tree of its own."""

import os
from pathlib import Path

import pytest

import tier_durations
from tier_durations import BEGIN, END, NOT_YET, TIERS, Run, Tier, between_markers, block, tier_of, write_block

pytest_plugins = ["pytester"]

TESTS = Path(tier_durations.__file__).parent
REPO = TESTS.parent


def _run(**seconds: float) -> Run:
    tiers = {}
    for name in TIERS:
        t = Tier(collected=3, seconds=seconds.get(name.split("/")[1], 1.0))
        t.outcomes = {f"{name}/test_a.py::a": "passed", f"{name}/test_a.py::b": "failed", f"{name}/test_a.py::c": "skipped"}
        tiers[name] = t
    return Run(tiers, "2030-01-02", 2, 1.5, 125.0)


def test_the_doc_has_one_block_the_plugin_could_have_written():
    text = (REPO / tier_durations.DOC).read_text()
    assert text.count(BEGIN) == text.count(END) == 1
    generated = between_markers(text)
    lines = generated.splitlines()
    assert generated == NOT_YET or (lines[:2] == tier_durations.HEADER.splitlines()
                                    and [row.split("|")[1].strip(" `") for row in lines[2:5]] == list(TIERS)
                                    and lines[-1].startswith("Recorded "))


def test_the_writer_replaces_only_the_block_atomically(tmp_path: Path):
    doc = tmp_path / "testing.md"
    doc.write_text(f"# Testing\n\nbefore\n{BEGIN}\nanything typed here\n{END}\nafter\n")
    os.chmod(doc, 0o640)
    write_block(doc, _run(unit=61.4, integration=600.2, e2e=700.0))
    text = doc.read_text()
    assert text.startswith(f"# Testing\n\nbefore\n{BEGIN}\n| Tier |") and text.endswith(f"\n{END}\nafter\n")
    assert "anything typed here" not in text
    assert "| `tests/unit` | 3 | 1 | 1 | 1 | 61 |" in text and "| `tests/e2e` | 3 | 1 | 1 | 1 | 700 |" in text
    assert ("Recorded 2030-01-02 on 2 CPUs (1-minute load 1.5 at the end), 1 test process: the whole session took "
            "125 s (2.1 min) with start-up and collection; the tests' own seconds add up to 1362 s.") in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["testing.md"]  # no temporary file left beside it
    assert doc.stat().st_mode & 0o777 == 0o640
    write_block(doc, _run(unit=1.0))  # written again: still one block, the new figures
    assert doc.read_text().count(BEGIN) == 1 and "| `tests/unit` | 3 | 1 | 1 | 1 | 1 |" in doc.read_text()


def test_a_doc_without_its_markers_is_left_as_it_was(tmp_path: Path):
    doc = tmp_path / "testing.md"
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="expected one"):
        write_block(doc, _run())
    assert doc.read_text() == "no markers\n" and [p.name for p in tmp_path.iterdir()] == ["testing.md"]


def test_tiers_are_the_folders_that_hold_tests():
    folders = {f"tests/{path.parent.name}" for path in TESTS.glob("*/test_*.py")}
    assert folders == set(TIERS)
    assert tier_of("tests/unit/test_x.py::test_y[a/b]") == "tests/unit"
    assert tier_of("tests/test_x.py::test_z") == "tests/test_x.py"  # a file outside the tiers: its own row
    assert block(None) == NOT_YET


@pytest.fixture
def suite(pytester: pytest.Pytester) -> Path:
    """A checkout of its own: three tiers (one test of each fails or skips), docs/testing.md with the markers,
    and a conftest that registers the plugin as tests/conftest.py does."""
    pytester.syspathinsert(TESTS)
    pytester.makeconftest("import tier_durations\n\n\ndef pytest_configure(config):\n"
                          "    config.pluginmanager.register(tier_durations.Recorder(), 'servelab-durations')\n")
    pytester.makeini("[pytest]\ntestpaths = tests\n")
    for name, body in (("unit", "def test_one():\n    pass\n\ndef test_two():\n    pass\n"),
                       ("integration", "import pytest\n\ndef test_one():\n    pass\n\n"
                                       "@pytest.mark.skip(reason='here')\ndef test_skipped():\n    pass\n"),
                       ("e2e", "def test_one():\n    pass\n\ndef test_fails():\n    assert False\n")):
        folder = pytester.path / "tests" / name
        folder.mkdir(parents=True)
        (folder / f"test_{name}.py").write_text(body)
    (pytester.path / "docs").mkdir()
    doc = pytester.path / "docs" / "testing.md"
    doc.write_text(f"# Testing\n{BEGIN}\n{NOT_YET}\n{END}\n")
    return doc


def test_a_whole_run_writes_every_tier(pytester: pytest.Pytester, suite: Path):
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=4, failed=1, skipped=1)
    rows = between_markers(suite.read_text()).splitlines()
    assert rows[2:5] == ["| `tests/unit` | 2 | 2 | 0 | 0 | 0 |", "| `tests/integration` | 2 | 1 | 0 | 1 | 0 |",
                         "| `tests/e2e` | 2 | 1 | 1 | 0 | 0 |"]
    assert rows[-1].startswith(f"Recorded {__import__('datetime').date.today().isoformat()} on {os.cpu_count()} CPUs")


def test_a_whole_run_under_xdist_is_written_by_its_controller_with_every_workers_tests(
        pytester: pytest.Pytester, suite: Path, monkeypatch: pytest.MonkeyPatch):
    """`make test` runs the suite in pytest-xdist's workers: each sees a part, the controller every report."""
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # a session of its own, in a process of its own
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"
                                  ).assert_outcomes(passed=4, failed=1, skipped=1)
    rows = between_markers(suite.read_text()).splitlines()
    assert rows[2:5] == ["| `tests/unit` | 2 | 2 | 0 | 0 | 0 |", "| `tests/integration` | 2 | 1 | 0 | 1 | 0 |",
                         "| `tests/e2e` | 2 | 1 | 1 | 0 | 0 |"]
    assert ", 2 test processes: the whole session took " in rows[-1]


@pytest.mark.parametrize("args", [["tests/unit"], ["tests/unit", "tests/integration"], ["-k", "one"],
                                  ["-m", "not slow"], ["tests/e2e/test_e2e.py", "tests/unit", "tests/integration"],
                                  ["-x"], ["--deselect", "tests/unit/test_unit.py::test_two"]])
def test_a_partial_run_leaves_the_doc_alone(pytester: pytest.Pytester, suite: Path, args: list[str]):
    before = suite.read_text()
    pytester.runpytest("-p", "no:cacheprovider", *args)
    assert suite.read_text() == before
