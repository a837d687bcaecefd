"""Every environment variable servelab reads, in one place, one settings class per role, the same in containers
and local runs; docs/configuration.md's table is generated from the descriptions (``python -m
servelab.core.settings``), and a test keeps the two in sync."""

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from servelab.core.paths import REPO_ROOT
from servelab.core.preprocess import DEFAULT_MAX_PIXELS
from servelab.core.tables import markdown

OnnxVariant = Literal["fp32", "u8", "int8", "int8dyn", "fp16"]


class _Env(BaseSettings):
    # Variable names are the field names in upper case; no prefix, to keep the lab's names.
    # An empty variable (compose passing an unset shell variable through) means "use the default".
    # The settings below are data, one `Field` a line: runs of them share a shape (`duplicates` pairs them), not logic.
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", env_ignore_empty=True)


class ModelSettings(_Env):
    """Model artifacts (every stage)."""

    model_dir: Path = Field(REPO_ROOT / "models", description="Folder with food11.pt, food11.json and food11.onnx (`servelab models build` writes them).")


class ServeSettings(_Env):
    """The FastAPI services (fastapi_pt, fastapi_onnx)."""

    host: str = Field("127.0.0.1", description="Address the service binds to (`0.0.0.0` inside a container).")
    port: int = Field(8000, description="Port of the FastAPI service.")
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field("auto", description="`servelab serve`: server processes sharing the port, each with its own event loop and share of the CPUs (`servelab.servers.fastapi.workers`); `auto` = one per CPU (one process's event loop and GIL would carry every request's HTTP, JSON and base64), at most 8, each on its share of the CPUs (a bound that a big machine does not lift to dozens of interpreters, each with its memory and its connection to a batcher), but 1 where the model runs on a GPU with `SHARED_BATCHER=0`. `/ready`, `/metrics` and `POST /admin/reload` span the processes. `uvicorn fastapi_onnx.app:app` is one process whatever this says.")
    shared_batcher: bool | Literal["auto"] = Field("auto", description="With several server processes: one batcher process holds the model and batches every process's requests, which reach it through shared memory (`servelab.servers.fastapi.shared`); off, each server process loads its own model and batches its own requests. `auto` = on where the model runs on a GPU (one CUDA context, batches as full as behind one process), off on the CPU (batching does not pay there; each process infers on its own cores).")
    batchers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field("auto", description="With `SHARED_BATCHER`: batcher processes, each holding the model, the server processes spread evenly over them; where the model runs on a GPU each has one of the visible GPUs (`CUDA_VISIBLE_DEVICES`, all of `nvidia-smi`'s where unset) as its own, in turn. `auto` = one per visible GPU, 1 on the CPU.")
    max_image_pixels: int = Field(DEFAULT_MAX_PIXELS, description="Images whose header declares more pixels are refused (413) before decoding.")
    max_body_bytes: int = Field(10 * 1024 * 1024, gt=0, description="Largest request body in bytes; a larger one is refused (413) while it is being read.")
    max_request_images: int = Field(16, ge=1, description="Most images in one `POST /predict/batch` request (more: 413).")
    max_batch_size: int = Field(16, ge=1, description="Server-side dynamic batching: most images stacked from concurrent requests into one inference; 1 = off (one request per inference). With the default `BATCH_TIMEOUT_MS` of 0, a batch is what already waits while every instance is busy: no request waits for one.")
    batch_timeout_ms: float = Field(0.0, ge=0, description="With batching on, how long the oldest waiting request may wait for others to fill a batch; 0 = not at all (a batch forms only from requests queued behind busy instances).")
    max_queue_requests: int = Field(0, ge=0, description="Load shedding: most prediction requests the service holds at once, from arrival to answer (waiting for a preprocessing worker or a batch, or being worked on), as Triton's `max_queue_size` bounds its queue; one more is refused at once with 503 and `Retry-After` (body `shed: queue_full`), so the requests it accepts wait boundedly; the bound is the service's, over all its server processes (`WORKERS`). 0 = unbounded (the default: every earlier measurement ran unbounded, and under overload that shows where the queue forms).")
    shed_hold_ms: float = Field(1000.0, ge=0, description="Load shedding: how long a request refused for `MAX_QUEUE_REQUESTS` waits before its 503 is sent, by default as long as the `Retry-After` it carries (no CPU is spent meanwhile; at most 1,024 at once per server process). A client that ignores `Retry-After` and sends again at once would otherwise make refusals as fast as the service can answer them, on CPU the accepted requests need (`benchmarks/retry_storm.py`); 0 = answer at once.")
    max_queue_delay_ms: float = Field(0, ge=0, description="Load shedding: a request that has waited this long in the batcher's queue when its inference would start is refused with 503 and `Retry-After` (body `shed: queue_timeout`) instead of being served late (Triton's `default_timeout_microseconds` with `timeout_action: REJECT`); 0 = no limit. Ray Serve stages do not apply it (their batch queue is Serve's own).")
    preprocess_processes: Annotated[int, Field(ge=0)] | Literal["auto"] = Field("auto", description="Worker processes that decode and preprocess images, so preprocessing scales over cores while the one model and its batcher stay in the server process; 0 = threads in the server process (`WORKER_THREADS`); `auto` = the CPUs but one when the model runs on a GPU, 0 when it runs on the CPU (the model needs those cores).")
    worker_threads: int = Field(0, ge=0, description="With `PREPROCESS_PROCESSES=0`: threads that decode and preprocess images off the event loop; 0 = one per CPU (on the CPU they share the cores with the inferences).")
    model_instances: int = Field(0, ge=0, description="Inferences that may run at once, each in its own thread on `INTRA_OP_THREADS` threads (Triton's instance count); 0 = two per CPU's worth of `INTRA_OP_THREADS` when the model runs on the CPU (while one waits, the other runs), 1 on a GPU.")
    intra_op_threads: int = Field(0, ge=0, description="Threads one inference may use (PyTorch `set_num_threads`, ONNX Runtime `intra_op_num_threads`); 0 = the CPUs divided by `MODEL_INSTANCES` (left at 0: one thread per inference, where an image costs the least CPU time), at least 1.")
    inter_op_threads: int = Field(1, ge=1, description="PyTorch inter-op threads and ONNX Runtime `inter_op_num_threads` (used by the parallel execution mode).")
    simulated_gpu_ms: float = Field(0.0, ge=0, description="A GPU-shaped stand-in on the CPU (`servelab.core.simulated_gpu`), so that batching is proven before a GPU: every inference of the FastAPI services and of Triton's local ONNX stand-in costs this many ms whatever its batch size, up to the largest batch, one batch at a time on the machine, with the model's own answers; named in the logs, `/ready` and the run records. 0 = off (the model's real cost).")
    # The names of servelab.core.variants.build.VARIANTS (a test keeps them equal; that module is not
    # imported here, so reading settings stays light).
    onnx_variant: OnnxVariant = Field("fp32", description="fastapi_onnx: which ONNX model in `MODEL_DIR` it serves: `fp32` (food11.onnx, float32 input preprocessed by the service), `u8` (the same model with normalization in its graph: the service sends the uint8 crop), `int8` (static INT8, uint8 input), `int8dyn` (dynamic INT8, uint8 input) or `fp16` (GPU only: refuses to start on the CPU).")
    ort_providers: str = Field("auto", description="ONNX Runtime execution providers in order of preference, comma-separated (`tensorrt`, `cuda`, `cpu` or full names); `auto` = TensorRT, CUDA, CPU, those this onnxruntime build has, TensorRT only where its libraries load (elsewhere ONNX Runtime would fail the session and retry it without any provider's options; `/ready`'s warnings say why it was left out, as they do for a named provider left out). `/ready` and every record show the options each active provider really runs with (`provider_options`, read back from the session).")
    ort_execution_mode: Literal["sequential", "parallel"] = Field("sequential", description="ONNX Runtime execution mode (`parallel` runs independent graph branches at once).")
    ort_graph_optimization: Literal["disable", "basic", "extended", "all"] = Field("all", description="ONNX Runtime graph optimization level (`all` = ORT_ENABLE_ALL).")
    ort_shape_policy: Literal["auto", "off", "buckets", "pad"] = Field("auto", description="Input shapes each ONNX Runtime session sees (FastAPI, Ray Serve and Triton's local ONNX stand-in): `buckets` = one session per power-of-two batch size up to the largest batch the server can get (`MAX_BATCH_SIZE`/`MAX_REQUEST_IMAGES`; Triton: the config's `max_batch_size`), each batch zero-padded up to its bucket and every bucket run once before the server is ready; `pad` = one session, every batch padded to that largest size; `off` = one session, batches as they come; `auto` = buckets where a GPU provider (CUDA/TensorRT) is active, off on the CPU, where a change of shape costs nothing measurable. On an H100 with ONNX Runtime 1.31 every run whose shape differed from the session's previous run paid a cuDNN search again, far more than the inference; buckets or padding removed it (docs/records/gpu-h100-2026-11-24.toml). Padded rows never reach a response.")
    ort_cudnn_conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = Field("HEURISTIC", description="ONNX Runtime CUDA provider option `cudnn_conv_algo_search` (also the Triton ONNX Runtime backend's parameter on the lab node): how cuDNN picks convolution algorithms for a new shape. On an H100 a change of shape cost most with `EXHAUSTIVE` (ONNX Runtime's default), least with `HEURISTIC`, and `DEFAULT` ran every convolution in a slow fallback mode (docs/records/gpu-h100-2026-11-24.toml); stable shapes (`ORT_SHAPE_POLICY`) avoid the cost, HEURISTIC keeps warm-up short.")
    ort_allow_spinning: bool = Field(False, description="Let idle ONNX Runtime intra-op threads spin; off, so they do not take CPU from the preprocessing workers.")
    trt_fp16: bool = Field(True, description="TensorRT: allow float16 kernels (`trt_fp16_enable`).")
    trt_engine_cache: bool = Field(True, description="TensorRT: cache built engines on disk, so a restart skips the minutes-long build (`trt_engine_cache_enable`).")
    trt_cache_path: Path = Field(Path("~/.cache/servelab/tensorrt"), description="TensorRT: folder for the engine and timing caches (mount a volume here in a container).")
    trt_timing_cache: bool = Field(True, description="TensorRT: keep kernel timing results, so rebuilds are faster (`trt_timing_cache_enable`).")
    trt_max_workspace_bytes: int = Field(2 * 1024**3, gt=0, description="TensorRT: GPU memory the builder may use to try kernels (`trt_max_workspace_size`).")
    trt_builder_optimization_level: int = Field(3, ge=0, le=5, description="TensorRT: builder optimization level, 0 (fast build) to 5 (slow build, fastest engine).")
    require_gpu: bool = Field(False, description="Refuse to start unless the model really runs on a GPU (CUDA device, or an active TensorRT/CUDA execution provider) and, for ONNX Runtime, each active provider runs with the options asked of it (`ORT_CUDNN_CONV_ALGO_SEARCH`, the `TRT_*` settings); without it a provider option not in force is a warning in `/ready`.")
    torch_device: str = Field("auto", description="PyTorch device: `auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`.")
    torch_fp16: bool = Field(False, description="PyTorch: run the model in float16 (CUDA only; ignored on the CPU).")
    admin_token: str = Field("", description="Bearer token that `POST /admin/*` (model reloads) requires, compared in constant time; empty = the admin routes answer 404 and are left out of `/docs`. Also the key of Triton's model control (the `admin-token` header its `--http-restricted-api` and `--grpc-restricted-protocol` ask for, `servelab.servers.triton.server.control_headers`). `servelab lab` and `servelab triton up` make a new one for every server they start where none is set; on the node `servelab secrets` writes one into `.secrets/lab.env` (docs/security.md).")
    model_root: Path | None = Field(None, description="`POST /admin/reload` loads only a `model_dir` that resolves (symlinks and `..` followed) inside this folder; anything else is 403 and nothing is loaded. Unset = the folder that holds `MODEL_DIR`.")
    access_log: bool = Field(True, description="`servelab serve`: log every request (uvicorn's access log).")
    cache_url: str = Field("", description="Response cache in front of `POST /predict`: a Redis URL (`redis://127.0.0.1:6379/0`); empty = no cache. The key is the sha256 of the decoded image bytes and the model's version (service, manifest sha256, variant, device), the value the prediction's JSON; each response says `X-Cache: hit` or `miss`. A Redis that does not answer never fails a request: it is logged once, counted, and the model answers.")
    cache_ttl_s: float = Field(600.0, gt=0, description="How long a cached answer lives in Redis (its `EX`), in seconds.")


