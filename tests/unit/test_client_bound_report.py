"""A run servelab's client could not keep up with (``Record.client_bound``) is never shown as a server's capacity:
the ratios, the aims, the lessons and the report's tables mark it, from records made with the lab's own classes."""

from servelab.measure.ceiling import Ceiling, Point
from servelab.measure.fractions import (
    CAPACITY,
    CLIENT_BOUND,
    MET,
    NOT_MEASURED,
    aims,
    client_bound_note,
    fractions_markdown,
    ratios,
)
from servelab.measure.records import ClientSide, Latency, Load, Monitors, Record, Stats
from servelab.measure.senders import bound_reason
from servelab.report import compare, lessons
from servelab.report.render import capacity_section, summary_rows
from servelab.run.side_by_side import stage_inputs


def run(stage: str, rps: float, bound: bool = False, concurrency: int = 16, capacity: bool = False) -> Record:
    busy = 0.9 if bound else 0.3
    client = ClientSide(processes=1, busy=busy, cpu_ms_per_request=busy * 1e3 / rps, bound=bound,
                        why=bound_reason(rps, busy))
    config = {"device": "gpu"}
    if capacity:
        config[CAPACITY] = {"concurrency": concurrency, "throughput_rps": rps, "stopped": "knee",
                            "curve": [{"concurrency": concurrency, "throughput_rps": rps, "p50_ms": 1.0, "p99_ms": 2.0}]}
    return Record(stage=stage, load=Load.closed(concurrency), config=config, client=client,
                  stats=Stats(throughput_rps=rps, items_per_s=rps, latency=Latency(p50_ms=1e3 / rps), successes=100),
                  monitors=Monitors(interval_s=0.5, cpu_pct=[[50.0]]))


def ceiling() -> Ceiling:
    point = Point(precision="fp32", batch=16, provider="CUDAExecutionProvider", runs=3, ms=16.0, images_per_s=1000.0)
    return Ceiling(provider="CUDAExecutionProvider", machine="test", onnxruntime="test", repeats=3, max_seconds=1.0,
                   points=[point])


def test_the_note_is_there_only_for_a_client_bound_run() -> None:
    assert client_bound_note(run("onnx-1", 100.0), None) == ""
    assert CLIENT_BOUND in client_bound_note(run("onnx-1", 100.0), run("onnx-dyn", 600.0, bound=True))
    assert not run("onnx-1", 100.0).client_bound and run("onnx-1", 1.0, bound=True).client_bound
    assert not Record(stage="x", load=Load.sequential(), stats=Stats(throughput_rps=1, items_per_s=1,
                                                                     latency=Latency())).client_bound  # no client


def test_a_ratio_and_an_aim_on_a_client_bound_capacity_are_marked_and_not_judged() -> None:
    fair = [run("onnx-1", 100.0), run("onnx-dyn", 300.0)]
    held = [run("onnx-1", 100.0), run("onnx-dyn", 300.0, bound=True)]
    batching = "onnx-dyn ÷ onnx-1 ≥ 2× at saturation (capacity ÷ capacity)"
    assert all(CLIENT_BOUND not in label for _, label, _ in ratios(fair))
    assert any("onnx-dyn ÷ onnx-1" in label and CLIENT_BOUND in label for _, label, _ in ratios(held))
    verdicts = {a.what: a for a in aims(fair, ceiling(), stage_inputs())}
    assert verdicts[batching].verdict == MET  # 3x, on a GPU
    verdicts = {a.what: a for a in aims(held, ceiling(), stage_inputs())}
    assert verdicts[batching].verdict == NOT_MEASURED and CLIENT_BOUND in verdicts[batching].figures
    tensor = next(a for what, a in verdicts.items() if what.startswith("best tensor-in stage"))
    assert tensor.verdict == NOT_MEASURED and CLIENT_BOUND in tensor.figures  # onnx-dyn's 300 img/s is the client's
    assert f"concurrency 16 ({CLIENT_BOUND})" in fractions_markdown(held, ceiling(), stage_inputs())


def test_a_lesson_on_a_client_bound_capacity_is_marked_and_contradicts_nothing() -> None:
    # onnx-dyn below onnx-1 would contradict the batching lesson, were the figure the server's.
    for records, bound in (([run("onnx-1", 300.0), run("onnx-dyn", 100.0)], False),
                           ([run("onnx-1", 300.0, bound=True), run("onnx-dyn", 100.0)], True)):
        [found] = [f for lesson, fs in lessons.findings(records) for f in fs if "onnx-dyn ÷ onnx-1" in f.pair]
        assert (CLIENT_BOUND in found.pair) == bound and bool(found.contradicts) != bound


def test_the_report_tables_mark_a_client_bound_run() -> None:
    records = [run("onnx-1", 100.0, capacity=True), run("onnx-dyn", 300.0, bound=True, capacity=True)]
    rows = {row["stage"]: row for row in summary_rows(records)}
    assert rows["onnx-1"]["req/s"] == "100.0" and rows["onnx-dyn"]["req/s"] == f"300.0 ({CLIENT_BOUND})"
    table = "\n".join(capacity_section(records))
    line = next(line for line in table.splitlines() if line.startswith("| onnx-dyn"))
    assert CLIENT_BOUND in line and CLIENT_BOUND not in next(
        line for line in table.splitlines() if line.startswith("| onnx-1"))


def test_the_two_clients_table_says_where_servelabs_run_was_client_bound() -> None:
    theirs = run("onnx-1", 1000.0).model_copy(update={"tool": "perf_analyzer", "client": None})
    for ours, verdict in ((run("onnx-1", 990.0), "agree"),
                          (run("onnx-1", 800.0, bound=True), "DISAGREE (> 10%); servelab's run was client-bound")):
        [pair] = compare.pairs([ours, theirs])
        assert pair.verdict == verdict
