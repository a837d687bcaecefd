"""The stage catalogue: every stage of the lab, once, with the part that says how its family runs it and what
it teaches (its ``lesson``, measured against its ``baseline``: the report's ratio is this stage ÷ its baseline);
``MODELS`` holds each Triton model once, ``FAMILIES`` each family. No other file of ``servelab/`` spells a stage's
or a model's name (tests/unit/test_catalogue.py); docs/architecture.md ("Adding things") says what a new stage needs.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from servelab.core.family import FASTAPI_QUERIES, RAY_QUERIES, TRITON_QUERIES, Family

Input = Literal["bytes", "tensor", "uint8"]


class Lesson(StrEnum):
    """What the lab teaches, once: a stage names its lesson by one of these (a typo fails at import), and the
    report writes each one up. Its value is the name records and reports use."""

    ONNX = "onnx"
    BATCHING = "batching"
    INSTANCES = "instances"
    VARIANT_U8 = "variant u8"
    VARIANT_INT8 = "variant int8"
    VARIANT_FP16 = "variant fp16"
    SERVER_PREPROCESSING = "server preprocessing"
    REPLICAS = "replicas"
    PROXY = "proxy"
    AUTOSCALING = "autoscaling"
    NODE_FAILURE = "node failure"
    QUEUEING = "queueing"
    SHEDDING = "shedding"
    CACHE = "cache"
    ROLLOUT = "rollout"

    @classmethod
    def of_variant(cls, variant: str) -> "Lesson":
        return cls(f"variant {variant}")


# The Triton models (folders of models_staging/); MODELS says what each takes and needs.
PT, ONNX, ENSEMBLE = "food_classifier", "food_classifier_onnx", "food_classifier_ensemble"
ONNX_U8, ONNX_INT8, ONNX_FP16 = "food_classifier_onnx_u8", "food_classifier_onnx_int8", "food_classifier_onnx_fp16"
PREPROCESS, POSTPROCESS = "food_preprocess", "food_postprocess"

# The batching every batching stage uses, on FastAPI and on the node's compose file: up to 16 images, 5 ms.
BATCHING = {"MAX_BATCH_SIZE": "16", "BATCH_TIMEOUT_MS": "5"}
# The one-request-per-inference stages say so: with no settings the services batch what already waits.
NO_BATCHING = {"MAX_BATCH_SIZE": "1"}
# The overload case: the lab offers these stages 1.5× their capacity, open loop, as they are (the queue grows
# without bound) and ``bounded`` (the excess refused), and follows latency and shedding over time.
OVERLOADED = ("fastapi-onnx", "onnx-dyn")
# ``bounded``'s queue behind FastAPI: at most this many requests held at once, arriving to answered, one more
# refused at once with 503. A few per core: enough to keep every instance busy, few enough that an accepted
# request waits a few service times at most.
QUEUE_BOUND = 8
# ``bounded``'s queue behind Triton bounds the wait instead: a request that waited this long in the queue is
# refused. Not its length: with ``max_queue_size`` set, Triton 2.51's batcher does not prefetch, and while the
# queue is full the refused arrivals never wake it, so after each batch the instance idles out the batcher's
# 500 ms timer (docs/production.md; measured in docs/records/triton-queue-policy-2cpu.log).
QUEUE_WAIT_US = 100_000
# The cache case: the lab sends these stages a skewed mix of photos as they are and ``with_cache``.
CACHED = ("fastapi-onnx", "onnx-1")
# The rollout case: under 16 senders the lab has these stages serve a new version of their model, serving this
# ONNX variant. FastAPI swaps in another variant (`POST /admin/reload`); Triton loads the same file staged as the
# next version (its clients' inputs stay those of version 1), and the lab removes that folder after the case;
# Ray Serve reloads each replica in place (``reconfigure``; one replica, so the version switches once).
ROLLED = {"fastapi-onnx": "int8", "onnx-1": "fp32", "ray-1": "u8"}


def queue_policy(max_queue_size: int, timeout_us: int = 0) -> dict[str, Any]:
    """Triton's ``dynamic_batching.default_queue_policy``: a request arriving to ``max_queue_size`` queued ones
    (0: no limit) is rejected at once, one that waited ``timeout_us`` (0: no limit) instead of running late, and
    no client may ask for a longer wait."""
    policy: dict[str, Any] = {"timeout_action": "REJECT", "allow_timeout_override": False}
    return (policy | ({"max_queue_size": max_queue_size} if max_queue_size else {})
            | ({"default_timeout_microseconds": timeout_us} if timeout_us else {}))


def queue_limits(max_queue_size: int, timeout_ms: float) -> str:
    """A queue bound in words: "8 requests", "100 ms", "2 requests, 20 ms"; "none" without one."""
    return ", ".join([f"{max_queue_size} requests"] * bool(max_queue_size) + [f"{timeout_ms:g} ms"] * bool(timeout_ms)
                     ) or "none"


@dataclass(frozen=True)
class Model:
    """A Triton model of ``models_staging/``, once."""

    name: str  # its folder, and the name clients call
    input: Input = "bytes"  # what a client sends: an encoded photo, or a crop it preprocessed itself
    variant: str = ""  # the ONNX variant (servelab.core.variants.build) it serves as 1/model.onnx
    files: tuple[str, ...] = ()  # the artifacts (servelab.core.artifacts.ArtifactPaths fields) copied into 1/


MODELS: dict[str, Model] = {m.name: m for m in (
    Model(PT, files=("state_dict", "manifest")),
    Model(ONNX, "tensor", "fp32"),
    Model(ENSEMBLE),
    Model(PREPROCESS),  # the ensemble's steps: loaded by it, called by no client
    Model(POSTPROCESS),
    Model(ONNX_U8, "uint8", "u8"),
    Model(ONNX_INT8, "uint8", "int8"),
    Model(ONNX_FP16, "uint8", "fp16"),
)}

# The `servelab serve` services -> the backend each runs (fastapi_pt/app.py: pytorch, fastapi_onnx/app.py: onnx).
SERVICES: dict[str, Literal["pytorch", "onnx"]] = {"fastapi-pt": "pytorch", "fastapi-onnx": "onnx"}


@dataclass(frozen=True)
class FastAPIPart:
    service: Literal["fastapi-pt", "fastapi-onnx"]  # the `servelab serve` service (a key of SERVICES)
    env: Mapping[str, str] = field(default_factory=dict)  # its settings (servelab.core.settings.ServeSettings)
    compose: bool = False  # also a compose stage on the node (docker/docker-compose-fastapi.yaml)

    @property
    def backend(self) -> Literal["pytorch", "onnx"]:
        """The service's backend (``pytorch``: fastapi_pt/app.py, ``onnx``: fastapi_onnx/app.py)."""
        return SERVICES[self.service]


