"""``4_fastapi``: one FastAPI service, switched between stages and model variants, measured with
``servelab load``."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from servelab.measure.targets import FastAPITarget
from servelab.measure.records import Load, Record
from servelab.measure.measure_stage import Labels, measure_stage_async, servelab_client, stand_in_note
from servelab.report.precision import cpu_ms_per_request
from servelab.report.render import summary_table
from servelab.run.walkthrough.common import try_gourmetgram, utilization, wait_until

# The parts of /ready that say what a measurement measured; they go into its record's config.
CONFIG_KEYS = ("service", "model", "runtime", "batching")


@dataclass(frozen=True)
class Service:
    """A stage's service as it answered /ready once it was the one wanted."""

    stage: str
    url: str
    ready: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        # The model variant by name, as `servelab lab` records it (the report reads the rest from MODEL_DIR).
        return {**{key: self.ready[key] for key in CONFIG_KEYS}, "variant": (self.ready.get("variant") or {}).get("name")}

    @property
    def stand_in(self) -> str | None:
        """Why its numbers are not the lab's own model's, if they are not."""
        return stand_in_note(self.ready["description"] if self.ready.get("stand_in") else None)


def serving(url: str) -> tuple[str | None, bool | None, str | None] | str:
    """(service, batching enabled, model variant) as ``url``/ready says, or why it did not say."""
    try:
        ready = requests.get(f"{url}/ready", timeout=5).json()
    except (requests.RequestException, ValueError) as exc:
        return f"no answer ({type(exc).__name__})"
    return ready.get("service"), (ready.get("batching") or {}).get("enabled"), (ready.get("variant") or {}).get("name")


def compare_variants(runs: dict[str, tuple[Service, Record]]) -> str:
    """Busy runs of the model variants (fp32 first) side by side: the file, its size and precision,
    throughput against fp32's, the service's own split of a request into preprocessing and
    inference, and the machine's CPU time per request."""
    fp32 = runs["fp32"][1].stats.throughput_rps
    lines = []
    for name, (service, record) in runs.items():
        v, parts, cpu = service.ready["variant"], record.breakdown.parts_ms, cpu_ms_per_request(record)
        lines.append(f"{name:<8} {v['file']:<24} {v['size_bytes'] / 1e6:5.1f} MB {v['precision']:<5} "
                     f"{record.stats.throughput_rps:6.1f} req/s = {record.stats.throughput_rps / fp32:.2f} x fp32; "
                     f"preprocess {parts.get('preprocess', 0):.2f} ms + infer {parts.get('infer', 0):.2f} ms; "
                     f"CPU {'-' if cpu is None else f'{cpu:.1f}'} ms per request")
    return "\n".join(lines)


def queueing(alone: Record, busy: Record) -> str:
    """A run one request at a time beside a run with several senders: how much longer requests took,
    what Little's law predicts from the outside, the service's own account of the time, and the most
    its one-at-a-time inference allows (decoding and HTTP overlap with it; inference does not)."""
    n, x, w = busy.load.concurrency, busy.stats.throughput_rps, busy.stats.latency.mean_ms
    service, x_alone = alone.stats.latency.mean_ms, alone.stats.throughput_rps
    lines = [
        f"one at a time: {service:.1f} ms per request, {x_alone:.0f} req/s",
        f"{n} senders: {x:.0f} req/s = {x / x_alone:.2f} x the rate alone, mean latency {w:.1f} ms = "
        f"{w / service:.1f} x the time alone",
        f"Little's law: {n} requests in flight / {x:.0f} req/s = {1000 * n / x:.1f} ms each",
    ]
    b = busy.breakdown
    if b and b.queue_ms is not None and b.service_ms is not None:
        lines.append(f"the service's own account: {b.queue_ms:.1f} ms waiting + {b.service_ms:.1f} ms being worked on")
    if b and (infer := b.parts_ms.get("infer")):
        batch = b.mean_batch_size or 1
        per = f" for {batch:.1f} images on average" if batch > 1 else ""
        lines.append(f"one inference at a time, {infer:.1f} ms each{per}: at most {1000 * batch / infer:.0f} req/s")
    return "\n".join(lines)


