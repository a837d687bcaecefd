"""servelab/tools/lease_plan.py: the lease plan computed from the notebooks' own parameters and cells."""

import re
import textwrap
from dataclasses import fields

import pytest

from servelab.core.catalogue import CATALOGUE
from servelab.core.paths import REPO_ROOT
from servelab.core.tables import prose
from servelab.measure.perf_analyzer import DEFAULT_TIMEOUT_S
from servelab.tools import lease_plan as lp
from servelab.tools.notebook_blocks import BLOCK, generate

NOTEBOOK = textwrap.dedent('''\
    # A Triton notebook

    ```python tags=["parameters"]
    STAGES = ["pt-1", "pt-2x2"]
    REQUESTS = 100
    WARMUP = 10
    PERF_ANALYZER = True
    PA_STAGES = ["pt-1"]
    PA_WINDOW_S = 5
    PA_EXTRA = ["--max-trials=4"]
    ```

    Five words of prose here.

    ```python
    busy = Load.closed(8, REQUESTS, warmup=WARMUP)
    first = await lab.measure("pt-1", [Load.sequential(REQUESTS, warmup=WARMUP), busy])
    ```

    ## Skipped by its parameters

    ```python
    more = await lab.measure("pt-4x4", [busy])
    ```

    ## Rates (optional)

    ```python
    late = await lab.measure("pt-2x2", [Load.open(100, "poisson", duration_s=10, warmup=0)])
    ```
    ''')


def test_a_notebook_is_timed_from_its_parameters_and_cells(tmp_path):
    path = tmp_path / "6_triton_python.md"
    path.write_text(NOTEBOOK)
    plan = lp.plan_notebook(path)
    pt1 = lp.rate("pt-1")
    assert plan.core.measure_s == pytest.approx(110 / pt1.alone + 110 / pt1.busy)  # pt-4x4 is not in STAGES
    assert plan.core.perf_analyzer_s == pytest.approx(2 * 4 * 5)  # 4 trials of 5 s, for each of pt-1's loads
    assert plan.core.switches == 1 and plan.optional.switches == 1
    # pt-2x2 serves 192.8 req/s busy: 100 req/s for 10 s is below it, measured by servelab load alone.
    assert plan.optional.measure_s == pytest.approx(10) and plan.optional.perf_analyzer_s == 0
    assert plan.optional.over_capacity == []


def test_an_open_loop_above_the_stages_rate_is_named_and_perf_analyzer_counted_at_its_limit(tmp_path):
    path = tmp_path / "7_triton_onnx.md"
    path.write_text(NOTEBOOK.replace('Load.open(100,', 'Load.open(300,').replace('PA_STAGES = ["pt-1"]',
                                                                                   'PA_STAGES = ["pt-1", "pt-2x2"]'))
    plan = lp.plan_notebook(path)
    assert plan.optional.over_capacity == ["7_triton_onnx: pt-2x2 poisson 300 req/s"]
    assert plan.optional.perf_analyzer_s == DEFAULT_TIMEOUT_S
    assert plan.optional.measure_s == pytest.approx(3000 / 192.8)  # the backlog is served after the last arrival


def test_the_production_cases_are_timed_at_their_baselines_rates(tmp_path):
    """4_fastapi's overload (above capacity on purpose: not named), photo mix and rollout, on the stages the
    catalogue derives from fastapi-onnx (its rate), each switched to once."""
    path = tmp_path / "4_fastapi.md"
    path.write_text(textwrap.dedent('''\
        ```python tags=["parameters"]
        SECONDS = 10
        ```

        ## Serving in production (optional)

        ```python
        shed = lab.wait_for("fastapi-onnx-shed", "fastapi_onnx", batching=False, max_queue_requests=8)
        over = await lab.overload(shed, busy, SECONDS)
        cached = lab.wait_for("fastapi-onnx-cache", "fastapi_onnx", batching=False, cache=True)
        hits = await lab.photo_mix(cached, Load.closed(16, 1000, warmup=0), mix)
        rolled = await lab.rollout(cached, "int8", Load.closed(16, requests=None, duration_s=SECONDS, warmup=0), at_s=3)
        ```
        '''))
    plan = lp.plan_notebook(path)
    busy = lp.rate("fastapi-onnx").busy
    assert lp.rate("fastapi-onnx-shed") == lp.rate("fastapi-onnx-cache") == lp.rate("fastapi-onnx")
    overload = (1.5 * busy * 10 + 10) / busy  # 1.5x capacity for 10 s, its 10 warm-up requests; the backlog after
    rollout = 10 + 3  # its seconds, then on 3 s after the swap (rollout_load's after_s)
    assert plan.optional.measure_s == pytest.approx(overload + 1000 / busy + rollout)
    assert plan.optional.switches == 3 and plan.optional.over_capacity == [] and plan.core.measure_s == 0


