"""perf_analyzer interop: its input data (the real photo, never its random default: base64 text for ``bytes``, the
little-endian tensor or crop as ``{"b64": ...}`` otherwise), its command line, and its CSV (microseconds, a row
per load) as servelab records. A run that measured nothing is a record too, ``failed`` its own message.
"""

import asyncio
import base64
import csv
import io
import json
import math
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from servelab.core.installers.perf_analyzer_install import PerfAnalyzerNotFound, locate
from servelab.measure.monitor import Monitor
from servelab.measure.records import Breakdown, Labels, Latency, Load, Record, Stats, append_record, machine_info
from servelab.measure.targets import TritonTarget, model_input_tensor
from servelab.measure.triton_stats import PHASES, stats_delta
from servelab.servers.triton.client import IMAGE_INPUT, PIXELS_INPUT, TENSOR_INPUT, InputKind

# perf_analyzer's CSV columns (microseconds) -> our breakdown part names.
_PARTS = {"Client Send": "client_send", "Network+Server Send/Recv": "network_server_send_recv", "Server Queue": "queue",
          "Server Compute Input": "compute_input", "Server Compute Infer": "compute_infer",
          "Server Compute Output": "compute_output", "Client Recv": "client_recv"}


def input_data(image: bytes, input: InputKind, manifest: Path | None = None) -> dict[str, Any]:
    if input == "bytes":
        return {"data": [{IMAGE_INPUT: [base64.b64encode(image).decode()]}]}
    name, tensor = ((PIXELS_INPUT, model_input_tensor(image, manifest, "uint8")) if input == "uint8"
                    else (TENSOR_INPUT, model_input_tensor(image, manifest).astype("<f4")))
    return {"data": [{name: {"b64": base64.b64encode(tensor.tobytes()).decode()}}]}


def write_input_data(path: Path, image: bytes, input: InputKind, manifest: Path | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(input_data(image, input, manifest)))
    return path


@dataclass(frozen=True)
class Windows:
    """How a run is measured, by both clients (servelab's: ``measure_stage.windowed``): three windows of
    ``window_s`` seconds, until the last three agree within ``stability_pct`` or ``max_trials`` windows have run
    (``stability_pct`` ≥ 100: no test). An open loop keeps count windows: perf_analyzer 2.50 in request-rate mode
    found no three stable time windows of a fraction of a second, even untested (the quick lab)."""

    stability_pct: float = 10.0
    max_trials: int = 10
    window_s: float | None = None

    COUNT = 3  # the windows reported together (perf_analyzer's own, fixed)
    MIN_REQUESTS = 3  # a time window is stretched to hold at least this many requests at the rate servelab measured

    @property
    def tested(self) -> bool:
        """Whether the windows must agree (a stability test), or three windows are taken whatever their spread."""
        return self.stability_pct < 100

    def requests_per_window(self, load: Load) -> int:
        # Three windows of a third each: about as many measured requests as servelab's run of that load.
        # At least 3 per window (one gives perf_analyzer no spread) and at least one per sender; no
        # more, so that a short run of slow requests (16 images each on a CPU) stays short.
        return max(3, load.concurrency or 1, math.ceil((load.requests or 100) / 3))

    def fitted(self, rps: float | None) -> "Windows":
        """These windows, each stretched to hold ``MIN_REQUESTS`` requests at ``rps`` (what servelab's client
        measured of the same load): perf_analyzer fails a time window in which no request completed."""
        if self.window_s is None or not rps:
            return self
        return replace(self, window_s=max(self.window_s, round(self.MIN_REQUESTS / rps, 2)))


def perf_analyzer_command(*, url: str, model: str, protocol: str, batch: int, load: Load, input_data: Path,
                          csv_path: Path, windows: Windows = Windows(), extra: list[str] | tuple[str, ...] = (),
                          binary: str = "perf_analyzer") -> list[str]:
    """One perf_analyzer run of ``load``. No warm-up option (2.50): its stability check drops unstable first windows."""
    cmd = [binary, "-m", model, "-u", url, "-i", protocol, "-b", str(batch),
           "--input-data", str(input_data), "-f", str(csv_path), "--verbose-csv",
           "--stability-percentage", f"{windows.stability_pct:g}", "--max-trials", str(windows.max_trials)]
    if load.mode == "open":
        cmd += ["--request-rate-range", f"{load.rate:g}", "--request-distribution", str(load.arrivals)]
    else:
        cmd += ["--concurrency-range", str(load.concurrency)]
    if windows.window_s is not None and load.mode != "open":  # the plan's time windows, as servelab's client's
        cmd += ["--measurement-interval", str(round(windows.window_s * 1000))]
    elif load.requests is not None:
        # Not --request-count: 2.50 divides that count by whole seconds and under-reports throughput.
        cmd += ["--measurement-mode", "count_windows", "--measurement-request-count",
                str(windows.requests_per_window(load))]
    else:
        cmd += ["--measurement-interval", str(round((load.duration_s or 5) * 1000))]
    return cmd + list(extra)


