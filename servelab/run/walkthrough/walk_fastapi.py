"""``4_fastapi``: one FastAPI service, switched between stages and model variants, measured with ``servelab load``."""

import base64
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, NamedTuple

import numpy as np
import requests
import uvicorn

from servelab.core.artifacts import load_manifest
from servelab.core.preprocess import crop_pixels
from servelab.core.tables import num, text
from servelab.core.variants.build import agreement, run_batches, session, variant_path
from servelab.measure.loadgen import overload_load, rollout_load
from servelab.measure.measure_stage import Labels, measure_stage_async, servelab_client, stand_in_note
from servelab.measure.records import Load, Record, RunKind
from servelab.measure.targets import FastAPITarget, PhotoMix, response_cache_counts
from servelab.report.precision import cpu_ms_per_request
from servelab.report.render import summary_table
from servelab.report.timelines import plot_timelines
from servelab.run.walkthrough.common import load_command, try_gourmetgram, utilization, wait_until
from servelab.run.walkthrough.production import by_version, over_time, queue_words
from servelab.servers.fastapi.admin import reload

# The parts of /ready that say what a measurement measured; they go into its record's config.
CONFIG_KEYS = ("service", "model", "runtime", "batching")


@dataclass(frozen=True)
class ServingStage:
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


class Serving(NamedTuple):
    """What a FastAPI service runs, as far as a measurement's label depends on it."""

    service: str | None
    batching: bool | None
    variant: str | None
    max_queue_requests: int = 0  # its queue bound (0: none)
    cache: bool = False  # a response cache in front of its model (CACHE_URL)


def serving(url: str) -> Serving | str:
    """What ``url``/ready says it serves (and /metrics, whether it has a response cache), or why it did not say."""
    try:
        ready = requests.get(f"{url}/ready", timeout=5).json()
        metrics = requests.get(f"{url}/metrics", timeout=5).text
    except (requests.RequestException, ValueError) as exc:
        return f"no answer ({type(exc).__name__})"
    batching = ready.get("batching") or {}
    return Serving(ready.get("service"), batching.get("enabled"), (ready.get("variant") or {}).get("name"),
                   batching.get("max_queue_requests") or 0, response_cache_counts(metrics) is not None)


def compare_variants(runs: dict[str, tuple[ServingStage, Record]]) -> str:
    """Busy runs of the model variants (fp32 first) side by side: file, size, precision, throughput against
    fp32's, the service's split into preprocessing and inference, and CPU time per request."""
    fp32 = runs["fp32"][1].stats.throughput_rps
    rows = []
    for name, (service, record) in runs.items():
        v, part, rps = service.ready["variant"], record.breakdown.parts_ms.get, record.stats.throughput_rps
        rows.append([name, v["file"], num(v["size_bytes"] / 1e6), v["precision"], num(rps), num(rps / fp32, 2),
                     num(part("preprocess", 0), 2), num(part("infer", 0), 2), num(cpu_ms_per_request(record))])
    return text(["variant", "file", "MB", "precision", "req/s", "x fp32", "preprocess ms", "infer ms",
                 "CPU ms per request"], rows)


def queueing(alone: Record, busy: Record) -> str:
    """A run one request at a time beside a busy one: the slowdown, Little's law, the service's own account,
    and the most its one-at-a-time inference allows (decoding and HTTP overlap with it; inference does not)."""
    n, x, w = busy.load.concurrency, busy.stats.throughput_rps, busy.stats.latency.mean_ms
    service, x_alone = alone.stats.latency.mean_ms, alone.stats.throughput_rps
    lines = [f"one at a time: {service:.1f} ms per request, {x_alone:.0f} req/s",
             f"{n} senders: {x:.0f} req/s = {x / x_alone:.2f} x the rate alone, mean latency {w:.1f} ms = "
             f"{w / service:.1f} x the time alone",
             f"Little's law: {n} requests in flight / {x:.0f} req/s = {1000 * n / x:.1f} ms each"]
    b = busy.breakdown
    if b and b.queue_ms is not None and b.service_ms is not None:
        lines.append(f"the service's own account: {b.queue_ms:.1f} ms waiting + {b.service_ms:.1f} ms being worked on")
    if b and (infer := b.parts_ms.get("infer")):
        batch = b.mean_batch_size or 1
        per = f" for {batch:.1f} images on average" if batch > 1 else ""
        lines.append(f"one inference at a time, {infer:.1f} ms each{per}: at most {1000 * batch / infer:.0f} req/s")
    return "\n".join(lines)