def test_no_notebook_offers_a_stage_more_than_it_serves():
    """An open loop above a stage's rate only grows a backlog, and perf_analyzer then runs to its
    hard limit: no notebook's load does that by accident (``lab.overload`` does on purpose, unnamed)."""
    plans = lp.lease_plan()
    assert [o for p in plans for o in p.core.over_capacity + p.optional.over_capacity] == []
    assert all(p.core.perf_analyzer_s < DEFAULT_TIMEOUT_S * 20 for p in plans)


def test_every_stage_taught_on_the_node_has_a_rate_with_its_source():
    rates = lp.node_rates()
    taught = {s.name for s in CATALOGUE if s.notebook}
    missing = sorted(taught - set(rates))
    assert not missing, (f"{', '.join(missing)}: taught on the node without a rate; add to {lp.RATES_FILE} a table "
                         f"[{missing[0]}] with alone, busy (requests/s on the node) and source (where they come from)")
    assert set(rates) == taught, f"rates of stages no notebook teaches: {sorted(set(rates) - taught)}"
    assert all(r.source and r.alone > 0 and r.busy > 0 for r in rates.values())
    assert rates["onnx-b16"].busy == rates["onnx-1"].busy and "assumed no faster than onnx-1" in rates["onnx-b16"].source


def test_a_subsection_is_optional_by_its_own_heading_or_its_sections():
    text = "intro\n## A\na\n### B (optional)\nb\n### C\nc\n## D (optional)\nd\n### E\ne\n"
    assert [(optional, part.split("\n")[0]) for optional, part in lp.sections(text)] == [
        (False, "intro"), (False, "## A"), (True, "### B (optional)"), (False, "### C"), (True, "## D (optional)"),
        (True, "### E")]


def test_the_optional_sections_are_counted_apart():
    fastapi = next(p for p in lp.lease_plan() if p.name == "4_fastapi")
    assert fastapi.optional.measure_s > 0 and fastapi.optional.switches >= 3  # the variants: u8, int8, fp16


def test_the_core_path_fits_in_2_h_15_of_the_lease():
    """A 2 h 55 lease with 40 minutes to spare, people counted: a notebook that grows (prose, tasks, loads,
    perf_analyzer runs) fails here."""
    assert lp.LEASE_MIN - lp.CORE_AIM_MIN == 40
    assert lp.core_minutes(lp.lease_plan()) <= lp.CORE_AIM_MIN


# The lessons the node's core path teaches (the variants, the ensemble and Ray Serve are optional parts).
CORE_LESSONS = {"onnx", "batching", "instances"}


def test_every_measurement_a_lesson_ratio_needs_is_in_the_core_path():
    """Each stage of a core lesson, and every lesson stage the core path measures, is measured there with its
    baseline under one same load (the ratio's two sides): nothing a ratio needs sits in an optional section."""
    plans = {p.name: p for p in lp.lease_plan() if p.name in lp.CORE}
    measured = {m for p in plans.values() for m in p.core.measured}
    taught = [s for s in CATALOGUE if s.lesson and s.baseline and s.notebook in plans
              and (s.lesson in CORE_LESSONS or any(name == s.name for name, _ in measured))]
    assert {s.lesson for s in taught} == CORE_LESSONS
    assert len(taught) >= 7  # 4_fastapi's two, 6_triton_python's two, 7_triton_onnx's three
    for stage in taught:
        ours = {load for name, load in measured if name == stage.name}
        theirs = {load for name, load in measured if name == stage.baseline}
        assert ours & theirs, (stage.name, stage.baseline, ours, theirs)


