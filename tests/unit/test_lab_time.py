"""How long `make lab` takes is measured, recorded and printed, never typed (issue 27).

`servelab lab` writes `results/run.json` (``LabRun``); a copy of a tour's is committed as
docs/records/make-lab.json, and `make notebooks` writes its figure into README, docs and 0_intro.
"""

import json

from servelab.core.paths import REPO_ROOT
from servelab.run import lab_run, plan
from servelab.tools.notebook_blocks import LAB_RUN, lab_summary, lab_time
from servelab.tools.render_notebooks import pages


def _run(**changes) -> lab_run.LabRun:
    fields = dict(plan="tour", stages=["fastapi-pt", "onnx-1"], device="cpu", machine="AMD EPYC, 2 CPUs, Linux x86_64; avx2 f16c",
                  finished="2026-11-25T12:00:00+00:00", models_s=130.4, total_s=455.6, failures=[],
                  summary=["## What this run shows", "", "- **Dynamic batching**. ..."])
    return lab_run.LabRun(**{**fields, **changes})


def test_a_run_record_reads_back_as_written(tmp_path):
    run = _run()
    run.write(tmp_path / "run.json")
    assert lab_run.LabRun.read(tmp_path / "run.json") == run
    assert list(tmp_path.iterdir()) == [tmp_path / "run.json"]  # written whole, nothing left beside it


def test_the_printed_time_splits_the_model_from_the_stages_and_judges_the_tour_only():
    assert lab_run.minutes(59.6) == "1 min 0 s" and lab_run.minutes(42) == "42 s"
    line = _run().timing()
    assert line.startswith("lab finished in 7 min 36 s (the model and its variants 2 min 10 s, the 2 stages 5 min 25 s)")
    assert line.endswith("aim ≤ 10 min 0 s on 2 CPUs: met")
    assert _run(total_s=601).timing().endswith("MISSED")
    assert "aim" not in _run(plan="full").timing()


def test_the_recorded_make_lab_is_a_tour_of_todays_stages_within_the_aim():
    """The committed figure is from a run of the default as it is now: a change to the tour's stages
    needs a new run (`make lab`, then copy results/run.json to docs/records/make-lab.json)."""
    run = lab_run.LabRun.read(LAB_RUN)
    assert run.plan == "tour" and run.device == "cpu"
    assert run.stages == [s.name for s in plan.TOUR_STAGES if not s.needs_gpu]
    assert run.failures == []
    assert run.total_s <= lab_run.TOUR_AIM_S
    assert ", 2 CPUs," in run.machine  # the aim is for 2 CPUs


def test_the_figure_is_written_where_readers_look():
    sentence = lab_time()
    for page in (REPO_ROOT / "README.md", REPO_ROOT / "notebooks" / "0_intro.md", REPO_ROOT / "docs" / "local-lab.md",
                 REPO_ROOT / "docs" / "benchmarks.md"):
        assert sentence in page.read_text(), page
    assert REPO_ROOT / "README.md" in pages()
    assert "Dynamic batching" in lab_summary() and "## What this run shows" not in lab_summary()


def test_the_recorded_tours_int8_ratio_says_what_its_cpu_can_do():
    """The committed tour's INT8 line says, as its report did, whether the CPU named in its machine line has fast
    8-bit instructions."""
    [line] = [line for line in lab_summary().splitlines() if line.startswith("  - fastapi-onnx-int8 ÷ fastapi-onnx,")]
    machine = lab_run.LabRun.read(LAB_RUN).machine
    has = "avx512_vnni" in machine or "avx_vnni" in machine
    assert ("the CPU that ran it has fast 8-bit instructions" if has else "has no fast 8-bit instructions") in line


class Clock:
    """Seconds that pass when the test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_stage_starts_only_if_the_longest_so_far_still_fits_the_budget():
    clock = Clock()
    budget = plan.Budget(60, first_guess_s=20, clock=clock)
    assert budget.why_not() is None  # 60 s left, a first stage is guessed at 20
    budget.mark()
    clock.now += 25
    budget.took()
    assert budget.longest_s == 25 and budget.why_not() is None  # 35 s left
    clock.now += 12  # a shorter stage: the longest stays the guess for the next
    budget.took()
    assert budget.why_not() == "the time budget (60 s) has 23 s left and a stage took up to 25 s"
    assert plan.Budget(None, clock=clock).why_not() is None  # no budget, no limit
    assert "is expected to take 20 s" in plan.Budget(10, first_guess_s=20, clock=clock).why_not()


def test_what_the_budget_cut_is_in_the_run_record_and_its_absence_reads_back(tmp_path):
    run = _run(not_run={"onnx-fp16": "the time budget (60 s) has 3 s left and a stage took up to 25 s"})
    run.write(tmp_path / "run.json")
    assert lab_run.LabRun.read(tmp_path / "run.json").not_run == run.not_run
    old = json.loads((tmp_path / "run.json").read_text())
    del old["not_run"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert lab_run.LabRun.read(tmp_path / "old.json").not_run == {}  # runs recorded before the budget existed
