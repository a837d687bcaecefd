"""servelab/tools/lease_plan.py: the students' time counted in the text, the machine's from the e2e run's record."""

import json
import re
import subprocess
import textwrap

import pytest

from servelab.core.paths import REPO_ROOT
from servelab.core.tables import prose
from servelab.tools import lease_plan as lp
from servelab.tools.notebook_blocks import BLOCK, generate


def plan(tmp_path, text: str, cells: list[tuple[str, float]] = (), stem: str = "4_fastapi") -> lp.NotebookPlan:
    """The plan of a notebook ``text``, with a record of its code cells' (first line, seconds)."""
    path = tmp_path / f"{stem}.md"
    path.write_text(textwrap.dedent(text))
    record = {stem: {"cells": [{"index": i, "first_line": first, "seconds": s} for i, (first, s) in enumerate(cells)]}}
    return lp.plan_notebook(path, record)


def seconds(name: str) -> tuple[float, float, float]:
    return tuple(lp.rates()["allowance"][name]["seconds"])


def test_a_question_paragraph_is_priced_however_it_is_spelled(tmp_path):
    part = plan(tmp_path, """\
        *Questions,* from your two rows: by how much?

        *Question:* why?

        **Questions.** Which one?

        Questions: and this?

        _Question_ — and this?

        A paragraph that only mentions questions is not one.
        """).core
    assert part.tasks["question"] == 5
    assert part.students == pytest.approx(tuple(5 * s for s in seconds("question")))


def test_every_line_of_a_shell_block_is_priced_and_the_waits_it_starts(tmp_path):
    part = plan(tmp_path, """\
        ```shell
        # a comment students do not type
        bin/node-setup
        source .venv/bin/activate

        FASTAPI_STAGE=fastapi_onnx docker compose -f docker/docker-compose-fastapi.yaml up -d fastapi_server
        ```

        ```shell
        ssh -L 8888:127.0.0.1:8888 -i ~/.ssh/id_rsa_chameleon cc@A.B.C.D
        ```
        """).core
    assert (part.tasks["shell_line"], part.tasks["ssh_line"]) == (3, 1)
    assert part.shell_waits == {"node_setup": 1, "container_start": 1}
    shell = lp.rates()["shell"]
    assert part.machine == pytest.approx(tuple(map(sum, zip(*(shell[n]["seconds"] for n in part.shell_waits)))))


def test_a_browser_step_is_priced(tmp_path):
    part = plan(tmp_path, """\
        In your browser, open `http://127.0.0.1:8000/docs`.

        Open Jupyter at the address it prints, then `6_triton_python.ipynb`.

        Open the notebook's next section.

        ## Open Jupyter

        From a terminal, open a second SSH connection that forwards port 8888 (Jupyter).
        """).core
    assert part.tasks["browser_step"] == 2  # not the heading, nor the SSH connection


