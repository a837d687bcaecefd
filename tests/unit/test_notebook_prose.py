"""The lease is spent on doing (issue 52): the core path's prose stays short. Each notebook of the core path
has a budget of words (prose only: code, shell blocks, Jupytext's header and generated blocks left out, as
``servelab.tools.lease_plan`` counts them for the reading time), and the whole path at most 6,000, about
what the original lab's whole text holds; each opens with what the student builds, runs and measures."""

from __future__ import annotations

import pytest

from servelab.tools.lease_plan import plan_notebook
from servelab.tools.render_notebooks import NOTEBOOK_DIR

BUDGETS = {"0_intro": 850, "2_create_server_nvidia": 450, "3_fastapi_setup": 600, "4_fastapi": 1150,
           "5_triton_setup": 500, "6_triton_python": 900, "7_triton_onnx": 750, "8_triton_more": 400,
           "11_delete_resources": 150}
CORE_PATH_WORDS = 6000


def core_words(stem: str) -> int:
    return plan_notebook(NOTEBOOK_DIR / f"{stem}.md").core.words


@pytest.mark.parametrize("stem", BUDGETS)
def test_each_core_notebook_keeps_to_its_budget(stem: str) -> None:
    assert core_words(stem) <= BUDGETS[stem], f"{stem}: {core_words(stem)} words of prose on the core path"


def test_the_core_path_reads_in_at_most_6000_words() -> None:
    assert sum(BUDGETS.values()) <= CORE_PATH_WORDS
    assert sum(map(core_words, BUDGETS)) <= CORE_PATH_WORDS


def test_the_count_leaves_out_code_generated_blocks_and_optional_sections(tmp_path) -> None:
    page = tmp_path / "n.md"
    page.write_text("---\njupyter:\n  kernelspec:\n    display_name: Python 3\n    language: python\n    name: python3\n---\n\n# Title\n\none two three\n\n"
                    "```python\nx = 1  # not prose\n```\n\n<!-- generated: excerpt a b -->\nfour five\n"
                    "<!-- end generated -->\n\n## More (optional)\n\nsix seven\n", encoding="utf-8")
    plan = plan_notebook(page)
    assert (plan.core.words, plan.optional.words) == (4, 4)  # "Title one two three"; "More optional six seven"


@pytest.mark.parametrize("stem", BUDGETS)
def test_each_notebook_opens_with_what_the_student_builds_runs_and_measures(stem: str) -> None:
    """Right under the title, three list items (three lines as rendered, not one paragraph)."""
    text = (NOTEBOOK_DIR / f"{stem}.md").read_text(encoding="utf-8")
    title_on = text[text.index("\n# ") + 1:].splitlines()
    assert [line.split(":**")[0] for line in title_on[2:5]] == ["- **Build", "- **Run", "- **Measure"], title_on[:6]
    assert title_on[1] == "" and all(len(line) > len("- **Measure:** ") for line in title_on[2:5])