def check_timing(latencies_ms: list[float], wall_s: float, record: Record, slack: float = 3.0) -> str:
    """A student's timing loop beside servelab's run of the load: right within ``slack`` x (two runs differ; a wrong
    unit or a timed warm-up differs by far more)."""
    want, n = record.load.requests, len(latencies_ms)
    if n != want:
        return f"wrong: {n} latencies, the load has {want} timed requests (warm-up requests are sent, not timed)"
    mine = {"median": (median(latencies_ms), record.stats.latency.p50_ms, "ms"),
            "throughput": (n / wall_s if wall_s > 0 else 0.0, record.stats.throughput_rps, "req/s")}
    said = "; ".join(f"{what} {a:.1f} {unit} (servelab load: {b:.1f})" for what, (a, b, unit) in mine.items())
    if off := [what for what, (a, b, _) in mine.items() if not (b / slack <= a <= b * slack)]:
        return (f"wrong: {said}; your {' and '.join(off)} is over {slack:g} x off: time each request in ms "
                "(time.perf_counter() before and after), and req/s over the timed requests' wall time")
    return f"right: {said}"


def check_app(url: str, service_url: str, photo: Path) -> str:
    """A student's app beside the service: the same class and probability (to 1e-3), and 400 for a non-photo."""
    body = {"image": base64.b64encode(photo.read_bytes()).decode()}
    yours, theirs = (requests.post(f"{u}/predict", json=body, timeout=30) for u in (url, service_url))
    if yours.status_code != 200:
        return f"wrong: your POST /predict answered HTTP {yours.status_code}: {yours.text[:300]}"
    a, b = yours.json(), theirs.json()
    if a.get("prediction") != b["prediction"] or abs(a.get("probability", -1) - b["probability"]) > 1e-3:
        return f"wrong: yours answers {a}, the service {b}: decode, preprocess with the manifest's sizes, then top1"
    bad = requests.post(f"{url}/predict", json={"image": "not a photo"}, timeout=30)
    if bad.status_code != 400:
        return f"wrong: a body that is not a photo got HTTP {bad.status_code}; catch ImageError, raise HTTPException(400)"
    return f"right: {a['prediction']} ({a['probability']:.3f}) as the service says, and 400 for a non-photo"


def check_response(answer: requests.Response, status: int = 200, **headers: str) -> str:
    """A student's last response: ``status`` and ``headers`` (``X_Cache="hit"``: the X-Cache header) as wanted."""
    wanted = {name.replace("_", "-"): value for name, value in headers.items()}
    said = [f"HTTP {answer.status_code}"] + [f"{name}: {answer.headers.get(name)}" for name in wanted]
    wrong = answer.status_code != status or any(answer.headers.get(n) != v for n, v in wanted.items())
    want = ", ".join([f"HTTP {status}"] + [f"{n}: {v}" for n, v in wanted.items()])
    return f"{'wrong' if wrong else 'right'}: {', '.join(said)}" + (f"; expected {want}" if wrong else "")


def check_mean_batch(mean: float, url: str) -> str:
    """A student's mean batch: right where it is the histogram's sum over its count in ``url``/metrics now."""
    found = {line.split()[0]: float(line.split()[-1]) for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines()
             if line.startswith(("servelab_batch_size_sum", "servelab_batch_size_count"))}
    want = found["servelab_batch_size_sum"] / found["servelab_batch_size_count"]
    if abs(mean - want) > 1e-6 * want:
        return f"wrong: {mean:.3f}, the histogram says {want:.3f} (servelab_batch_size_sum over servelab_batch_size_count)"
    return f"right: {want:.2f} images per inference, on average, since the service started"