class FlaskSettings(_Env):
    """The GourmetGram web front end (flask_app)."""

    backend: Literal["fastapi", "triton", "triton_onnx", "triton_ensemble"] = Field("fastapi", description="Which service classifies the photos: `fastapi` (POST /predict), `triton` (food_classifier, image bytes), `triton_onnx` (food_classifier_onnx; pre- and post-processing in the app) or `triton_ensemble` (food_classifier_ensemble, image bytes).")
    fastapi_server_url: str = Field("http://127.0.0.1:8000", description="Base URL of the FastAPI service (BACKEND=fastapi).")
    triton_server_url: str = Field("127.0.0.1:8000", description="Triton's HTTP endpoint as host:port, without a scheme (the triton* backends).")
    food11_model_name: str = Field("", description="Triton model to call; empty: food_classifier, food_classifier_onnx or food_classifier_ensemble, by BACKEND.")
    canary_url: str = Field("", description="A second backend of the same kind (`BACKEND`) serving the new model version: a FastAPI service's base URL, or Triton's host:port. It gets `CANARY_SHARE` of the predictions; empty: none.")
    canary_share: float = Field(0.0, ge=0, le=1, description="The share of predictions sent to `CANARY_URL` (0.1: one in ten), chosen per request by a hash of `CANARY_SEED` and the request's number, so a run's split is reproducible. `GET /metrics` counts them by route (stable, canary) and the model version that answered.")
    canary_seed: int = Field(0, description="Seed of the canary's choice of requests (`CANARY_SHARE`).")
    backend_timeout: float = Field(10.0, gt=0, description="Seconds the app waits to connect to the backend and for each read of its answer; past it the page says so (504).")
    max_upload_bytes: int = Field(7 * 1024 * 1024, gt=0, description="Largest accepted upload in bytes; larger ones are refused (413). In base64 a photo grows by a third: 7 MiB still fits the FastAPI service's `MAX_BODY_BYTES`.")