def _float(row: dict[str, str], column: str, per: float = 1.0) -> float | None:
    try:
        return float((row.get(column) or "").strip()) / per
    except ValueError:
        return None


def records_from_csv(text: str, *, stage: str, target: dict[str, Any], batch: int = 1,
                     arrivals: Literal["constant", "poisson"] = "constant",
                     template: Load | None = None) -> list[Record]:
    """One record per CSV row. Throughput is converted from inferences/s to requests/s (÷ batch)."""
    records = []
    window = (template or Load.sequential()).model_dump(include={"requests", "duration_s", "warmup", "seed"})
    for row in csv.DictReader(io.StringIO(text.strip())):
        row = {k.strip(): v for k, v in row.items() if k is not None}
        if "Request Rate" in row:
            load = Load(mode="open", rate=_float(row, "Request Rate"), arrivals=arrivals, **window)
        else:
            c = int(_float(row, "Concurrency") or 1)
            load = Load(mode="sequential" if c == 1 else "closed", concurrency=c, **window)
        parts = {name: v for column, name in _PARTS.items() if (v := _float(row, column, 1000)) is not None}
        infer_per_s = _float(row, "Inferences/Second") or 0.0
        ms = {f"p{p}_ms": _float(row, f"p{p} latency", 1000) for p in (50, 90, 95, 99)}
        compute = [parts[p] for p in PHASES[1:] if p in parts]  # Triton's compute phases
        records.append(Record(tool="perf_analyzer", stage=stage, target=target, load=load, batch=batch,
                              stats=Stats(throughput_rps=infer_per_s / batch, items_per_s=infer_per_s,
                                          latency=Latency(mean_ms=_float(row, "Avg latency", 1000), **ms)),
                              breakdown=Breakdown(source="perf_analyzer", queue_ms=parts.get("queue"),
                                                  service_ms=sum(compute) if compute else None, parts_ms=parts)))
    return records


def _try_stats(target: TritonTarget, warnings: list[str]) -> dict[str, Any] | None:
    async def stats() -> dict[str, Any]:
        client = await target.connect(1, 10.0)
        try:
            return await client.server_stats()
        finally:
            await client.close()
    try:
        return asyncio.run(stats())
    except Exception as exc:  # the breakdown loses its batch histogram, the run goes on
        warnings.append(f"Triton statistics unavailable ({type(exc).__name__}: {exc})")
        return None


def _message(out: str, err: str) -> str:
    """perf_analyzer's own words for a failure: its stderr, else its error lines, else the end of what it printed."""
    said = [line.strip() for line in err.splitlines() if line.strip()]
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith(("error", "failed"))]
    return " | ".join(dict.fromkeys(said[-5:] or errors or lines[-3:]))[:2000] or "no output"


def _printed_stats(out: str, load: Load, batch: int, warnings: list[str]) -> dict[str, Any]:
    """What perf_analyzer prints but does not put in its CSV: requests measured, and in request-rate
    mode the rate it really sent at. Its latency counts from the real send, so a rate it could not
    keep up with hides the waiting (coordinated omission): say so."""
    update: dict[str, Any] = {"offered_rps": load.rate}
    if counted := re.search(r"Client:\s*\n\s*Request count:\s*(\d+)", out):
        update |= {"requests": int(counted[1]), "successes": int(counted[1])}
    if load.mode == "open" and (sent := re.search(r"Avg send request rate:\s*([\d.]+)", out)):
        rps = update["offered_rps"] = float(sent[1]) / batch
        if rps < 0.95 * (load.rate or 0):
            warnings.append(f"perf_analyzer sent {rps:.1f} req/s of the {load.rate:g} asked; its "
                            "latency starts at the late send, so it leaves out the time requests waited to be sent")
    return update