def check_sessions(runtime: dict[str, Any], url: str) -> str:
    """A student's ``runtime`` from /ready, against the service's now (no request runs in between)."""
    if runtime != (want := requests.get(f"{url}/ready", timeout=5).json()["runtime"]):
        return f'wrong: not the "runtime" of {url}/ready\'s JSON now'
    return f"right: {len(want.get('session_counts', []))} session(s), shape policy {want.get('shape_policy', '-')}"


def check_int8(same: float, photos: list[bytes], model_dir: Path) -> str:
    """A student's share of ``photos`` where INT8's top class is fp32's, against ``agreement``'s."""
    pixels = np.stack([crop_pixels(b) for b in photos])
    manifest = load_manifest(model_dir / "food11.json")
    fp32, int8 = (run_batches(session(variant_path(model_dir, name)), pixels, name == "fp32", manifest)
                  for name in ("fp32", "int8"))
    want = agreement(fp32, int8).top1
    if abs(same - want) > 0.5 / len(photos):  # one photo's difference, not float noise
        return f"wrong: {same:.1%}, the variants' own measure says {want:.1%} (the share of equal argmax)"
    return f"right: INT8's top class is fp32's on {want:.1%} of {len(photos)} photos"


def check_shed(metrics: list[str], url: str, run: Record) -> str:
    """A student's lines of ``url``/metrics: right where they hold the service's shed counters as they are now."""
    now = [line for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines()
           if line.startswith("servelab_shed_requests_total")]
    if not now or not set(now) <= set(metrics):
        return "wrong: these lines are not the service's /metrics now (its servelab_shed_requests_total lines)"
    counted = sum(float(line.split()[-1]) for line in now)
    return f"right: the service counts {counted:.0f} shed since it started; the run counted {sum(run.stats.shed.values())}"


def switch_line(want: Serving) -> str:
    """The notebook's ```shell line that makes the service serve ``want``: what a wait tells a student to type."""
    env = ["CACHE_URL=redis://redis:6379/0"] * want.cache + [f"FASTAPI_STAGE={want.service}"] \
        + ["MAX_BATCH_SIZE=16", "BATCH_TIMEOUT_MS=5"] * bool(want.batching) \
        + [f"ONNX_VARIANT={want.variant}"] * (want.variant not in (None, "fp32")) \
        + [f"MAX_QUEUE_REQUESTS={want.max_queue_requests}"] * bool(want.max_queue_requests)
    return " ".join([*env, "docker compose -f docker/docker-compose-fastapi.yaml",
                     "--profile cache up -d redis" if want.cache else "up -d", "fastapi_server"])