class TritonSettings(_Env):
    """Triton Inference Server stages (`servelab triton`, the Python-backend models)."""

    triton_model_repository: Path = Field(REPO_ROOT / "models_staging", description="Triton's model repository; `servelab triton stage` writes each model's effective config to `<model>/configs/stage.pbtxt` there (on the lab node: the folder mounted into the Triton container).")
    triton_instance_kind: Literal["auto", "gpu", "cpu"] = Field("auto", description="Render stages with `KIND_GPU` or `KIND_CPU` instance groups; `auto` = gpu where `nvidia-smi` lists a GPU (set `gpu` where servelab runs without GPU access but drives a GPU server). A server started by `servelab triton up` keeps the kind it was started with; `servelab lab` takes the kind from its device (`LAB_DEVICE`).")
    triton_onnxruntime: bool = Field(True, description="Whether the Triton that `servelab triton stage` switches has the onnxruntime backend, as NVIDIA's images do; false (a Triton on the stand-in base, docker/standin/): the ONNX stages are rendered as the LOCAL STAND-IN and say so. A server started by `servelab triton up` knows its own.")
    triton_cache_bytes: int = Field(64 * 1024**2, ge=0, description="The local tritonserver's response cache (`--cache-config local,size=N`), in bytes; only models whose config says `response_cache { enable: true }` use it; 0 = started without one.")
    triton_threads_per_instance: int = Field(0, ge=0, description="CPU threads per Python-backend model instance (PyTorch `set_num_threads`, ONNX Runtime intra-op threads); 0 = the CPUs but one, divided by the model's instance count, at least 1.")