def failed_record(target: TritonTarget, load: Load, labels: Labels, *, message: str, command: list[str] | None = None,
                  out: Path | None = None) -> Record:
    """A perf_analyzer run that measured nothing, kept as a measurement with its reason (and its stage's config)."""
    record = Record(tool="perf_analyzer", stage=labels.stage, target={**target.describe(), "command": command or []},
                    load=load.model_copy(update={"warmup": 0}), batch=target.batch, machine=machine_info(),
                    stats=Stats(throughput_rps=0.0, items_per_s=0.0, latency=Latency(), offered_rps=load.rate),
                    stand_in=labels.stand_in, failed=message, config=dict(labels.config or {}))
    if out is not None:
        append_record(out, record)
    return record


@dataclass(frozen=True)
class PerfAnalyzerOptions:
    """How perf_analyzer runs a load, beside the load itself (what ``ClientOptions`` is to servelab's client): built
    once, passed to every run of a measurement."""

    windows: Windows | None = None  # None: Windows(), never fitted to servelab's rate (``perf_analyzer_client``)
    extra: tuple[str, ...] = ()  # perf_analyzer's own flags, after servelab's: the last of a repeated flag counts
    input_data_path: Path | None = None  # None: written from the target's photo
    monitor_interval_s: float = 0.5
    timeout_s: float = 300.0  # perf_analyzer is killed past it, and the record says so
    out: Path | None = None  # each record appended here, one JSON line


def run_perf_analyzer(target: TritonTarget, load: Load, labels: Labels,
                      options: PerfAnalyzerOptions = PerfAnalyzerOptions()) -> Record:
    """Run perf_analyzer for one load against a Triton target; its numbers in a servelab Record (one that could
    not measure, perf_analyzer missing, failing or past its timeout, with ``failed`` set: never an exception)."""
    stage, stand_in, out, windows = labels.stage, labels.stand_in, options.out, options.windows or Windows()
    fail = partial(failed_record, target, load, labels, out=out)
    try:
        pa = locate()
    except PerfAnalyzerNotFound as exc:
        return fail(message=str(exc))
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="servelab-pa-") as tmp:
        data = options.input_data_path or write_input_data(Path(tmp) / "input.json", target.image, target.input, target.manifest)
        csv_path = Path(tmp) / "perf.csv"
        cmd = perf_analyzer_command(url=target.url, model=target.model, protocol=target.protocol, batch=target.batch,
                                    load=load, input_data=data, csv_path=csv_path, windows=windows, extra=options.extra,
                                    binary=str(pa.path))
        before = _try_stats(target, warnings)
        with Monitor(options.monitor_interval_s, labels.server_pid) as monitor:
            started = time.time()  # its window: perf_analyzer's own trials lie within this run of it
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=options.timeout_s, env=pa.env())
            except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
                printed = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
                return fail(message=f"timed out after {options.timeout_s:g} s (killed); last output: {_message(printed, '')}",
                            command=cmd)
        window = [started, time.time()]
        after = _try_stats(target, warnings) if before is not None else None
        text = csv_path.read_text() if csv_path.exists() else ""
    if done.returncode != 0 or not text.strip():
        return fail(message=f"perf_analyzer exited with code {done.returncode}: {_message(done.stdout, done.stderr)}",
                    command=cmd)
    warnings += [line.strip() for line in done.stdout.splitlines() if "warning" in line.lower()]
    [record] = records_from_csv(text, stage=stage, target={**target.describe(), "command": cmd},
                                batch=target.batch, arrivals=load.arrivals or "constant", template=load)
    stats = record.stats.model_copy(update=_printed_stats(done.stdout, load, target.batch, warnings))
    breakdown = record.breakdown
    if before is not None and after is not None and breakdown is not None:
        server = stats_delta(before, after, target.model).model_dump(
            include={"batch_sizes", "mean_batch_size", "server_requests", "server_failures"})
        breakdown = breakdown.model_copy(update={"source": "perf_analyzer+triton-stats", **server})
    monitors = monitor.result()
    record = record.model_copy(update={
        "load": load.model_copy(update={"warmup": 0}), "stats": stats, "breakdown": breakdown, "monitors": monitors,
        "warnings": warnings, "stand_in": stand_in, "machine": machine_info([g.name for g in monitors.gpus] or None),
        "window_unix": window, "config": {**(labels.config or {}), "perf_analyzer": pa.describe(), "stability_pct": windows.stability_pct,
                                          "max_trials": windows.max_trials, "window_s": windows.window_s},
    })
    if out is not None:
        append_record(out, record)
    return record