@dataclass(frozen=True)
class TritonPart:
    model: str  # the model clients call (a key of MODELS)
    changes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # model -> replaced config fields
    needs: tuple[str, ...] = ()  # models loaded before ``model`` (an ensemble's steps)
    batches: bool = False  # the lab also sends requests of 16 images (the model batches them in one pass)
    both_arrivals: bool = False  # the lab offers constant as well as Poisson arrivals at each rate
    # Images in every request the lab sends it; > 1: the client forms the batches, all of this one size,
    # so each ONNX Runtime session sees one input shape whatever its version does on a change of shape.
    images: int = 1

    @property
    def models(self) -> tuple[str, ...]:
        """Every model this stage loads, dependencies first."""
        return (*self.needs, self.model)


@dataclass(frozen=True)
class RayPart:
    replicas: int = 1  # fixed replicas; for autoscaling, the most
    batching: bool = False  # @serve.batch (RAY_BATCH_MAX_SIZE, RAY_BATCH_WAIT_MS)
    autoscaling: bool = False  # RAY_AUTOSCALE_* settings
    max_replicas_per_node: int | None = None  # None: as many as the node's CPUs allow
    step_load: bool = False  # the lab also runs a step load (low -> high -> low), replicas over time
    node_failure: bool = False  # the lab also runs a load during which a worker node is killed


Part = FastAPIPart | TritonPart | RayPart
# The families, in the order the lab runs them and the report shows them; a stage's part says which runs it.
FASTAPI = Family("fastapi", "FastAPI", FastAPIPart, FASTAPI_QUERIES)
TRITON = Family("triton", "Triton", TritonPart, TRITON_QUERIES)
RAY = Family("ray", "Ray Serve", RayPart, RAY_QUERIES)
FAMILIES: dict[str, Family] = {f.name: f for f in (FASTAPI, TRITON, RAY)}