class RaySettings(_Env):
    """Ray Serve stages (`servelab ray`)."""

    ray_address: str = Field("", description="Ray cluster to join and deploy to, as `HOST:PORT` of its head (GCS); empty = `servelab ray up` / `servelab lab` start a local one (a head and worker nodes on 127.0.0.1).")
    ray_serve_host: str = Field("127.0.0.1", description="Address Ray Serve's HTTP proxy binds to (`0.0.0.0` inside a container).")
    ray_serve_port: int = Field(8000, description="Port of Ray Serve's HTTP proxy (the same API as the FastAPI services).")
    ray_batch_max_size: int = Field(16, ge=1, description="`@serve.batch` stages (ray-dyn): most requests one replica stacks into one inference.")
    ray_batch_wait_ms: float = Field(5.0, ge=0, description="`@serve.batch` stages: how long the first waiting request may wait for others to fill a batch.")
    ray_autoscale_min_replicas: int = Field(1, ge=1, description="Autoscaling stage (ray-auto): fewest replicas.")
    ray_autoscale_max_replicas: int = Field(4, ge=1, description="Autoscaling stage (ray-auto): most replicas.")
    ray_autoscale_target_ongoing: float = Field(2.0, gt=0, description="Autoscaling stage (ray-auto): requests in flight per replica that Serve scales towards (`target_ongoing_requests`).")
    ray_autoscale_upscale_delay_s: float = Field(2.0, ge=0, description="Autoscaling stage: how long the load must call for more replicas before Serve adds them (Serve's default is 30 s).")
    ray_autoscale_downscale_delay_s: float = Field(5.0, ge=0, description="Autoscaling stage: how long the load must call for fewer replicas before Serve removes them (Serve's default is 600 s).")
    ray_replica_gpus: float = Field(0.0, ge=0, description="GPUs each replica asks Ray for (`num_gpus`): 0 = none (CPU nodes, the local lab); 1 on the GPU nodes, so Ray gives each replica a GPU of its own (its `CUDA_VISIBLE_DEVICES`) and ray-4 uses all four P100s; with a CPU worker in the cluster, 0.")
    ray_node_cpus: int = Field(2, ge=1, description="Local cluster: logical CPUs each node announces (replicas take 1 each); a CPU stand-in for a node's capacity, not real cores.")


