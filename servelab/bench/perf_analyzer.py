"""perf_analyzer interop: real input data for it, and its CSV turned into servelab records.

* ``input_data(image, input)`` / ``write_input_data(path, image, input)``: the ``--input-data``
  JSON. ``bytes``: ``{"data": [{"INPUT_IMAGE": ["<base64 of the image>"]}]}`` (one BYTES element,
  base64 text, as the lab's clients send it); ``tensor``: ``{"data": [{"input": {"b64": ...}}]}``,
  the real preprocessed float32 [3, 224, 224] tensor, little-endian, instead of perf_analyzer's
  random default.
* ``perf_analyzer_command(...)``: the argument list for one load (``-f`` CSV, ``--verbose-csv``).
* ``run_perf_analyzer(...)``: runs it when it is on PATH (it ships in NVIDIA's Triton SDK image,
  ``nvcr.io/nvidia/tritonserver:<yy.mm>-py3-sdk``), diffing Triton's statistics around it for the
  batch-size histogram, and returns the record.
* ``records_from_csv(text, ...)``: perf_analyzer's CSV (microseconds; rows sorted by throughput;
  first column ``Concurrency`` or ``Request Rate``) -> ``Record``s, so both tools share one table.
"""

import asyncio
import base64
import csv
import io
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Literal

from servelab.bench.monitor import Monitor
from servelab.bench.records import Breakdown, Latency, Load, Record, Stats, append_record, machine_info
from servelab.bench.targets import TritonTarget, model_input_tensor
from servelab.triton.client import IMAGE_INPUT, TENSOR_INPUT
from servelab.bench.triton_stats import stats_delta

# perf_analyzer's CSV columns (microseconds) -> our breakdown part names.
_PARTS = {
    "Client Send": "client_send", "Network+Server Send/Recv": "network_server_send_recv",
    "Server Queue": "queue", "Server Compute Input": "compute_input",
    "Server Compute Infer": "compute_infer", "Server Compute Output": "compute_output",
    "Client Recv": "client_recv",
}
_COMPUTE = ("compute_input", "compute_infer", "compute_output")


class PerfAnalyzerNotFound(RuntimeError):
    pass


def input_data(image: bytes, input: Literal["bytes", "tensor"], manifest: Path | None = None) -> dict[str, Any]:
    if input == "bytes":
        return {"data": [{IMAGE_INPUT: [base64.b64encode(image).decode()]}]}
    tensor = model_input_tensor(image, manifest).astype("<f4")
    return {"data": [{TENSOR_INPUT: {"b64": base64.b64encode(tensor.tobytes()).decode()}}]}


def write_input_data(path: Path, image: bytes, input: Literal["bytes", "tensor"], manifest: Path | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(input_data(image, input, manifest)))
    return path


def perf_analyzer_command(
    *, url: str, model: str, protocol: str, batch: int, load: Load, input_data: Path, csv_path: Path,
    extra: list[str] | tuple[str, ...] = (),
) -> list[str]:
    cmd = ["perf_analyzer", "-m", model, "-u", url, "-i", protocol, "-b", str(batch),
           "--input-data", str(input_data), "-f", str(csv_path), "--verbose-csv"]
    if load.mode == "open":
        cmd += ["--request-rate-range", f"{load.rate:g}", "--request-distribution", str(load.arrivals)]
    else:
        cmd += ["--concurrency-range", str(load.concurrency)]
    if load.requests is not None:
        cmd += ["--measurement-mode", "count_windows", "--measurement-request-count", str(load.requests)]
    else:
        cmd += ["--measurement-interval", str(round((load.duration_s or 5) * 1000))]
    if load.warmup:
        cmd += ["--warmup-request-count", str(load.warmup)]
    return cmd + list(extra)


def _float(row: dict[str, str], column: str) -> float | None:
    value = (row.get(column) or "").strip()
    try:
        return float(value)
    except ValueError:
        return None