@dataclass(frozen=True)
class Stage:
    name: str
    about: str  # what the stage is, in a line (what it teaches: ``lesson`` and ``baseline``)
    part: Part
    variant: str = ""  # the ONNX model variant served (servelab.core.variants.build), named in each record
    needs_gpu: bool = False  # skipped, with the reason, on the CPU
    in_lab: bool = True  # measured by `servelab lab --full` (False: on the node only)
    tour: bool = False  # also in the default `make lab`, which shows each lesson once in a few minutes
    gpu_check: bool = False  # also in the default `make gpu-check`: each GPU lesson once, inside a lent GPU's minutes
    notebook: str = ""  # the notebook that measures it (``taught_in`` sets it; the report names it)
    lesson: Lesson | None = None  # what it teaches (None: none of its own)
    baseline: str = ""  # the stage the lesson measures it against (this ÷ baseline); "": none
    default: bool = False  # what its family's `up` command (servelab triton / ray) starts when no stage is named

    @property
    def family(self) -> str:
        """Its family's name: the record in ``FAMILIES`` whose part it carries."""
        if found := [family.name for family in FAMILIES.values() if isinstance(self.part, family.part)]:
            return found[0]
        raise ValueError(f"{self.name}: its {type(self.part).__name__} is no family's part in FAMILIES")

    @property
    def fastapi(self) -> FastAPIPart:
        return self._part(FastAPIPart)

    @property
    def triton(self) -> TritonPart:
        return self._part(TritonPart)

    @property
    def ray(self) -> RayPart:
        return self._part(RayPart)

    def _part(self, kind: type) -> Any:
        if not isinstance(self.part, kind):
            raise TypeError(f"{self.name} is a {self.family} stage")
        return self.part

    @property
    def input(self) -> Input:
        """What its client sends: FastAPI and Ray stages take encoded photos."""
        return MODELS[self.part.model].input if isinstance(self.part, TritonPart) else "bytes"

    @property
    def runtime(self) -> Literal["pytorch", "onnx"]:
        """What runs the model: Ray Serve runs the fastapi-onnx service; Triton's PyTorch model is PT."""
        if isinstance(self.part, FastAPIPart):
            return self.part.backend
        return "pytorch" if isinstance(self.part, TritonPart) and self.part.model == PT else "onnx"


@dataclass(frozen=True)
class Notebook:
    """One of the lab's notebooks (``notebooks/<name>.md``), in the order students run them."""

    name: str
    core: bool  # on the lease's core path (servelab.tools.lease_plan times it against the lease); else optional


NOTEBOOKS: dict[str, Notebook] = {n.name: n for n in (
    Notebook("0_intro", core=False), Notebook("1_create_lease", core=False),
    Notebook("2_create_server_nvidia", core=True), Notebook("3_fastapi_setup", core=True),
    Notebook("4_fastapi", core=True), Notebook("5_triton_setup", core=True), Notebook("6_triton_python", core=True),
    Notebook("7_triton_onnx", core=True), Notebook("8_triton_more", core=True), Notebook("9_ray_setup", core=False),
    Notebook("10_ray", core=False), Notebook("11_delete_resources", core=True))}


def _taught_in(notebook: str, *stages: Stage) -> tuple[Stage, ...]:
    return tuple(replace(stage, notebook=NOTEBOOKS[notebook].name) for stage in stages)


def _instances(*groups: tuple[int, list[int]]) -> dict[str, Any]:
    """``instance_group`` with ``count`` instances on each listed GPU, one entry per (count, gpus)."""
    return {"instance_group": [{"count": count, "kind": "KIND_GPU", "gpus": gpus} for count, gpus in groups]}