def test_a_cell_students_write_is_priced_by_its_answers_length(tmp_path):
    answer = lp.answers()["timing loop"]
    part = plan(tmp_path, """\
        ```python
        # YOUR CODE: timing loop
        raise NotImplementedError("write the timing loop here")
        ```

        ```python tags=["parameters"]
        MY_INSTANCE_GROUP = \"\"\"
        # TODO: pt-2x2's instance_group
        \"\"\"
        ```
        """, [("# YOUR CODE: timing loop", 1.0), ('MY_INSTANCE_GROUP = """', 0.0)]).core
    code = [line for line in answer.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    # Each cell once, and each line typed: the answer's, and the block cell's two that are not comments.
    assert len(code) >= 15 and part.tasks["written_cell"] == 2 and part.tasks["written_line"] == len(code) + 2


def test_the_machine_waits_are_the_records_seconds_times_the_node_factor(tmp_path):
    text = """\
        ```python
        pt = lab.wait_for("fastapi-pt", "fastapi_pt", batching=False)
        ```

        ## Serving in production (optional)

        ```python
        anything = 1
        ```
        """
    p = plan(tmp_path, text, [('pt = lab.wait_for("fastapi-pt", "fastapi_pt", batching=False)', 12.5),
                              ("anything = 1", 0.5)])
    factor = lp.node_factor(lp.cell_times())
    assert (p.core.cells_s, p.optional.cells_s) == (12.5, 0.5)
    assert p.core.machine == pytest.approx((12.5 * factor,) * 3) and p.optional.machine[1] == pytest.approx(0.5 * factor)
    assert p.core.unrecorded == p.optional.unrecorded == []


def test_a_cell_missing_from_the_record_is_reported_not_counted_as_nothing(tmp_path):
    text = "```python\nfirst = 1\n```\n\n```python\nsecond = 2\n```\n\n```python\nthird = 3\n```\n"
    p = plan(tmp_path, text, [("first = 1", 2.0), ("changed since the run = 2", 3.0)])
    assert p.core.cells_s == 2.0 and p.core.unrecorded == ["second = 2", "third = 3"]


def test_a_subsection_is_optional_by_its_own_heading_or_its_sections():
    text = "intro\n## A\na\n### B (optional)\nb\n### C\nc\n## D (optional)\nd\n### E\ne\n"
    assert [(optional, part.split("\n")[0]) for optional, part in lp.sections(text)] == [
        (False, "intro"), (False, "## A"), (True, "### B (optional)"), (False, "### C"), (True, "## D (optional)"),
        (True, "### E")]


def test_reading_during_a_wait_is_counted_once():
    """The boot and the builds hold the reading of the notebooks they ask students to read, no more than their median."""
    plans = {p.name: p for p in lp.lease_plan()}
    for name, reads in lp.rates()["read_during_waits"].items():
        waited = plans[name].waits[1] + plans[name].core.shell_s[1]
        assert 0 < sum(plans[n].core.read_before_s for n in reads) <= waited
    assert all(p.core.reading_s >= 0 for p in plans.values())


def test_every_figure_says_where_it_comes_from_and_the_table_reads_as_lines_for_people():
    r = lp.rates()
    rows = [*r["allowance"].values(), *r["shell"].values(), *(w for ws in r["wait"].values() for w in ws)]
    assert all(row["source"] and 0 < row["seconds"][0] <= row["seconds"][1] <= row["seconds"][2] for row in rows)
    assert r["cells"]["node_loads_s"] > 0 and "original_lab.toml" in r["cells"]["source"]
    table = lp.plan_table()
    joined = " ".join(table.split())  # as Markdown reads it: a wrapped line joins its paragraph again
    assert all(" ".join(row["source"].split()) in joined for row in rows) and "An estimate, not a timed class" in table
    assert max(len(line) for line in table.splitlines()) <= 200
    low, median, high = lp.core_minutes(lp.lease_plan())
    assert 0 < low < median < high and f"**Core path: {lp._clock(median)} at the median**" in table


def test_a_wrapped_sentence_reads_the_same_and_never_starts_a_line_with_a_marker():
    text = "the plan: " + "a figure (assumed) - then more; " * 12 + "# 1. > <b> | done"
    wrapped = prose(text, width=40, indent="  ")
    lines = wrapped.splitlines()
    assert len(lines) > 5 and " ".join(wrapped.split()) == " ".join(text.split())
    assert all(len(line) <= 42 for line in lines) and all(line.startswith("  ") for line in lines[1:])
    assert not [line for line in lines[1:] if re.match(r"\s*(?:[-+*#>|<]|\d+[.)])(?:\s|$)", line)]
    assert prose("  - an item", width=8, indent="    ") == "  - an\n    item"
    assert prose("took 2171 ms, then 1.8 ms", width=10) == "took 2171 ms,\nthen 1.8 ms"  # a figure keeps its unit


def test_the_instructors_guide_has_no_generated_line_over_200_characters():
    """docs/instructors.md is read in its source too: no part generated into it (the lease plan, how long
    `make lab` took, a GPU record) writes a line longer than 200 characters, as committed or as generated now."""
    text = (REPO_ROOT / "docs" / "instructors.md").read_text(encoding="utf-8")
    parts = [m for m in BLOCK.finditer(text) if m["newline"]]
    assert {m["spec"].split()[0] for m in parts} >= {"lease-plan", "lab-time"}
    for m in parts:
        for body in (m["body"], generate(m["spec"])):
            assert [line[:80] for line in body.splitlines() if len(line) > 200] == [], m["spec"]


def test_the_clock_rounds_the_whole_time_up():
    assert (lp._clock(119.5), lp._clock(120), lp._clock(61)) == ("2 h 00", "2 h 00", "1 h 01")


def test_a_typed_perf_analyzer_line_is_priced_at_the_node_by_its_flags_not_by_the_record(tmp_path):
    """Issue #66: the record ran it at 1 s windows; on the node 7's Poisson lines at 10 s windows and 10 trials
    took 1 to 3.3 min (the walk), which the count by flags gives."""
    assert lp.typed_run("!perf_analyzer --request-rate-range 40:120:80 --measurement-interval 10000 --max-trials 10") \
        == (60, 130, 200)
    assert lp.typed_run("pa = !perf_analyzer --concurrency-range 8 --measurement-interval 5000 --max-trials 5") == (15, 20, 25)
    part = plan(tmp_path, """\
        ```python
        # YOUR CODE: perf_analyzer at pt-1
        raise NotImplementedError("type the perf_analyzer line here")
        ```

        ```python
        print(lab.check_printed_run(given("pa", by="perf_analyzer at pt-1"), "pt-1"))
        ```
        """, [("# YOUR CODE: perf_analyzer at pt-1", 9.0), ("print(lab.check_printed_run(", 1.0)], stem="6_triton_python").core
    assert part.cells_s == 0 and len(part.typed_pa) == 1  # the check cell's record does not match its first line
    assert part.tasks["printed_output"] == 1 and part.tasks["written_cell"] == 1


def test_the_core_path_meets_its_aim_and_the_catch_up_names_cuts_with_their_minutes():
    plans = lp.lease_plan()
    assert lp.core_minutes(plans)[1] <= lp.CORE_AIM_MIN
    assert {task["what"] for task in lp.rates()["task"]["2_create_server_nvidia"]}  # 2's own tasks are priced
    assert re.search(r"answer the \d+ question paragraphs after the lease \(\d+ min\); skip typing the \d+ perf_analyzer "
                     r"lines .* \(\d+ min\)", lp.catch_up(plans).replace("\n", " "))


def test_a_setup_wait_the_rehearsal_measured_is_its_step_s_wall_time_scaled(tmp_path, monkeypatch):
    """Issue #62: the plan takes the prepared node's setup and a stage's start from `make rehearse`'s record, and
    refuses a step name the record lacks (a renamed step must not fall back to a typed figure)."""
    record = {"commit": "abc1234def", "machine": {"cpus": 2},
              "steps": [{"step": "prepared node: 3: bin/node-setup (a node booted from the snapshot)", "wall_s": 40.0, "rc": 0},
                        {"step": "3: every SSH session, fastapi up --wait, /ready", "wall_s": 10.0, "rc": 0}]}
    monkeypatch.setattr(lp, "REHEARSAL", tmp_path / "rehearsal.json")
    lp.REHEARSAL.write_text(json.dumps(record))
    shell = lp.rates.__wrapped__()["shell"]
    assert shell["node_setup"]["seconds"] == [20.0, 40.0, 80.0]
    assert shell["container_start"]["seconds"] == [10.0, 20.0, 40.0]
    assert "took 40 s in the dress rehearsal" in shell["node_setup"]["source"] and "abc1234" in shell["node_setup"]["source"]
    record["steps"][0]["rc"] = 1  # a failed step measured nothing
    lp.REHEARSAL.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="prepared node: 3"):
        lp.rates.__wrapped__()