@dataclass
class FastAPIWalkthrough:
    """The notebook's steps. Every stage is the service at ``url``, switched from the node's shell, or at
    ``stage_urls[stage]`` (side by side, in tests). ``flask_url``: GourmetGram's; empty: a browser instead."""

    url: str
    photo: Path
    records_file: Path
    wait_s: float
    stage_urls: dict[str, str] = field(default_factory=dict)
    flask_url: str = ""
    variants: list[str] = field(default_factory=lambda: ["u8", "int8", "fp16"])
    runs: list[Record] = field(default_factory=list)
    variant_runs: dict[str, tuple[ServingStage, Record]] = field(default_factory=dict)
    app_server: tuple[uvicorn.Server, threading.Thread] | None = None  # the student's app, while it serves

    def serve_app(self, app: Any, port: int) -> str:
        """Serve a student's ``app`` with uvicorn in a thread of this kernel on 127.0.0.1:``port`` (the one
        started before stops first, so a changed app runs again); its URL once it listens."""
        if self.app_server is not None:
            server, thread = self.app_server
            server.should_exit = True
            thread.join()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        self.app_server = server, thread
        while not server.started:
            if not thread.is_alive():  # uvicorn said why above (a port in use, an app that fails to start)
                raise RuntimeError(f"your app did not start on port {port}")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        print(f"your app: {url} (uvicorn.Server(uvicorn.Config(app, port={port})).run(), in a thread of this kernel)")
        return url

    def wait_for(self, stage: str, service: str, batching: bool, variant: str | None = None,
                 max_queue_requests: int = 0, cache: bool = False) -> ServingStage:
        """Wait until the stage's URL serves as asked (``Serving``; ONNX: fp32 unless said), so that a
        measurement is never labelled with the wrong stage, and show what it runs on."""
        url = self.stage_urls.get(stage, self.url)
        on_off = "on" if batching else "off"
        variant = variant or ("fp32" if service == "fastapi_onnx" else None)
        want = Serving(service, batching, variant, max_queue_requests, cache)
        extra = (f", {variant}" if variant else "") + (f", queue bound {max_queue_requests}" if max_queue_requests
                                                       else "") + (", cache on" if cache else "")
        wait_until(f"{service} (batching {on_off}{extra}) at {url}", lambda: serving(url), want, wait_s=self.wait_s,
                   to_type=switch_line(want))
        ready = requests.get(f"{url}/ready", timeout=5).json()
        print(f"{stage}: {url} is {service}, batching {on_off}, model {ready['model']}")
        print("runtime:", json.dumps(ready["runtime"]))
        return ServingStage(stage, url, ready)

    async def measure(self, service: ServingStage, load: Load, config: dict[str, Any] | None = None,
                      mix: PhotoMix | None = None, **options: Any) -> Record:
        """Measure ``service`` under ``load`` (``config``: the case's; ``options``: ``run_bench``'s), keep, print."""
        target = FastAPITarget(service.url, self.photo.read_bytes(), image_name=self.photo.name, mix=mix)
        labels = Labels(service.stage, {**service.config, **(config or {})}, service.stand_in)
        print(load_command("fastapi", ["--url", service.url], load, service.stage))
        [record] = await measure_stage_async(target, [load], labels, [servelab_client(out=self.records_file, **options)])
        self.runs.append(record)
        print(summary_table([record]))
        print(utilization(record))
        return record

    async def overload(self, service: ServingStage, capacity: Record, seconds: float) -> Record:
        """``overload_load`` over ``capacity`` (a closed-loop run) for ``seconds``, as ``servelab lab`` offers
        it, printed second by second."""
        load, config = overload_load(capacity.stats.throughput_rps, seconds)
        record = await self.measure(service, load, {**config, "bound": queue_words(service.ready)},
                                     timeline_bin_s=1.0, keep_requests=True)
        print(over_time(record))
        return record

    async def photo_mix(self, service: ServingStage, load: Load, mix: PhotoMix) -> Record:
        """``load`` with each request's photo drawn from ``mix``: the cache case."""
        return await self.measure(service, load, {"run": RunKind.CACHE}, mix=mix)

    async def rollout(self, service: ServingStage, variant: str, load: Load, at_s: float) -> Record:
        """``load`` during which, ``at_s`` seconds in, the service is asked to serve ``variant`` (``POST
        /admin/reload``); printed per half second by the version that answered."""
        load, config, trigger = rollout_load(lambda: reload(service.url, variant=variant), at_s, load.duration_s,
                                             concurrency=load.concurrency, warmup=load.warmup)
        record = await self.measure(service, load, {**config, "to_variant": variant}, timeline_bin_s=0.5,
                                     keep_requests=True, trigger=trigger)
        print(by_version(record))
        return record

    def plot_over_time(self, name: str, *runs: Record) -> Path:
        """The report's plot of runs over time, drawn into ``name``.png beside the FastAPI report."""
        out = self.records_file.parent / "fastapi" / f"{name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_timelines(list(runs), out)
        return out

    async def measure_variant(self, variant: str, load: Load, fp32: tuple[ServingStage, Record]) -> None:
        """Measure the ONNX service on ``variant`` under ``load``, kept beside fp32's for ``compare_variants``."""
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