class BenchSettings(_Env):
    """Measuring (`servelab load`, `servelab lab`, perf_analyzer)."""

    perf_analyzer: str = Field("", description="perf_analyzer binary to run; empty = the project's copy (`make perf-analyzer` extracts it into the environment), else `perf_analyzer` on PATH (NVIDIA's Triton SDK image).")
    lab_device: Literal["auto", "cpu", "gpu"] = Field("auto", description="`servelab lab` (`--device`): where every stage runs: `gpu` (PyTorch on CUDA, ONNX Runtime's TensorRT/CUDA providers, Triton `KIND_GPU`, each server started with `REQUIRE_GPU=1`; fails where `nvidia-smi` lists no GPU), `cpu`, or `auto` = gpu where `nvidia-smi` lists a GPU.")


class MonitoringSettings(_Env):
    """Prometheus in the local lab (`servelab lab`, `servelab prometheus`)."""

    prometheus: str = Field("", description="Prometheus binary to run; empty = the project's copy (`make prometheus` unpacks Debian's 2.42 into the environment), else `prometheus` on PATH. Without one the lab goes on unscraped and says so.")
    prometheus_scrape_interval_s: float = Field(0.5, gt=0, le=60, description="How often the lab's Prometheus scrapes each server; short, so a run of a few seconds holds several samples.")
    prometheus_retention_time: str = Field("2d", description="The lab's Prometheus keeps samples this long (`--storage.tsdb.retention.time`), in `<results>/prometheus/`.")
    prometheus_retention_size: str = Field("512MB", description="The lab's Prometheus keeps at most this much data (`--storage.tsdb.retention.size`); the oldest blocks go first.")


