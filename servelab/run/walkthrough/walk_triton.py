"""``6_triton_python``, ``7_triton_onnx``, ``8_triton_more``: Triton's stages, each measured with ``servelab load``
and ``perf_analyzer``; all three append to one records file, which the last reports on."""

import difflib
import json
import re
import shlex
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, get_args

import numpy as np
import tritonclient.http as http
from google.protobuf import json_format, text_format

from servelab.core.artifacts import load_manifest
from servelab.core.catalogue import ENSEMBLE, ONNX, ONNX_FP16, ONNX_INT8, ONNX_U8, PT
from servelab.core.postprocess import top1
from servelab.core.procs import DIRECT
from servelab.core.settings import get_settings
from servelab.measure import measure_stage
from servelab.measure.measure_stage import Client, Labels, model_stand_in, servelab_client, stand_in_note
from servelab.measure.perf_analyzer import PerfAnalyzerOptions, records_from_csv, write_input_data
from servelab.measure.records import Load, Record, append_record
from servelab.measure.targets import TritonTarget, model_input_tensor
from servelab.report.render import summary_table
from servelab.run.walkthrough.common import load_command, try_gourmetgram, utilization, wait_until
from servelab.run.walkthrough.stage_switch import diagnosis, run_switch, server_log
from servelab.servers.gourmetgram.services import DEFAULT_MODELS
from servelab.servers.triton import client as triton_io
from servelab.servers.triton import configs
from servelab.servers.triton.configs import CONFIG_NAME, STAGES, block_fields, model_config_pb2, served, served_line
from servelab.servers.triton.server import check_running, model_config, server_address, switch_target

# The parts of a model's config that say what a measurement measured; they go into its record.
CONFIG_KEYS = ("backend", "platform", "instance_group", "dynamic_batching")
INPUTS: tuple[triton_io.InputKind, ...] = get_args(triton_io.InputKind)


def open_loads(rates: list[float], seconds: float, warmup: int) -> list[Load]:
    """At each rate, ``seconds`` of evenly spaced requests, then as many at Poisson moments."""
    return [Load.open(rate, arrivals, duration_s=seconds, warmup=warmup)
            for rate in rates for arrivals in ("constant", "poisson")]


