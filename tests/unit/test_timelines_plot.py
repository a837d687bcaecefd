"""The report's plot against time (servelab.report.timelines.plot_timelines): a row of running replicas only
where a run sampled them, so an overload or a rollout is not drawn with an empty panel."""

from pathlib import Path

from PIL import Image

from servelab.measure.records import read_records
from servelab.report.timelines import plot_timelines

RECORDS = Path(__file__).parents[1] / "data" / "quick_lab_records.jsonl"


def test_the_replicas_row_is_drawn_only_where_a_run_sampled_replicas(tmp_path):
    step = next(r for r in read_records(RECORDS) if r.config.get("run") == "step load")  # Ray: replicas sampled
    assert step.timeline.replicas
    without = step.model_copy(update={"timeline": step.timeline.model_copy(update={"replicas": [], "replicas_t_s": []})})
    assert plot_timelines([step], tmp_path / "with.png") and plot_timelines([without], tmp_path / "without.png")
    with Image.open(tmp_path / "with.png") as a, Image.open(tmp_path / "without.png") as b:
        assert a.width == b.width and b.height < a.height * 0.75  # two rows of three