def test_the_dynamic_batching_lesson_is_core_in_7_triton_onnx():
    """The "(optional)" shape section ends at its own heading: the batching lesson after it is core."""
    onnx = next(p for p in lp.lease_plan() if p.name == "7_triton_onnx")
    assert sum(1 for name, _ in onnx.core.measured if name == "onnx-dyn") == 2 * len(lp.parameters(
        (lp.REPO_ROOT / "notebooks" / "7_triton_onnx.md").read_text())["RATES"])
    assert not [name for name, _ in onnx.optional.measured if name == "onnx-dyn"]


def test_a_students_tasks_are_counted_in_the_text(tmp_path):
    """Each task at its allowance: typed shell blocks, an SSH tunnel, perf_analyzer by hand, a browser step, a
    block written, a code cell completed, shown lines, a printed table, a question; the switch a step runs
    itself (`servelab triton stage`) is not typed."""
    path = tmp_path / "6_triton_python.md"
    path.write_text(textwrap.dedent('''\
        ```python tags=["parameters"]
        STAGES = ["pt-1"]
        REQUESTS = 10
        PERF_ANALYZER = False
        PA_STAGES = []
        ```

        Open it in your browser.

        ```shell
        docker compose -f docker/docker-compose-triton.yaml ps
        ```

        ```shell
        ssh -L 8888:127.0.0.1:8888 cc@A.B.C.D
        ```

        ```shell
        perf_analyzer -m food_classifier -b 1
        ```

        ```shell
        servelab triton stage pt-1
        ```

        ```python tags=["parameters"]
        MY_INSTANCE_GROUP = """
        """
        ```

        ```python
        # YOUR CODE: a client
        ```

        <!-- generated: excerpt a.py f -->
        ```python
        def f():
            return 1
        ```
        <!-- end generated -->

        ```python
        first = await lab.measure("pt-1", [Load.sequential(REQUESTS, warmup=0)])
        ```

        *Question:* why?
        '''))
    people = lp.plan_notebook(path).core.people
    assert people == lp.People(shell_block=1, ssh_session=1, browser_step=1, block_written=1, perf_analyzer_by_hand=1,
                               code_written=1, excerpt_line=4, result_table=1, question=1)
    rates = lp.allowances()
    assert people.seconds == pytest.approx(sum(rates[name].seconds for name in rates) + 3 * rates["excerpt_line"].seconds)


def test_every_allowance_and_wait_says_where_its_figure_comes_from():
    assert set(lp.allowances()) == {f.name for f in fields(lp.People)}
    assert all(a.seconds > 0 and a.source for a in lp.allowances().values())
    assert all(w.source and w.minutes > 0 for waits in lp.WAITS.values() for w in waits)
    table = " ".join(lp.plan_table().split())  # as Markdown reads it: a wrapped line joins its paragraph again
    assert all(a.source in table for a in lp.allowances().values()) and "An estimate, not a timed class" in table
    assert all(w.source in table for waits in lp.WAITS.values() for w in waits)


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


def test_reading_during_an_unattended_wait_is_counted_once():
    """The boot's and the builds' waits hold the reading of the notebooks they ask students to read, no more
    than their length; what is read then is not read again in its own notebook."""
    plans = {p.name: p for p in lp.lease_plan()}
    boot, build = plans["2_create_server_nvidia"], plans["3_fastapi_setup"]
    assert boot.waits_min >= sum(w.minutes for w in boot.waits[1:])  # the later waits are not read through
    read = sum(plans[n].core.read_before_s for n in ("3_fastapi_setup", "4_fastapi", "5_triton_setup", "6_triton_python"))
    assert 0 < read <= 60 * (boot.waits[0].minutes + build.waits[0].minutes)
    assert all(0 <= p.core.read_before_s <= p.core.reading_s for p in plans.values())
    waited = 60 * (sum(w.minutes for w in boot.waits) + build.waits[0].minutes)
    assert 60 * (boot.waits_min + build.waits_min) == pytest.approx(waited - read)
