"""The model variants side by side: what each costs and what it gives up, from the lab's records.

CPU time per request is the whole machine's, client included (``cpu_ms_per_request``), so it compares variants
measured alike, not the model alone; agreement with fp32 is what ``servelab models build`` recorded, where it is."""

from pathlib import Path

from servelab.core import tables
from servelab.core.variants.build import agreements, variant_path
from servelab.measure.fractions import capacity
from servelab.measure.records import Record


def cpu_ms_per_request(record: Record) -> float | None:
    """The machine's CPU time per successful request: mean CPU % x cores x wall time / successes."""
    m, s = record.monitors, record.stats
    if not m or m.cpu_mean_pct is None or not m.cpu_pct or not s.successes or not s.wall_s:
        return None
    return m.cpu_mean_pct / 100 * len(m.cpu_pct[0]) * s.wall_s / s.successes * 1000


def rows(records: list[Record]) -> list[Record]:
    """Each variant stage's run at capacity (``fractions.capacity``)."""
    stages = dict.fromkeys(r.stage for r in records if r.config.get("variant") and r.tool == "servelab")
    return [run for stage in stages if (run := capacity(records, stage)) and run.config.get("variant")]


def markdown(found: list[Record], model_dir: Path) -> str:
    top1 = agreements(model_dir)
    baseline: dict[str, float] = {}  # the first fp32 stage of each server (fastapi-onnx, onnx-1)
    for r in found:
        if r.config["variant"] == "fp32":
            baseline.setdefault(r.target.get("kind", "?"), r.stats.throughput_rps)
    cells = []
    for r in found:
        variant, rps, base = r.config["variant"], r.stats.throughput_rps, baseline.get(r.target.get("kind", "?"))
        path, agreement = variant_path(model_dir, variant), top1.get(variant)
        cells.append((r.stage, variant, f"{path.stat().st_size / 1e6:.1f}" if path.exists() else "-",
                      "-" if agreement is None else f"{100 * agreement:.1f} %", r.load.label(), f"{rps:.1f}",
                      f"{rps / base:.2f}" if base else "-", tables.num(cpu_ms_per_request(r))))
    return tables.markdown(("stage", "variant", "model MB", "top-1 agreement with fp32", "load", "req/s", "× fp32",
                            "CPU ms / request"), cells, "llrrlrrr")
