"""The report's one rule (servelab.report.lessons.verdict, stated once as RULE) against the noise it was calibrated
on: issue 65's three tours of one 2-CPU VM (docs/records/verdict-calibration-2cpu-16d9fae.md), read from the record."""

import re

from servelab.core.paths import REPO_ROOT
from servelab.report.lessons import HIGHER, LOWER, NO_CHANGE, NOISE, RULE, TOO_NOISY, verdict

CALIBRATION = REPO_ROOT / "docs" / "records" / "verdict-calibration-2cpu-16d9fae.md"
CELL = re.compile(r"([\d.]+)× \((?:windows )?([\d.]+)–([\d.]+)\)")


def _tours() -> dict[str, list[tuple[float, tuple[float, float]]]]:
    """lesson -> (ratio, spread) per tour, from the record's table."""
    rows = [line.split(" | ") for line in CALIBRATION.read_text().splitlines() if "÷" in line and line.startswith("|")]
    return {row[0].strip("| "): [(float(m[1]), (float(m[2]), float(m[3]))) for m in map(CELL.search, row[1:])]
            for row in rows}


def test_the_rule_gives_no_two_tours_of_the_calibration_data_contradicting_verdicts():
    """The old rule read onnx-dyn ÷ onnx-1 and ray-2 ÷ ray-1 as no change twice and higher once; the rule reads every
    tour of every lesson either the same or "too noisy to tell", never one direction in one tour and no change or
    the other direction in another."""
    tours = _tours()
    assert len(tours) == 3 and all(len(t) == 3 for t in tours.values())
    said = {lesson: [verdict(ratio, spread) for ratio, spread in t] for lesson, t in tours.items()}
    assert said["onnx-dyn ÷ onnx-1"] == said["ray-2 ÷ ray-1"] == [TOO_NOISY] * 3
    # int8: tour A's capacity came from a sweep ended by one low point (issue 65; the sweep no longer stops there).
    assert said["fastapi-onnx-int8 ÷ fastapi-onnx"] == [TOO_NOISY, HIGHER, HIGHER]
    for verdicts in said.values():
        told = set(verdicts) - {TOO_NOISY}
        assert len(told) <= 1, verdicts


def test_the_band_each_side_of_1():
    assert verdict(1.5, (1 + NOISE + 0.01, 1.63)) == HIGHER and verdict(0.8, (0.7, 1 - NOISE - 0.01)) == LOWER
    assert verdict(1.0, (1 - NOISE, 1 + NOISE)) == NO_CHANGE and verdict(1.05) == NO_CHANGE
    assert verdict(1.2, (1.05, 1.35)) == TOO_NOISY and verdict(1.0, (0.85, 1.15)) == TOO_NOISY
    assert verdict(1.3) == HIGHER and verdict(None) == TOO_NOISY  # without a spread: the ratio alone


def test_the_rule_is_stated_once_in_the_words_the_docs_use():
    assert RULE in (REPO_ROOT / "docs" / "benchmarks.md").read_text().replace("\n", " ")
    assert "verdict-calibration-2cpu-16d9fae.md" in (REPO_ROOT / "docs" / "benchmarks.md").read_text()