class ToolSettings(_Env):
    """Installing the external tools (`servelab perf-analyzer install`, `servelab prometheus install`, `servelab redis install`)."""

    redis_server: str = Field("", description="`redis-server` binary the lab and the tests start for the response cache; empty = the project's copy (`make redis` unpacks Debian's 7.0 into the environment), else `redis-server` on PATH. Without one the cache stage is skipped, saying so.")
    servelab_wheelhouse: Path | None = Field(None, description="Folder the tool installers take perf_analyzer's wheels and the `libb64-0d`, `prometheus`, `redis-tools`, `liblzf1` and `libjemalloc2` .debs from before trying the network (`make gpu-wheelhouse` fills one; `make gpu-check` sets it to that folder); empty = the network (pip's index, `apt-get download`).")


class ContainerSettings(_Env):
    """The local container runner (`servelab containers`)."""

    servelab_containers_cache: Path = Field(Path("~/.cache/servelab/containers"), description="Per-user cache of `servelab containers`, outside the checkout so a fresh clone reuses it: the Compose plugin, the debootstrap base image, the wheelhouse and the private Docker engine's data root with its layer cache.")


class Settings(ModelSettings, ServeSettings, FlaskSettings, TritonSettings, RaySettings, BenchSettings,
               MonitoringSettings, ToolSettings, ContainerSettings):
    """All settings together, for code that needs several roles."""


@lru_cache
def get_settings() -> Settings:
    return Settings()


SETTINGS_CLASSES: tuple[type[BaseSettings], ...] = Settings.__bases__  # each role's, in the table's order

CONFIGURATION_DOC = REPO_ROOT / "docs" / "configuration.md"
TABLE_BEGIN = "<!-- settings table: generated by `python -m servelab.core.settings` -->"
TABLE_END = "<!-- end of settings table -->"


def markdown_table() -> str:
    """The configuration table of docs/configuration.md: variable, default, used by, meaning."""
    rows = []
    for cls in SETTINGS_CLASSES:
        role = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
        for name, field in cls.model_fields.items():
            default = field.default
            if isinstance(default, Path) and default.is_relative_to(REPO_ROOT):
                default = f"<checkout>/{default.relative_to(REPO_ROOT)}"
            shown = f"`{default}`" if default != "" else "empty"  # "``" would pair with the next backtick
            rows.append((f"`{name.upper()}`", shown, role, field.description))
    return markdown(("variable", "default", "used by", "meaning"), rows)


def table_in(doc: str) -> str:
    """The generated text of ``doc``: what lies between the table's two markers."""
    return doc.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip("\n")


def with_table(doc: str) -> str:
    """``doc`` with the text between the table's markers replaced by the current table."""
    head, rest = doc.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_BEGIN}\n{markdown_table()}\n{TABLE_END}{tail}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--print"]:
        print(markdown_table())
    else:
        CONFIGURATION_DOC.write_text(with_table(CONFIGURATION_DOC.read_text()))
        print(f"{CONFIGURATION_DOC.relative_to(REPO_ROOT)}: settings table written (`--print` prints it instead)")