@dataclass
class FastAPIWalkthrough:
    """The notebook's steps, with its parameters.

    Every stage is the same service at ``url``, switched from the node's shell; ``stage_urls`` gives a
    stage its own URL instead (stages side by side, locally or in tests). ``runs`` collects every
    measurement in order; each is also appended to ``records_file``. ``flask_url`` is GourmetGram's,
    in front of the service; empty: the student uses a browser instead.
    """

    url: str
    photo: Path
    records_file: Path
    wait_s: float
    stage_urls: dict[str, str] = field(default_factory=dict)
    flask_url: str = ""
    variants: list[str] = field(default_factory=lambda: ["u8", "int8", "fp16"])
    runs: list[Record] = field(default_factory=list)
    variant_runs: dict[str, tuple[Service, Record]] = field(default_factory=dict)

    def wait_for(self, stage: str, service: str, batching: bool, variant: str | None = None) -> Service:
        """Wait until the stage's URL runs ``service`` with batching on or off (and the ONNX service,
        ``variant``: fp32 unless said), and show what it runs on, so that a measurement is never
        labelled with the wrong stage."""
        url = self.stage_urls.get(stage, self.url)
        on_off = "on" if batching else "off"
        variant = variant or ("fp32" if service == "fastapi_onnx" else None)
        wait_until(f"{service} (batching {on_off}{f', {variant}' if variant else ''}) at {url}", lambda: serving(url),
                   (service, batching, variant), wait_s=self.wait_s)
        ready = requests.get(f"{url}/ready", timeout=5).json()
        print(f"{stage}: {url} is {service}, batching {on_off}, model {ready['model']}")
        print("runtime:", json.dumps(ready["runtime"]))
        return Service(stage, url, ready)

    async def measure(self, service: Service, load: Load) -> Record:
        """Measure ``service`` under ``load``, record it, and print its table row and utilization."""
        target = FastAPITarget(service.url, self.photo.read_bytes(), image_name=self.photo.name)
        [record] = await measure_stage_async(target, [load], Labels(service.stage, service.config, service.stand_in),
                                             [servelab_client(out=self.records_file)])
        self.runs.append(record)
        print(summary_table([record]))
        print(utilization(record))
        return record

    def sessions(self, service: Service) -> list[dict[str, Any]]:
        """The service's ONNX Runtime sessions now, as its /ready says: the batch size each takes, its runs
        and its shape changes (runs whose input shape differed from that session's previous run)."""
        runtime = requests.get(f"{service.url}/ready", timeout=5).json()["runtime"]
        print(f"shape policy {runtime.get('shape_policy', '-')}:")
        for s in runtime.get("session_counts", []):
            print(f"  session for batch {s['session_batch']:>3}: {s['runs']:5} runs, {s['shape_changes']:5} shape changes")
        return runtime.get("session_counts", [])

    async def measure_variant(self, variant: str, load: Load, fp32: tuple[Service, Record]) -> None:
        """Wait until the ONNX service runs model ``variant``, measure it under ``load`` and keep the
        run beside fp32's (for ``compare_variants``); skipped for a variant not in ``variants``."""
        if variant not in self.variants:
            print(f"skipped: {variant} is not in VARIANTS")
            return
        service = self.wait_for(f"fastapi-onnx-{variant}", "fastapi_onnx", batching=False, variant=variant)
        print("variant:", json.dumps(service.ready["variant"]))
        self.variant_runs.setdefault("fp32", fp32)
        self.variant_runs[variant] = (service, await self.measure(service, load))

    def try_gourmetgram(self) -> None:
        """Classify the photo through GourmetGram, as a user would, and print its answer."""
        try_gourmetgram(self.flask_url, self.photo)