CATALOGUE: tuple[Stage, ...] = (
    # In the order the notebooks teach them; the model variants come last in each family.
    # FastAPI: one process, one model; batching is the service's own (servelab.servers.fastapi.batcher).
    *_taught_in("4_fastapi",
    Stage("fastapi-pt", "FastAPI + PyTorch, one request per inference", FastAPIPart("fastapi-pt", NO_BATCHING, compose=True), tour=True,
          gpu_check=True),
    Stage("fastapi-onnx", "FastAPI + ONNX Runtime, one request per inference",
          FastAPIPart("fastapi-onnx", NO_BATCHING, compose=True), variant="fp32", tour=True, gpu_check=True,
          lesson=Lesson.ONNX, baseline="fastapi-pt"),
    Stage("fastapi-onnx-dyn", "FastAPI + ONNX Runtime with server-side dynamic batching (≤ 16, 5 ms)",
          FastAPIPart("fastapi-onnx", BATCHING, compose=True), gpu_check=True,
          lesson=Lesson.BATCHING, baseline="fastapi-onnx"),
    Stage("fastapi-onnx-u8", "fastapi-onnx with preprocessing in the model (uint8 crops in)",
          FastAPIPart("fastapi-onnx", {**NO_BATCHING, "ONNX_VARIANT": "u8"}), variant="u8",
          lesson=Lesson.VARIANT_U8, baseline="fastapi-onnx"),
    Stage("fastapi-onnx-int8", "fastapi-onnx-u8 quantized to INT8 (static)",
          FastAPIPart("fastapi-onnx", {**NO_BATCHING, "ONNX_VARIANT": "int8"}), variant="int8", tour=True,
          lesson=Lesson.VARIANT_INT8, baseline="fastapi-onnx"),
    Stage("fastapi-onnx-fp16", "fastapi-onnx-u8 in float16 (GPU only)",
          FastAPIPart("fastapi-onnx", {**NO_BATCHING, "ONNX_VARIANT": "fp16"}), variant="fp16", needs_gpu=True,
          lesson=Lesson.VARIANT_FP16, baseline="fastapi-onnx"),
    ),
    # Triton: each stage a config change from the one before it.
    *_taught_in("6_triton_python",
    Stage("pt-1", "Triton Python backend (PyTorch), 1 instance on GPU 0 (the base config)",
          TritonPart(PT, batches=True), default=True),
    Stage("pt-dyn", "pt-1 + dynamic batching", TritonPart(PT, {PT: {"dynamic_batching": {}}}, batches=True),
          lesson=Lesson.BATCHING, baseline="pt-1"),
    Stage("pt-2x2", "Triton Python backend, 2 instances on each of 2 GPUs (4 instances; all on one GPU, or on the CPU)",
          TritonPart(PT, {PT: _instances((2, [0]), (2, [1]))}), lesson=Lesson.INSTANCES, baseline="pt-1"),
    Stage("pt-4x4", "Triton Python backend, 4 instances on each of 2 GPUs (8 instances)",
          TritonPart(PT, {PT: _instances((4, [0]), (4, [1]))}), in_lab=False),
    ),
    *_taught_in("7_triton_onnx",
    Stage("onnx-1", "Triton ONNX Runtime backend, 1 instance on GPU 0 (the base config)",
          TritonPart(ONNX), variant="fp32", tour=True, gpu_check=True, lesson=Lesson.ONNX, baseline="pt-1"),
    Stage("onnx-2", "onnx-1 with 2 instances on each of GPUs 0 and 1 (4 instances)",
          TritonPart(ONNX, {ONNX: _instances((2, [0, 1]))}), tour=True, lesson=Lesson.INSTANCES, baseline="onnx-1"),
    Stage("onnx-dyn", "onnx-1 + dynamic batching (preferred 4, 6, 8; 100 us delay)",
          TritonPart(ONNX, {ONNX: {"dynamic_batching": {"preferred_batch_size": [4, 6, 8],
                                                        "max_queue_delay_microseconds": 100}}},
                     batches=True, both_arrivals=True), tour=True, gpu_check=True, lesson=Lesson.BATCHING,
          baseline="onnx-1"),
    Stage("onnx-b16", "onnx-1 sent batches of 16 images by the client (perf_analyzer -b 16): one input shape, "
          "no server-side batcher", TritonPart(ONNX, images=16)),
    ),
    *_taught_in("8_triton_more",
    Stage("ensemble", "preprocessing on the server: food_preprocess -> onnx-1 -> food_postprocess (an ensemble)",
          TritonPart(ENSEMBLE, needs=(PREPROCESS, ONNX, POSTPROCESS)), lesson=Lesson.SERVER_PREPROCESSING,
          baseline="onnx-1"),
    Stage("onnx-u8", "onnx-1 with preprocessing in the model: uint8 crops in (the base config)",
          TritonPart(ONNX_U8), variant="u8", lesson=Lesson.VARIANT_U8, baseline="onnx-1"),
    Stage("onnx-int8", "onnx-u8 quantized to INT8, static QDQ (the base config)",
          TritonPart(ONNX_INT8), variant="int8", lesson=Lesson.VARIANT_INT8, baseline="onnx-1"),
    Stage("onnx-fp16", "onnx-u8 in float16, GPU only (the base config)",
          TritonPart(ONNX_FP16), variant="fp16", needs_gpu=True, tour=True, gpu_check=True,
          lesson=Lesson.VARIANT_FP16, baseline="onnx-1"),
    ),
    # Ray Serve: the fastapi-onnx service in replicas over a head and a worker node.
    *_taught_in("10_ray",
    Stage("ray-1", "Ray Serve, 1 replica", RayPart(replicas=1), tour=True, lesson=Lesson.PROXY, baseline="fastapi-onnx"),
    Stage("ray-2", "Ray Serve, 2 replicas (one per node)", RayPart(replicas=2, max_replicas_per_node=1, node_failure=True),
          tour=True, lesson=Lesson.REPLICAS, baseline="ray-1", default=True),
    Stage("ray-4", "Ray Serve, 4 replicas (two per node)", RayPart(replicas=4, max_replicas_per_node=2),
          lesson=Lesson.REPLICAS, baseline="ray-1"),
    Stage("ray-dyn", "Ray Serve, 2 replicas (one per node) + @serve.batch (RAY_BATCH_MAX_SIZE, RAY_BATCH_WAIT_MS)",
          RayPart(replicas=2, batching=True, max_replicas_per_node=1), lesson=Lesson.BATCHING, baseline="ray-2"),
    Stage("ray-auto", "Ray Serve, autoscaling replicas (RAY_AUTOSCALE_*)",
          RayPart(autoscaling=True, max_replicas_per_node=2, step_load=True), lesson=Lesson.AUTOSCALING),
    ),
)