def records_from_csv(
    text: str, *, stage: str, target: dict[str, Any], batch: int = 1,
    arrivals: Literal["constant", "poisson"] = "constant", template: Load | None = None,
) -> list[Record]:
    """One record per CSV row. Throughput is converted from inferences/s to requests/s (÷ batch)."""
    records = []
    for row in csv.DictReader(io.StringIO(text.strip())):
        row = {k.strip(): v for k, v in row.items() if k is not None}
        window = (template or Load.sequential()).model_dump(include={"requests", "duration_s", "warmup", "seed"})
        if "Request Rate" in row:
            load = Load(mode="open", rate=_float(row, "Request Rate"), arrivals=arrivals, **window)
        else:
            c = int(_float(row, "Concurrency") or 1)
            load = Load(mode="sequential" if c == 1 else "closed", concurrency=c, **window)
        us = {name: _float(row, column) for column, name in _PARTS.items()}
        parts = {name: v / 1000 for name, v in us.items() if v is not None}
        infer_per_s = _float(row, "Inferences/Second") or 0.0
        pct = {p: _float(row, f"p{p} latency") for p in (50, 90, 95, 99)}
        ms = {p: v / 1000 if v is not None else None for p, v in pct.items()}
        mean = _float(row, "Avg latency")
        compute = [parts[p] for p in _COMPUTE if p in parts]
        records.append(Record(
            tool="perf_analyzer", stage=stage, target=target, load=load, batch=batch,
            stats=Stats(
                throughput_rps=infer_per_s / batch, items_per_s=infer_per_s,
                latency=Latency(mean_ms=mean / 1000 if mean is not None else None,
                                p50_ms=ms[50], p90_ms=ms[90], p95_ms=ms[95], p99_ms=ms[99]),
            ),
            breakdown=Breakdown(source="perf_analyzer", queue_ms=parts.get("queue"),
                                service_ms=sum(compute) if compute else None, parts_ms=parts),
        ))
    return records


async def _stats(target: TritonTarget) -> dict[str, Any]:
    client = await target.connect(1, 10.0)
    try:
        return await client.server_stats()
    finally:
        await client.close()


def run_perf_analyzer(
    target: TritonTarget, load: Load, *, stage: str, input_data_path: Path | None = None,
    extra: list[str] | tuple[str, ...] = (), server_pid: int | None = None, monitor_interval_s: float = 0.5,
    timeout_s: float = 900.0, stand_in: str | None = None, out: Path | None = None,
) -> Record:
    """Run perf_analyzer for one load against a Triton target; its numbers in a servelab Record."""
    if shutil.which("perf_analyzer") is None:
        raise PerfAnalyzerNotFound(
            "perf_analyzer is not on PATH; it ships in NVIDIA's Triton SDK image "
            "(nvcr.io/nvidia/tritonserver:<yy.mm>-py3-sdk)"
        )
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="servelab-pa-") as tmp:
        data = input_data_path or write_input_data(Path(tmp) / "input.json", target.image, target.input, target.manifest)
        csv_path = Path(tmp) / "perf.csv"
        cmd = perf_analyzer_command(url=target.url, model=target.model, protocol=target.protocol,
                                    batch=target.batch, load=load, input_data=data, csv_path=csv_path, extra=extra)
        before = _try_stats(target, warnings)
        with Monitor(monitor_interval_s, server_pid) as monitor:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        after = _try_stats(target, warnings) if before is not None else None
        if done.returncode != 0 or not csv_path.exists():
            raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {done.stderr.strip() or done.stdout[-2000:]}")
        text = csv_path.read_text()
    warnings += [line.strip() for line in done.stdout.splitlines() if line.strip().lower().startswith("warning")]
    [record] = records_from_csv(text, stage=stage, target={**target.describe(), "command": cmd},
                                batch=target.batch, arrivals=load.arrivals or "constant", template=load)
    breakdown = record.breakdown
    if before is not None and after is not None and breakdown is not None:
        server = stats_delta(before, after, target.model)
        breakdown = breakdown.model_copy(update={
            "source": "perf_analyzer+triton-stats", "batch_sizes": server.batch_sizes,
            "mean_batch_size": server.mean_batch_size, "server_requests": server.server_requests,
            "server_failures": server.server_failures,
        })
    monitors = monitor.result()
    record = record.model_copy(update={
        "load": load, "breakdown": breakdown, "monitors": monitors, "warnings": warnings, "stand_in": stand_in,
        "machine": machine_info([g.name for g in monitors.gpus] or None),
    })
    if out is not None:
        append_record(out, record)
    return record


def _try_stats(target: TritonTarget, warnings: list[str]) -> dict[str, Any] | None:
    try:
        return asyncio.run(_stats(target))
    except Exception as exc:  # the breakdown loses its batch histogram, the run goes on
        warnings.append(f"Triton statistics unavailable ({type(exc).__name__}: {exc})")
        return None