def test_the_plan_agrees_with_the_walk_of_issue_66() -> None:
    """These rules, on the notebooks, answers and cell record issue #66's walk walked (git history), give the record's
    minutes, whose median is within 10 % of the walk's; the plan says so. A record taken another way cannot move
    the node's total: each record gets its own factor."""
    record = json.loads(lp.WALK.read_text(encoding="utf-8"))
    walk = lp.rates()["walk"]
    assert record["walk"] == walk and abs(record["rules"][1] / walk["minutes"][1] - 1) <= 0.10, record
    assert f"`docs/records/{lp.WALK.name}`" in lp.plan_table()
    if subprocess.run(["git", "cat-file", "-e", f"{walk['commit']}^{{commit}}"], cwd=lp.REPO_ROOT).returncode:
        pytest.skip(f"this clone lacks {walk['commit']} (a shallow clone): the record is not recomputed")
    assert [round(m, 1) for m in lp.walked(walk["commit"])] == record["rules"], "run: python -m servelab.tools.lease_plan --walked"
    old = json.loads(subprocess.run(["git", "show", f"{walk['commit']}:docs/records/{lp.CELL_TIMES.name}"],
                                    cwd=lp.REPO_ROOT, capture_output=True, text=True, check=True).stdout)
    total = lambda r: sum(c["seconds"] for n in lp.CALIBRATED for c in r[n]["cells"])  # noqa: E731
    assert total(old) * lp.node_factor(old) == pytest.approx(total(lp.cell_times()) * lp.node_factor(lp.cell_times()), rel=0.01)