STAGES: dict[str, Stage] = {s.name: s for s in CATALOGUE}

# The core path's measurements: each stage the non-optional sections of 4_fastapi, 6_triton_python and
# 7_triton_onnx measure (pt-dyn's and fastapi-onnx-dyn's are optional since #66: 7's onnx-dyn teaches batching
# on the core path), with its load modes (8_triton_more's core: the report).
# The grader's check requires them of a submission (servelab.report.check); tests/unit/test_catalogue.py reads
# them back from those notebooks' ``lab.measure`` calls.
CORE_PATH: dict[str, tuple[str, ...]] = {
    "fastapi-pt": ("sequential", "closed"), "fastapi-onnx": ("sequential", "closed"),
    "pt-1": ("sequential", "closed"), "pt-2x2": ("closed",),
    "onnx-1": ("sequential", "closed", "open"), "onnx-dyn": ("open",),
}


def stages_taught_in(notebook: str) -> list[str]:
    """The stages ``notebook`` teaches, in catalogue order: its ``STAGES`` parameter's default (None)."""
    return [s.name for s in STAGES.values() if s.notebook == notebook]


def of_family(family: str) -> dict[str, Stage]:
    """The stages one runner runs, in catalogue order."""
    return {s.name: s for s in CATALOGUE if s.family == family}


def default_stage(family: str) -> str:
    """The stage of ``family`` marked ``default``."""
    [stage] = [s.name for s in of_family(family).values() if s.default]
    return stage