def batch_count_change(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
    """Executions per batch size added between two ``batch_counts`` readings."""
    return {size: n - before.get(size, 0) for size, n in after.items() if n > before.get(size, 0)}


def shape_timings(url: str, model: str, image: np.ndarray, sizes: tuple[int, int], repeats: int) -> dict[str, float]:
    """Median ms per request of ``model`` with batch sizes that alternate (as a dynamic batcher's do) and
    repeated; each size runs once first, untimed: a first run is slow everywhere."""
    batches = {n: np.repeat(image[None], n, axis=0) for n in sizes}
    with http.InferenceServerClient(server_address(url), connection_timeout=60, network_timeout=300) as client:
        def ms(n: int) -> float:
            started = time.perf_counter()
            client.infer(model, triton_io.tensor_inputs("http", batches[n]))
            return (time.perf_counter() - started) * 1000

        for n in sizes:
            ms(n)
        found = {f"alternating {sizes[0]}/{sizes[1]}": median(ms(sizes[i % 2]) for i in range(2 * repeats))}
        return found | {f"repeated {n}": median(ms(n) for _ in range(repeats)) for n in sizes}


def stage_fields(name: str, repository: Path | None = None) -> dict[str, Any]:
    """The fields stage ``name`` changes, as `servelab triton stage` renders them for the lab node."""
    stage = STAGES[name]
    model = stage.triton.model
    config = configs.effective_config(stage, model, kind="gpu", onnxruntime=True,
                                      repository=repository or get_settings().triton_model_repository)
    rendered = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return {key: rendered.get(key) for key in stage.triton.changes.get(model, {})}


def _comparable(key: str, value: Any) -> Any:
    """A field where equivalent spellings agree: an ``instance_group`` as its instances per kind and GPU."""
    if key != "instance_group" or not value:
        return value
    placed: Counter[tuple[str, int | None]] = Counter()
    for group in value:
        for gpu in group.get("gpus") or [None]:
            placed[group.get("kind", "KIND_AUTO"), gpu] += int(group.get("count", 1))
    return sorted(placed.items(), key=str)


def pbtxt(values: dict[str, Any]) -> str:
    """Config fields (None: not set) as config.pbtxt writes them."""
    present = {k: v for k, v in values.items() if v is not None}
    return text_format.MessageToString(json_format.ParseDict(present, model_config_pb2.ModelConfig()),
                                       use_short_repeated_primitives=True)


def check_block(name: str, text: str, repository: Path | None = None) -> str:
    """A student's block for stage ``name``, read as Triton reads config.pbtxt, against the catalogue's
    (``stage_fields``); ValueError says what Triton could not read or, as a diff, what differs."""
    expected = stage_fields(name, repository)
    wanted = " and ".join(f"`{key}`" for key in expected)
    try:
        fields = block_fields(text)
    except text_format.ParseError as exc:
        raise ValueError(f"Triton cannot read this as a model config ({exc}); write {wanted} as in "
                         f"config.pbtxt") from None
    if not fields:
        raise ValueError(f"nothing written yet: replace the TODO with {wanted}, as it would stand in config.pbtxt")
    if extra := sorted(set(fields) - set(expected)):
        raise ValueError(f"write only {wanted} here; this also sets {', '.join(extra)}")
    got = {key: fields.get(key) for key in expected}
    if {k: _comparable(k, v) for k, v in got.items()} != {k: _comparable(k, v) for k, v in expected.items()}:
        diff = difflib.unified_diff(pbtxt(got).splitlines(), pbtxt(expected).splitlines(), "yours", name, lineterm="")
        raise ValueError(f"not {name}'s {wanted} yet (as Triton reads them; - yours, + {name}'s):\n" + "\n".join(diff))
    return f"correct: Triton reads this as {name}'s {wanted}"


def stage_label(label: str) -> str:
    """The stage a ``servelab_stage`` parameter names: ``pt-2x2 (gpu)`` -> ``pt-2x2``; a config with a block a
    student wrote, ``pt-2x2 (yours, gpu)`` -> ``pt-2x2 (yours)``, which is never the catalogue's stage."""
    name, _, rest = label.partition(" ")
    return f"{name} (yours)" if rest.startswith("(yours") else name


def running_stage(url: str, model: str) -> str:
    """The stage Triton runs ``model`` for (its ``servelab_stage`` parameter), or why it cannot tell yet."""
    try:
        return stage_label(model_config(url, model)["parameters"]["servelab_stage"]["string_value"])
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        return f"{model} not ready ({type(exc).__name__})"


def describe_config(name: str, config: dict[str, Any]) -> str:
    """The stage, and what its model's config as Triton reports it says of batching and instances, in two lines."""
    return f"Triton runs {name}: {STAGES[name].about}\n  {config['name']}: {served_line(served(config))}"


@dataclass
class TritonWalkthrough:
    """The notebook's steps. Each waits until Triton (``url``: host:port) runs its stage, which a student
    switches from the node's shell (or ``stage_command``, ``{name}`` for the stage); stages not in ``stages``
    are skipped, and perf_analyzer runs only on ``pa_stages`` (None: all). ``repository``: where this machine
    sees Triton's models, to tell a stand-in. GourmetGram: ``flask_url``, or ``flask_urls[backend]`` where
    its modes run side by side (tests); empty: the student uses a browser."""

    url: str
    photo: Path
    results: Path
    wait_s: float
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    stage_command: str = ""
    perf_analyzer: bool = True
    pa_stages: list[str] | None = None
    pa_window_s: float = 5.0
    pa_extra: list[str] = field(default_factory=list)
    repository: Path | None = None
    flask_url: str = ""
    flask_urls: dict[str, str] = field(default_factory=dict)
    runs: list[Record] = field(default_factory=list)
    # The stages whose config a student's block wrote (``write_config``), and those whose block then passed
    # ``check_block``: the catalogue's stage is measured only once its block has passed.
    written: set[str] = field(default_factory=set)
    passed: set[str] = field(default_factory=set)
    running: dict[str, dict[str, Any]] = field(default_factory=dict)  # ``served``, per model of the stage in use

    def __post_init__(self) -> None:
        self.records_file = Path(self.results) / "records.jsonl"
        self.repository = self.repository or get_settings().triton_model_repository
        # perf_analyzer's --input-data: the same real photo, as bytes, the preprocessed tensor and the uint8 crop.
        image = self.photo.read_bytes()
        self.inputs = {kind: write_input_data(Path(self.results) / f"input-{kind}.json", image, kind) for kind in INPUTS}

    def use_stage(self, name: str) -> dict[str, Any]:
        """Wait (``wait_s`` at most; on timeout Triton's own account) until Triton runs stage ``name``, show its
        instances and batching, and return the config of the model clients call."""
        stage = STAGES[name]
        deadline = time.monotonic() + self.wait_s
        if self.stage_command and running_stage(self.url, stage.triton.model) != name:
            took = run_switch(self.stage_command.format(name=name), self.url, stage.triton.models, wait_s=self.wait_s)
            print(f"switched to {name} in {took:.0f} s")
        try:
            wait_until(f"Triton to run {name}", lambda: running_stage(self.url, stage.triton.model),
                       name, wait_s=max(0.0, deadline - time.monotonic()), to_type=f"servelab triton stage {name}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}{diagnosis(self.url, stage.triton.models)}") from None
        target = switch_target(self.url)  # read back what Triton loaded: a config it runs otherwise is refused
        self.running = check_running(self.url, stage, kind=target.kind, onnxruntime=target.onnxruntime,
                                     repository=target.repository)
        config = model_config(self.url, stage.triton.model)
        print(describe_config(name, config))
        return config

    def write_config(self, name: str, block: str) -> Path | None:
        """Write stage ``name``'s config with a student's ``block`` in place of its own, as `servelab triton stage`
        writes it; the model's next load (``client.load_model``) runs it."""
        if name not in self.stages:
            print(f"skipped: {name} is not in STAGES")
            return None
        stage, target = STAGES[name], switch_target(self.url)
        written = configs.write_effective(stage, kind=target.kind, onnxruntime=target.onnxruntime,
                                          repository=target.repository, block=block)
        (path,) = [p for p in written if p.parent.parent.name == stage.triton.model]
        self.written.add(name)
        self.passed.discard(name)  # a new block is checked again
        print(f"wrote {path}: {name} with your block ({target.kind} instances here); Triton reports it as "
              f"'{name} (yours)', and nothing is measured as {name} until lab.check_block passes")
        return path

    def beside_file(self, name: str, running: dict[str, Any]) -> str:
        """The config file written for stage ``name``'s model beside ``running``, the config Triton reports
        (``client.get_model_config``), one line each: what they say of batching and instances must agree."""
        # Where write_config and `servelab triton stage` write it: the repository of the server at self.url.
        path = Path(switch_target(self.url).repository) / STAGES[name].triton.model / "configs" / f"{CONFIG_NAME}.pbtxt"
        try:
            written = served_line(served(text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())))
        except (OSError, text_format.ParseError) as exc:
            written = f"unreadable ({type(exc).__name__}), so Triton cannot load it either"
        where = path.relative_to(path.parents[2]) if len(path.parents) > 2 else path
        return f"the file ({where}): {written}\nTriton runs (get_model_config): {served_line(served(running))}"

    def check_loaded(self, name: str, running: Any) -> str:
        """A student's ``running`` (``client.get_model_config``) is the config Triton runs for stage ``name`` now,
        after their own load where they wrote its block: only then does a measurement measure what they meant.
        ValueError says which step to redo; the answer: their file beside Triton's config (``beside_file``)."""
        model = STAGES[name].triton.model
        if not isinstance(running, dict) or running.get("name") != model:
            raise ValueError(f"`running` is not {model}'s config: keep what client.get_model_config({model!r}) "
                             "returns (a dict)")
        now = model_config(self.url, model)
        if served(running) != served(now):
            raise ValueError(f"`running` is not the config Triton runs now ({served_line(served(now))}): read it "
                             "again, after the load")
        label = stage_label(now.get("parameters", {}).get("servelab_stage", {}).get("string_value", "?"))
        if name in self.written and label != f"{name} (yours)":
            raise ValueError(f"Triton still runs {label}, not your {name}: load {model} (client.load_model with "
                             "headers=ADMIN), then read its config again")
        if name not in self.written and label != name:
            raise ValueError(f"Triton runs {label}, not {name}: type `servelab triton stage {name}` in your SSH "
                             "session, then run your cell and this one again")
        return f"correct: this is what Triton runs for {label}\n{self.beside_file(name, running)}"

    def check_block(self, name: str, block: str) -> str:
        """``check_block``; once passed, ``measure`` may run the catalogue's stage, whose fields (the answer) show."""
        said = check_block(name, block, self.repository)
        self.passed.add(name)
        return f"{said}; the catalogue's, as Triton reads them:\n{pbtxt(stage_fields(name, self.repository))}"

    def triton_log(self) -> str:
        """The end of Triton's log, which says why it refused a config (its HTTP answer does not)."""
        return server_log(self.url)

    def stand_in(self, name: str) -> str | None:
        """Why the stage's numbers are not the lab's own, if they are not: the stand-ins it runs."""
        notes = [model_config(self.url, m).get("parameters", {}).get("servelab_stand_in", {}).get("string_value")
                 for m in STAGES[name].triton.models]
        manifest = Path(self.repository) / PT / "1" / "food11.json"
        return stand_in_note(*notes, model_stand_in(load_manifest(manifest)) if manifest.exists() else None)

    def _checked(self, name: str) -> None:
        """Refuse the catalogue's stage while a student's block for it has not passed: it would run the answer."""
        if name in self.written and name not in self.passed:
            raise RuntimeError(f"your block for {name} has not passed lab.check_block yet: run the check cell "
                               f"(its diff says what differs); nothing runs as {name} before it passes")

    def batch_counts(self, name: str) -> dict[int, int]:
        """Executions per batch size of stage ``name``'s model since it was loaded (Triton's statistics)."""
        if name not in self.stages:
            return {}
        self._checked(name)
        stats = self._stats(self.use_stage(name)["name"])
        return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}

    def _stats(self, model: str) -> dict[str, Any]:
        """Triton's statistics of ``model`` since it was loaded (its first model_stats entry)."""
        with DIRECT.open(f"http://{server_address(self.url)}/v2/models/{model}/stats", timeout=10) as response:
            return json.load(response)["model_stats"][0]

    def shape_changes(self, name: str, sizes: tuple[int, int] = (6, 10), repeats: int = 8) -> dict[str, float]:
        """``shape_timings`` at stage ``name``: does a change of batch shape cost more than a repeat?"""
        if name not in self.stages:
            print(f"skipped: {name} is not in STAGES")
            return {}
        self._checked(name)
        model = self.use_stage(name)["name"]
        found = shape_timings(self.url, model, model_input_tensor(self.photo.read_bytes(), input=STAGES[name].input),
                              sizes, repeats)
        for what, value in found.items():
            print(f"  {what:16} {value:8.1f} ms per request (median of {2 * repeats if 'alt' in what else repeats})")
        return found

    def check_answer(self, name: str, label: str | list[str], probability: float | None = None) -> str:
        """A student's class (a list: one per image) and softmax probability, against the logits the stage's ONNX
        model gives servelab's own request; ValueError says what is wrong and why."""
        stage = STAGES[name]
        (model,) = [m for m in stage.triton.models if m in (ONNX, ONNX_U8, ONNX_INT8, ONNX_FP16)]
        labels = [label] if isinstance(label, str) else list(label)
        if len(labels) != stage.triton.images:
            raise ValueError(f"wrong count: {len(labels)} classes; a request of {stage.triton.images} images gets "
                             f"{stage.triton.images} rows back, one class each")
        tensor = model_input_tensor(self.photo.read_bytes(), input="uint8" if stage.input == "uint8" else "tensor")[None]
        with http.InferenceServerClient(server_address(self.url), connection_timeout=60, network_timeout=300) as client:
            inputs = triton_io.tensor_inputs("http", tensor)
            logits = client.infer(model, inputs, outputs=triton_io.tensor_outputs("http")).as_numpy("output")[0]
        (ours,) = top1(logits)  # the pipeline's own postprocessing: softmax, then the largest
        want, chance = ours.label, ours.probability
        if wrong := [one for one in labels if one != want]:
            raise ValueError(f"wrong class: {wrong[0]!r}; {model}'s largest logit is {want!r} (CLASSES[logits.argmax()])")
        if probability is None:
            return f"correct: {len(labels)} x {want}, as the logits {model} returns to servelab's own request"
        if abs(float(probability) - chance) > 1e-3:
            raise ValueError(f"wrong probability: {probability}; the softmax of the 11 logits gives {chance:.3f} "
                             "(exp(logit - max) over the sum of them all)")
        return f"correct: {want} {chance:.3f}, as the logits {model} returns to servelab's own request"

    def check_counts(self, name: str, counts: dict[int, int]) -> str:
        """A student's executions per batch size, against Triton's statistics for stage ``name``'s model now."""
        want = self.batch_counts(name)
        if (got := {int(size): int(n) for size, n in counts.items()}) != want:
            raise ValueError(f"not Triton's counts: yours {got}, Triton's {want}; one entry per batch_stats item, "
                             "its batch_size and its compute_infer count")
        return f"correct: {want} executions per batch size, as Triton counts them"

    def check_steps(self, config: dict[str, Any]) -> str:
        """A student's ensemble config, against Triton's own: the steps, in order."""
        if config != (want := model_config(self.url, ENSEMBLE)):
            return "wrong: not food_classifier_ensemble's config as Triton gives it (client.get_model_config)"
        return "right: " + " -> ".join(s["model_name"] for s in want["ensemble_scheduling"]["step"])

    def check_requests(self, requests: dict[str, int]) -> str:
        """A student's successful requests per model, against Triton's statistics for those models now."""
        want = {model: int(self._stats(model)["inference_stats"]["success"]["count"]) for model in requests}
        if not requests or {m: int(n) for m, n in requests.items()} != want:
            raise ValueError(f"not Triton's counts: yours {requests}, Triton's {want}; for each model, the count of "
                             "inference_stats' success in its first model_stats entry")
        return f"correct: {want} requests, as Triton counts them"

    def check_perf_analyzer(self, name: str, csv: str | Path, ours: list[Record], arrivals: str = "constant") -> str:
        """A student's perf_analyzer CSV (``-f``) against the loads of ``ours`` (open loops: of ``arrivals``, which
        a CSV does not say); where they match, its rows join the records and the table."""
        path, stage = Path(csv), STAGES[name]
        if not path.exists() or not path.read_text().strip():
            return (f"wrong: no CSV at {path}: end your line with -f {path}; if perf_analyzer stopped, its last "
                    "lines above say why")
        same = [r for r in ours if r.tool == "servelab" and r.load.arrivals in (None, arrivals)]
        target = {"kind": "triton", "url": self.url, "model": stage.triton.model, "input": stage.input,
                  "batch": stage.triton.images, "typed": str(path)}  # by the student, who chose its flags
        theirs = records_from_csv(path.read_text(), stage=name, target=target, batch=stage.triton.images,
                                  arrivals=arrivals)  # type: ignore[arg-type]
        got, want = [r.load.label() for r in theirs], [r.load.label() for r in same]
        if sorted(got) != sorted(want):  # perf_analyzer's CSV may list a sweep in another order
            flag = "--request-rate-range" if any(r.load.mode == "open" for r in same) else "--concurrency-range"
            return f"wrong: your run measured {got or 'nothing'}; the step measured {want}: {flag} FROM:TO:STEP sets the loads"
        theirs.sort(key=lambda r: want.index(r.load.label()))
        for record in theirs:
            append_record(self.records_file, record)
        self.runs.extend(theirs)
        return "\n".join([f"correct: your perf_analyzer run measured {name} at {', '.join(want)}; it joins the report",
                          summary_table([r for r in self.runs if r.load.label() in want])])

    def try_gourmetgram(self, backend: str) -> None:
        """Classify the photo through GourmetGram once it uses ``backend``; skipped where no stage serves it."""
        model = DEFAULT_MODELS[backend]
        if not any(STAGES[name].triton.model == model for name in self.stages):
            print(f"skipped: no stage in STAGES serves {model} (GourmetGram's BACKEND={backend})")
            return
        try_gourmetgram(self.flask_urls.get(backend, self.flask_url), self.photo, backend=backend, wait_s=self.wait_s)

    def clients(self, stage: str) -> list[Client]:
        """``servelab load``, then perf_analyzer where it measures ``stage``."""
        ours = servelab_client(out=self.records_file)
        if not self.perf_analyzer:
            return [ours]
        if self.pa_stages is not None and stage not in self.pa_stages:
            print(f"perf_analyzer: not run for {stage} (not in PA_STAGES); servelab load measures it")
            return [ours]
        return [ours, self.run_perf_analyzer]

    def run_perf_analyzer(self, target: TritonTarget, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        """The same load with perf_analyzer; a run that fails is recorded with its message, and the step goes on."""
        ours = earlier[0]
        # perf_analyzer needs several completed requests per window: where servelab's run of the same
        # load just took longer than that (a batch of 16 on a CPU), the window grows to about four of them.
        seconds = max(self.pa_window_s, 4 * (ours.stats.latency.p50_ms or 0) / 1000)
        if seconds > self.pa_window_s:
            print(f"perf_analyzer: windows of {seconds:.1f} s instead of {self.pa_window_s:g} s "
                  f"(servelab measured p50 {ours.stats.latency.p50_ms:.0f} ms per request)")
        window = load.model_copy(update={"requests": None, "duration_s": round(seconds, 1)})
        options = PerfAnalyzerOptions(input_data_path=self.inputs[target.input], extra=tuple(self.pa_extra),
                                      out=self.records_file)
        result = measure_stage.perf_analyzer_client(options)(target, window, labels, earlier)
        if result.target.get("command"):
            print("$", shlex.join(result.target["command"]))
        if result.failed:
            print(f"perf_analyzer measured nothing: {result.failed}")
        return result

    async def measure(self, name: str, loads: list[Load], batch: int | None = None) -> list[Record]:
        """Measure stage ``name`` under each load with both tools (``batch``: images per request) and print it."""
        if name not in self.stages:
            print(f"skipped: {name} is not in STAGES")
            return []
        self._checked(name)
        config = self.use_stage(name)  # Triton runs the catalogue's stage: a student's block says '(yours)'
        model = STAGES[name].triton.model
        target = TritonTarget(self.url, model, self.photo.read_bytes(), input=STAGES[name].input,
                              batch=batch or STAGES[name].triton.images, image_name=self.photo.name)
        labels = Labels(name, {**{key: config.get(key) for key in CONFIG_KEYS}, "triton_config": self.running},
                        self.stand_in(name))
        where = ["--url", server_address(self.url), "--model", model, "--input", STAGES[name].input]
        for load in loads:  # perf_analyzer prints its own command beside its run
            print(load_command("triton", where, load, name, target.batch))
        done = await measure_stage.measure_stage_async(target, loads, labels, self.clients(name))
        self.runs.extend(done)
        print(summary_table(done))
        for r in done:
            print(f"  {r.tool:13} {r.load.label():24} {utilization(r)}")
        return done

    def check_client(self, result: Any, images: int = 1) -> str:
        """A student's tritonclient answer for ``images`` photos: right where each is servelab's own request's."""
        try:
            yours = triton_io.predictions(result)
        except (AttributeError, TypeError, ValueError) as exc:  # no result, no such output, not a Food-11 class
            return (f"wrong: no Food-11 FOOD_LABEL with its PROBABILITY ({type(exc).__name__}: {exc}); keep "
                    f"client.infer's answer as `result` and send the photo as INPUT_IMAGE, BYTES, shape [{images}, 1]")
        if len(yours) != images:
            return f"wrong: {len(yours)} answers for {images} photos: send INPUT_IMAGE of shape [{images}, 1]"
        with http.InferenceServerClient(server_address(self.url), network_timeout=300) as client:
            photo = triton_io.image_inputs("http", [self.photo.read_bytes()], "raw")
            (ours,) = triton_io.predictions(client.infer(PT, photo, outputs=triton_io.label_outputs("http")))
        for p in yours:
            if p.label != ours.label or abs(p.probability - ours.probability) > 1e-3:
                return f"wrong: yours says {p.label} ({p.probability:.3f}), Triton {ours.label} ({ours.probability:.3f}) for the photo"
        return f"right: {yours[0].label} ({yours[0].probability:.3f}), as servelab's own request for the photo gets" + (
            f", for each of the {images} photos" if images > 1 else "")

    def check_statistics(self, stats: dict[str, Any]) -> str:
        """A student's food_classifier ``inference_stats``: right where Triton holds the same now."""
        now = self._stats(PT)["inference_stats"]
        if not isinstance(stats, dict) or {k: stats.get(k) for k in now} != now:
            return ("wrong: not food_classifier's inference_stats as Triton holds them now: take "
                    "get_inference_statistics('food_classifier')['model_stats'][0]['inference_stats']")
        return f"right: {now['success']['count']} successful requests since the model was loaded"

    def check_printed_run(self, printed: list[str], stage: str) -> str:
        """What a student's perf_analyzer line printed, beside the step's runs of ``stage``: right where it used
        the step's batch size, window, percentile and one of its concurrencies."""
        text = "\n".join(printed)
        summary = re.findall(r"^(Concurrency: (\d+), throughput: [\d.]+ infer/sec, latency \d+ usec)$", text, re.MULTILINE)
        if not summary:
            return "wrong: perf_analyzer measured nothing; what it said last:\n" + "\n".join(printed[-5:])
        percentile = next((a.split("=")[1] for a in self.pa_extra if a.startswith("--percentile=")), None)
        want = {"Batch size": str(STAGES[stage].triton.images), "Measurement window": f"{round(self.pa_window_s * 1000)} msec",
                "Stabilizing using": f"p{percentile}" if percentile else "average"}
        # perf_analyzer 2.50 prints e.g. "Stabilizing using p95latency and throughput": the percentile is the first word.
        got = {key: m[1].strip() if (m := re.search(rf"^\s*{key}:? (\d+ msec|\d+|p\d+|average|.+)", text, re.MULTILINE))
               else "-" for key in want}
        steps = {r.load.concurrency or 1: r for r in self.runs if r.stage == stage and r.batch == STAGES[stage].triton.images
                 and r.load.mode != "open" and not r.failed}
        lines = []
        for line, concurrency in summary:
            step = steps.get(int(concurrency))
            lines.append(f"  {line} (the step's {step.tool}: {step.stats.items_per_s:.1f} infer/sec)" if step
                         else f"  {line} (the step did not measure it)")
        wrong = [f"{key} {got[key]}, the step's {value}" for key, value in want.items() if got[key] != value]
        if steps and not set(steps) & {int(c) for _, c in summary}:
            wrong.append(f"concurrency {', '.join(c for _, c in summary)}, the step's {', '.join(map(str, sorted(steps)))}")
        verdict = f"wrong: {'; '.join(wrong)}" if wrong else "right: the step's settings and load"
        return "\n".join([verdict, *lines])
