"""The model variants side by side: what each costs and what it gives up, from the lab's records.

Per variant stage (``config["variant"]``), its run at capacity (``servelab.measure.fractions.capacity``) gives
throughput, and the monitor's samples CPU time per request: mean CPU % x cores x wall time / successes. That is
the whole machine's CPU, client included, so it compares variants measured alike, not the model alone. Size is
the model file's; agreement with fp32 (top-1 on the evaluation photos) is what ``servelab models build`` recorded
(``servelab.core.variants.build``), where it is there.
"""

from dataclasses import dataclass
from pathlib import Path

from servelab.core import tables
from servelab.core.variants.build import agreements, variant_path
from servelab.measure.fractions import capacity
from servelab.measure.records import Record

BASELINE = "fp32"


@dataclass(frozen=True)
class Row:
    stage: str
    variant: str
    family: str  # the target kind: fastapi or triton
    record: Record  # the stage's run at capacity (fractions.capacity)


def cpu_ms_per_request(record: Record) -> float | None:
    """The machine's CPU time per successful request: mean CPU % x cores x wall time / successes."""
    m, s = record.monitors, record.stats
    if not m or m.cpu_mean_pct is None or not m.cpu_pct or not s.successes or not s.wall_s:
        return None
    return m.cpu_mean_pct / 100 * len(m.cpu_pct[0]) * s.wall_s / s.successes * 1000


def rows(records: list[Record]) -> list[Row]:
    stages = dict.fromkeys(r.stage for r in records if r.config.get("variant") and r.tool == "servelab")
    best = {stage: run for stage in stages if (run := capacity(records, stage)) and run.config.get("variant")}
    return [Row(stage, r.config["variant"], r.target.get("kind", "?"), r) for stage, r in best.items()]


def markdown(found: list[Row], model_dir: Path) -> str:
    top1 = agreements(model_dir)
    baseline: dict[str, float] = {}  # the first fp32 stage of each server (fastapi-onnx, onnx-1)
    for row in found:
        if row.variant == BASELINE:
            baseline.setdefault(row.family, row.record.stats.throughput_rps)
    cells = []
    for row in found:
        path = variant_path(model_dir, row.variant)
        size = f"{path.stat().st_size / 1e6:.1f}" if path.exists() else "-"
        agreement = top1.get(row.variant)
        agreement = "-" if agreement is None else f"{100 * agreement:.1f} %"
        rps, base = row.record.stats.throughput_rps, baseline.get(row.family)
        ratio = f"{rps / base:.2f}" if base else "-"
        cells.append((row.stage, row.variant, size, agreement, row.record.load.label(), f"{rps:.1f}", ratio,
                      tables.num(cpu_ms_per_request(row.record))))
    return tables.markdown(("stage", "variant", "model MB", "top-1 agreement with fp32", "load", "req/s", "× fp32",
                            "CPU ms / request"), cells, "llrrlrrr")