def bounded(stage: Stage, max_queue_size: int | None = None, timeout_us: int | None = None) -> Stage:
    """``stage`` with its queue bounded (FastAPI's ``MAX_QUEUE_REQUESTS``/``MAX_QUEUE_DELAY_MS``, Triton's
    ``default_queue_policy``, which needs a dynamic batcher), named after it and the bound (``fastapi-onnx-shed``,
    ``pt-dyn-shed-q2-20000us``); no bound given: the family's own. Derived, not listed: the overload case's."""
    default = (0, QUEUE_WAIT_US) if isinstance(stage.part, TritonPart) else (QUEUE_BOUND, 0)
    if max_queue_size is None and timeout_us is None:
        max_queue_size, timeout_us = default
    max_queue_size, timeout_us = max_queue_size or 0, timeout_us or 0
    tag = "" if (max_queue_size, timeout_us) == default else f"-q{max_queue_size}" + (
        f"-{timeout_us}us" if timeout_us else "")
    words = queue_limits(max_queue_size, timeout_us / 1000)
    if isinstance(stage.part, FastAPIPart):
        env = {**stage.part.env, "MAX_QUEUE_REQUESTS": str(max_queue_size),
               **({"MAX_QUEUE_DELAY_MS": f"{timeout_us / 1000:g}"} if timeout_us else {})}
        part: Part = replace(stage.part, env=env, compose=False)
    elif isinstance(stage.part, TritonPart):
        model, changes = stage.part.model, stage.part.changes
        fields = dict(changes.get(model, {}))
        fields["dynamic_batching"] = {**fields.get("dynamic_batching", {}),
                                      "default_queue_policy": queue_policy(max_queue_size, timeout_us)}
        part = replace(stage.part, changes={**changes, model: fields})
    else:
        raise ValueError(f"{stage.name}: a Ray Serve stage's queue is Serve's own (max_ongoing_requests)")
    return replace(stage, name=f"{stage.name}-shed{tag}", part=part,
                   about=f"{stage.name} with its queue bounded ({words} at most): the excess is refused (503)",
                   tour=False, gpu_check=False, lesson=Lesson.SHEDDING, baseline=stage.name, default=False)


def queue_bound(stage: Stage) -> str:
    """The stage's queue bound, in words ("none": requests queue without limit)."""
    if isinstance(stage.part, FastAPIPart):
        env = stage.part.env
        return queue_limits(int(env.get("MAX_QUEUE_REQUESTS", 0)), float(env.get("MAX_QUEUE_DELAY_MS", 0)))
    if isinstance(stage.part, TritonPart):
        policy = stage.part.changes.get(stage.part.model, {}).get("dynamic_batching", {}).get("default_queue_policy", {})
        return queue_limits(policy.get("max_queue_size", 0), policy.get("default_timeout_microseconds", 0) / 1000)
    return "none"


def compared(lesson: Lesson) -> tuple[tuple[str, str], ...]:
    """(stage, its baseline) for each stage that teaches ``lesson`` against another, in catalogue order; the
    derived stages of the overload case ("shedding") and the cache case ("cache") against theirs."""
    derived = {Lesson.SHEDDING: [(bounded(STAGES[name]).name, name) for name in OVERLOADED],
               Lesson.CACHE: [(cached_name(name), name) for name in CACHED]}.get(lesson, [])
    return tuple((s.name, s.baseline) for s in CATALOGUE if s.lesson == lesson and s.baseline) + tuple(derived)


def with_cache(stage: Stage, cache_url: str = "") -> Stage:
    """``stage`` with a response cache, named ``<stage>-cache``: Triton's own (``response_cache``), or the Redis at
    ``cache_url`` in front of a FastAPI stage (``CACHE_URL``). Not in the catalogue: its numbers depend on how often
    photos repeat, so it is measured with a skewed mix of photos against ``stage`` itself."""
    if isinstance(stage.part, TritonPart):
        model = stage.triton.model
        changes = {**stage.triton.changes,
                   model: {**stage.triton.changes.get(model, {}), "response_cache": {"enable": True}}}
        part: Part = replace(stage.triton, changes=changes)
        about = f"{stage.about}, with Triton's response cache"
    elif isinstance(stage.part, FastAPIPart) and cache_url:
        part = replace(stage.fastapi, env={**stage.fastapi.env, "CACHE_URL": cache_url})
        about = f"{stage.about}, with a Redis response cache in front"
    else:
        raise ValueError(f"{stage.name}: a response cache is Triton's own, or Redis in front of a FastAPI stage "
                         "(give its URL)")
    return replace(stage, name=cached_name(stage.name), about=about, part=part, lesson=Lesson.CACHE, baseline=stage.name,
                   default=False, tour=False, gpu_check=False)


def cached_name(name: str) -> str:
    return f"{name}-cache"


def get_stage(name: str, family: str | None = None) -> Stage:
    """The stage called ``name`` (of ``family``, when given), or a ValueError listing the names there are."""
    stages = of_family(family) if family else STAGES
    try:
        return stages[name]
    except KeyError:
        raise ValueError(f"unknown {family + ' ' if family else ''}stage {name!r}; stages: {', '.join(stages)}") from None
