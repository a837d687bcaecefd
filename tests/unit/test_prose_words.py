"""Claims the figure check cannot see (issue 52): a quantity written in words ("a quarter of a second",
"several gigabytes") and a word for what a GPU does ("far from busy", "stays warm", "climbs steeply") are
figures too. In the notebooks, such a phrase stands only in a paragraph that cites a committed record
(``docs/records/...``, ``servelab/data/original_lab.toml``, ``docs/gpu/<gpu>.md``), as a number would."""

from __future__ import annotations

import re

import pytest
from test_prose_figures import RECORD

from servelab.tools.render_notebooks import sources

UNIT_WORDS = r"(?:milli)?seconds?|minutes?|hours?|(?:giga|mega)bytes?|GB|MB|requests? a second"
WORDED = re.compile(rf"\b(?:a quarter|a third|half(?= an? )|several|a few|a couple|dozens|hundreds|thousands)"
                    rf"(?: of)?(?: an?)? (?:{UNIT_WORDS})\b", re.IGNORECASE)
GPU_STATE = re.compile(r"\b(?:far from busy|(?:stays?|kept|keeps?) warm|climbs? steeply|barely busy|mostly idle|"
                       r"fully busy|saturates? the GPU)\b", re.IGNORECASE)


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a notebook: code fences and generated blocks left out."""
    text = re.sub(r"^```.*?^```", "\n\n", text, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"<!-- generated:.*?<!-- end generated -->", "\n\n", text, flags=re.DOTALL)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def unbacked(text: str) -> list[str]:
    return [m[0] for p in paragraphs(text) if not RECORD.search(p) for m in (*WORDED.finditer(p), *GPU_STATE.finditer(p))]


def test_worded_figures_and_gpu_states_are_found() -> None:
    assert unbacked("It takes a quarter of a second.\n\nThe download is several gigabytes.") == [
        "a quarter of a second", "several gigabytes"]
    assert unbacked("The GPU is far from busy, and a busier GPU stays warm; latency climbs steeply.") == [
        "far from busy", "stays warm", "climbs steeply"]
    assert unbacked("The GPU is far from busy (docs/records/gpu-util.json).") == []
    assert unbacked("```python\n# several gigabytes\n```\n") == []


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.stem)
def test_no_worded_figure_or_gpu_state_without_a_record(path) -> None:
    assert unbacked(path.read_text(encoding="utf-8")) == []
