"""A real tritonserver without Docker, and stage switching on any running Triton.

The ``nvidia-pytriton`` wheel bundles ``tritonserver`` (2.51) with the Python backend only; ``install`` copies it to a
writable cache with the backend stub built for this Python. The stub embeds ``libpython3.X.so``, found through
``LD_LIBRARY_PATH`` (``server_env``: so a shared pyenv/uv Python needs no system libpython). ``PYTHONPATH`` is the
checkout root only: no folder named ``triton`` may be on ``sys.path`` (torch would take it for OpenAI Triton).

The server reads the configs ``configs`` writes (``--model-config-name=stage``), so ``apply_stage`` switches
any running Triton (this one or the lab's container) through the model-control API; no image is rebuilt. Every
server runs with auto-complete off, and ``check_running`` reads back what each load made Triton run.

A new version rolls out while serving (``stage_version``, then ``roll_out_version``; docs/production.md): under Triton's
default ``version_policy`` (``latest { num_versions: 1 }``) one load serves the new version beside the old, which
unloads once its requests have answered. Measured on the bundled 2.51 (Python backend, 2 CPUs, 16 senders): a load with
a config override (``specific: { versions: [1, 2] }``, then ``[2]``) loads *every* version again, the one serving too;
and a load over HTTP stalled every HTTP inference for as long as it ran (about 4 s; Triton issues #8117, #8958: the load
blocks its HTTP worker thread), where the same load over gRPC cost none.

Each Python-backend stub shares a segment of /dev/shm (10-16 MB) with tritonserver, which unlinks it as it unloads
the model, or the stub does where tritonserver died first; a SIGKILL of both leaves it. So each server started here
names its stubs' segments (``SHM_PREFIX`` and a name of its own) and its stop removes what is left of them. Its exit
timeout is Triton's default, 30 s: 5 s made it exit with the eight stubs of pt-4x4 still loaded, on 2 CPUs.

Model control (load, unload, the repository index) answers only requests carrying the server's key in an ``admin-token``
header (Triton's ``--http-restricted-api``, ``--grpc-restricted-protocol``: ``control_flags``; docs/security.md): the
node's ADMIN_TOKEN, or for a server started here without one a new key, which ``control_key`` finds again.
"""

import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from servelab.core import procs
from servelab.core.artifacts import ArtifactPaths, copy_atomic
from servelab.core.catalogue import MODELS
from servelab.core.paths import REPO_ROOT
from servelab.core.procs import DIRECT, ServerProcess, free_port, wait_http_ok, wait_until
from servelab.core.settings import get_settings
from servelab.core.variants.build import variant_path
from servelab.servers.triton.client import server_address
from servelab.servers.triton.configs import (
    CONFIG_NAME,
    STAGES,
    Kind,
    Stage,
    differences,
    meant,
    resolve_kind,
    served,
    write_effective,
)

CACHE_DIR = REPO_ROOT / ".servelab"
INSTALL_DIR = CACHE_DIR / "tritonserver"
STATE_FILE = CACHE_DIR / "tritonserver-up.json"
# Loading many PyTorch instances on a small CPU takes a while; the load call blocks until done.
LOAD_TIMEOUT_S = 600.0
# Triton's own exit timeout, which every server started here keeps (see the module docstring).
EXIT_TIMEOUT_S = 30
# Every model any stage loads, dependencies first (reversed, it is a safe unload order).
ALL_MODELS = tuple(dict.fromkeys(m for stage in STAGES.values() for m in stage.triton.models))
# Triton's name for a stub's segment in /dev/shm; a server started here adds a name of its own.
SHM_PREFIX = "triton_python_backend_shm_region_"
# The header that carries the model-control key; gRPC prefixes it (Triton's "Limit Endpoint Access").
CONTROL_HEADER = "admin-token"
GRPC_CONTROL_HEADER = f"triton-grpc-protocol-{CONTROL_HEADER}"
# The keys of the servers this process started (host:port -> key), for the calls that name only a URL.
_started_keys: dict[str, str] = {}


def wheel_dirs() -> tuple[Path, Path]:
    """(the wheel's tritonserver folder, its shared libraries), found without importing pytriton."""
    if (spec := importlib.util.find_spec("pytriton")) is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed (pip install 'servelab[triton]')")
    package = Path(spec.submodule_search_locations[0])
    return package / "tritonserver", package.parent / "nvidia_pytriton.libs"


def install(dest: Path = INSTALL_DIR) -> Path:
    """A writable copy of the bundled server with this Python's backend stub (made once, then reused)."""
    server, _ = wheel_dirs()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    stamp = f"nvidia-pytriton {importlib.metadata.version('nvidia-pytriton')}, python {python}\n"
    if (marker := dest / ".servelab-install").exists() and marker.read_text() == stamp:
        return dest
    if not (stub := server / "python_backend_stubs" / python / "triton_python_backend_stub").exists():
        raise RuntimeError(f"the bundled tritonserver has no Python backend stub for Python {python}")
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(server, tmp, ignore=shutil.ignore_patterns("python_backend_stubs", "__pycache__"))
    shutil.copy2(stub, tmp / "backends" / "python" / stub.name)
    (tmp / marker.name).write_text(stamp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def server_env() -> dict[str, str]:
    _, libs = wheel_dirs()
    library_path = [str(libs), sysconfig.get_config_var("LIBDIR") or "", os.environ.get("LD_LIBRARY_PATH", "")]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in library_path if p),
            "PATH": os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", "")]),
            "PYTHONPATH": str(REPO_ROOT)}


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def pick(cls, http: int = 0, grpc: int = 0, metrics: int = 0) -> "Ports":  # 0: a free one
        return cls(http or free_port(), grpc or free_port(), metrics or free_port())


def control_flags(key: str) -> list[str]:
    """Model control only for requests that carry ``key``. tritonserver 2.51's ``--help`` spells the flag
    ``<apis>,<key>=<value>`` but refuses that: it takes ``<apis>:<key>=<value>``, as Triton's docs say."""
    if not key:
        raise ValueError("Triton's model control needs a key (ADMIN_TOKEN); none was given")
    return [f"--http-restricted-api=model-repository:{CONTROL_HEADER}={key}",
            f"--grpc-restricted-protocol=model-repository:{CONTROL_HEADER}={key}"]


def control_key(url: str) -> str:
    """The key the Triton at ``url`` asks model control for: the one this process started it with, else the one
    `servelab triton up` saved for it, else ADMIN_TOKEN (on the node, Jupyter's environment holds it)."""
    if (address := server_address(url)) in _started_keys:
        return _started_keys[address]
    if (saved := load_state()) is not None and server_address(saved["url"]) == address:
        return saved.get("key", "")
    return get_settings().admin_token


def control_headers(url: str, protocol: Literal["http", "grpc"] = "http") -> dict[str, str]:
    """As tritonclient's ``load_model(..., headers=)`` takes it."""
    return {CONTROL_HEADER if protocol == "http" else GRPC_CONTROL_HEADER: control_key(url)}


def cache_flags(install_dir: Path, size_bytes: int) -> list[str]:
    """Triton's local response cache (TRITON_CACHE_BYTES), in server memory, from the wheel's ``caches/local``
    (Triton looks in /opt/tritonserver/caches unless told). It costs nothing until a model's config says
    ``response_cache { enable: true }``, and a model that says so fails to load on a server without one."""
    if not size_bytes:
        return []
    return [f"--cache-directory={install_dir / 'caches'}", f"--cache-config=local,size={size_bytes}"]


@dataclass
class LocalTriton(AbstractContextManager):
    """A tritonserver we started; ``url`` is ``host:port`` as tritonclient wants it."""

    process: ServerProcess
    ports: Ports
    stage: str
    kind: Kind
    onnxruntime: bool
    repository: Path
    key: str  # what model control asks for (``control_flags``)
    shm_prefix: str  # its stubs' segments in /dev/shm
    running: dict[str, dict[str, Any]] = field(default_factory=dict)  # ``check_running``'s, after each load

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    def apply_stage(self, stage: Stage) -> dict[str, Any]:
        """``apply_stage``, but not for the stage it serves already (a load reloads a loaded model); either way
        what Triton runs is read back and checked (``check_running``)."""
        if stage.name != self.stage:
            apply_stage(self.url, stage, kind=self.kind, onnxruntime=self.onnxruntime, repository=self.repository,
                        check=False)
            self.stage = stage.name
        self.running = check_running(self.url, stage, kind=self.kind, onnxruntime=self.onnxruntime,
                                     repository=self.repository)
        return model_config(self.url, stage.triton.model)

    def stop(self) -> None:
        self.process.stop()
        remove_segments(self.shm_prefix)
        _started_keys.pop(self.url, None)

    def __exit__(self, *exc) -> None:
        self.stop()


def start_local(stage: Stage, *, repository: Path, ports: Ports | None = None, kind: str = "auto",
                log: Path | None = None, detach: bool = False, key: str = "") -> LocalTriton:
    """The bundled tritonserver, its ``stage``'s model READY. Model control asks for ``key`` (default:
    ADMIN_TOKEN, else a new key for this server)."""
    key = key or get_settings().admin_token or secrets.token_urlsafe(24)
    install_dir = install()
    ports = ports or Ports.pick()
    resolved = resolve_kind(kind)
    onnxruntime = (install_dir / "backends" / "onnxruntime").is_dir()
    write_effective(stage, kind=resolved, onnxruntime=onnxruntime, repository=repository)
    shm_prefix = f"{SHM_PREFIX}servelab_{secrets.token_hex(4)}_"
    cmd = [
        str(install_dir / "bin" / "tritonserver"),
        f"--model-repository={Path(repository).resolve()}", f"--backend-directory={install_dir / 'backends'}",
        "--model-control-mode=explicit", *(f"--load-model={m}" for m in stage.triton.models),
        f"--model-config-name={CONFIG_NAME}",
        # The stage's config is the one Triton runs: auto-complete would add a default dynamic batcher to an ONNX
        # Runtime model that names no scheduler (onnx-1), behind the lesson's back. check_running holds it.
        "--disable-auto-complete-config",
        "--http-address=127.0.0.1", f"--http-port={ports.http}",
        "--grpc-address=127.0.0.1", f"--grpc-port={ports.grpc}",
        "--metrics-address=127.0.0.1", f"--metrics-port={ports.metrics}",
        f"--allow-gpu-metrics={str(resolved == 'gpu').lower()}", f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        *control_flags(key), *cache_flags(install_dir, get_settings().triton_cache_bytes),
    ]
    process = ServerProcess(cmd, f"http://127.0.0.1:{ports.http}/v2/models/{stage.triton.model}/ready",
        log or CACHE_DIR / "logs" / f"tritonserver-{ports.http}.log", env=server_env(), cwd=REPO_ROOT,
        ready_timeout=LOAD_TIMEOUT_S, stop_timeout=EXIT_TIMEOUT_S + 15, detach=detach)
    local = LocalTriton(process, ports, stage.name, resolved, onnxruntime, Path(repository), key, shm_prefix)
    try:  # tritonserver opens its metrics port after HTTP (~40 ms): ready means every endpoint answers
        process.start()
        wait_http_ok(f"http://127.0.0.1:{ports.metrics}/metrics", 30.0, process.proc, process.log)
        local.running = check_running(local.url, stage, kind=resolved, onnxruntime=onnxruntime, repository=repository)
    except BaseException:
        local.stop()
        raise
    if not detach:  # a detached one (`servelab triton up`) outlives this process: its state file holds the key
        _started_keys[local.url] = key
    return local


def _call(url: str, method: str, path: str, body: dict | None = None, timeout: float = 30.0,
          key: str | None = None) -> Any:
    """Triton's error message becomes a RuntimeError; model control (``/v2/repository``) carries ``key``."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if path.startswith("/v2/repository"):
        headers |= control_headers(url) if key is None else {CONTROL_HEADER: key}
    request = urllib.request.Request(f"http://{server_address(url)}{path}", data=data, method=method, headers=headers)
    try:
        with DIRECT.open(request, timeout=timeout) as response:
            text = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        if exc.code == 403 and CONTROL_HEADER in detail:
            detail += " (its model-control key: the node's ADMIN_TOKEN, from `servelab secrets`)"
        raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
    return json.loads(text) if text else None


def repository_index(url: str, ready: bool = False, timeout: float = 30.0, key: str | None = None) -> list[dict]:
    return _call(url, "POST", "/v2/repository/index", {"ready": True} if ready else {}, timeout, key)


def apply_stage(url: str, stage: Stage, *, kind: Kind, onnxruntime: bool, repository: Path,
                timeout_s: float = LOAD_TIMEOUT_S, key: str | None = None, check: bool = True) -> dict[str, Any]:
    """Make a running Triton serve ``stage``; returns the config it reports, once ``check_running`` (unless ``check`` is
    False) found it the stage's. Models the stage does not use unload first (they would hold memory and compete for
    cores); a loaded model reloads with the new config while in-flight requests finish on the old instances."""
    index = repository_index(url, ready=True, key=key)  # fails early if unreachable, or with no key
    write_effective(stage, kind=kind, onnxruntime=onnxruntime, repository=repository)
    loaded = {entry["name"] for entry in index if entry.get("state") == "READY"}
    unload = [m for m in reversed(ALL_MODELS) if m in loaded and m not in stage.triton.models]
    for model in unload:
        _call(url, "POST", f"/v2/repository/models/{model}/unload", {}, timeout_s, key)
    if unload:  # unload returns at once: the instances go first, so they take no CPU or GPU from the next stage
        wait_until(lambda: not any(e["name"] in unload and e.get("state") in ("READY", "UNLOADING")
                                   for e in repository_index(url, key=key)), f"unloaded {', '.join(unload)}", timeout_s)
    for model in stage.triton.models:
        _call(url, "POST", f"/v2/repository/models/{model}/load", {}, timeout_s, key)
    if check:
        check_running(url, stage, kind=kind, onnxruntime=onnxruntime, repository=repository)
    return model_config(url, stage.triton.model)


class ConfigDiffers(RuntimeError):
    """Triton runs a model of a stage with another config than the stage's: it is never measured as that stage."""


def check_running(url: str, stage: Stage, *, kind: Kind, onnxruntime: bool, repository: Path) -> dict[str, dict]:
    """What Triton runs for each model of ``stage`` (``served``, from the config it reports after the load);
    ConfigDiffers naming each field where that is not the catalogue's stage as rendered for this server: a
    batcher where none is meant, another instance count, another batch bound, no warm-up, a cache."""
    wanted = meant(stage, kind=kind, onnxruntime=onnxruntime, repository=repository)
    running = {model: served(model_config(url, model)) for model in wanted}
    if found := [f"{model}: {said}" for model in wanted for said in differences(wanted[model], running[model])]:
        raise ConfigDiffers(f"Triton does not run stage {stage.name} as its config says, so nothing is measured "
                            f"as {stage.name}: " + "; ".join(found))
    return running


def stage_version(repository: Path, model: str, version: int, model_dir: Path) -> Path:
    """Make ``<repository>/<model>/<version>/`` from a folder laid out as MODEL_DIR (``servelab models build``
    writes one): the model's code from its version 1 folder and its artifacts, as ``artifacts`` stages
    version 1. Triton reads it only when a load names it (explicit model control)."""
    entry, paths = MODELS[model], ArtifactPaths.in_dir(model_dir)
    source, dest = Path(repository) / model / "1", Path(repository) / model / str(version)
    files = [(code, dest / code.name) for code in source.glob("*.py")]
    files += [(getattr(paths, name), dest / getattr(paths, name).name) for name in entry.files]
    if entry.variant:
        files.append((variant_path(model_dir, entry.variant), dest / "model.onnx"))
    if missing := [src for src, _ in files if not src.exists()]:
        raise FileNotFoundError(f"cannot stage {model} version {version}: no {missing[0]}")
    dest.mkdir(exist_ok=True)
    for src, target in files:
        copy_atomic(src, target)
    return dest


def model_versions(url: str, model: str, states: tuple[str, ...] = ("READY",)) -> list[int]:
    """``model``'s versions in ``states`` (READY; UNLOADING while requests drain)."""
    return sorted(int(e["version"]) for e in repository_index(url) if e["name"] == model and e.get("state") in states)


def roll_out_version(url: str, grpc_url: str, model: str, version: int, timeout_s: float = LOAD_TIMEOUT_S,
             since: float | None = None) -> dict[str, Any]:
    """Serve ``version`` of ``model`` (``stage_version``) instead of the one serving, with no request refused:
    one load over gRPC (the module docstring says why), then a wait until the old versions are gone. Returns
    the versions before and the seconds from ``since`` (``time.monotonic()``: when a caller in another thread
    triggered it; default this call) until the load returned (``ready_s``) and the old ones were unloaded."""
    import tritonclient.grpc as grpcclient  # deferred: an optional extra (bench), loaded only when this runs

    started = time.monotonic() if since is None else since
    policy = model_config(url, model).get("version_policy", {})
    if policy.get("latest", {}).get("num_versions", 1) != 1 or set(policy) - {"latest"}:
        raise ValueError(f"{model}: version_policy {policy} would not swap versions on a load; roll_out_version needs "
                         "latest { num_versions: 1 } (Triton's default)")
    old = [v for v in model_versions(url, model) if v != version]
    with grpcclient.InferenceServerClient(grpc_url) as client:
        client.load_model(model, headers=control_headers(url, "grpc"), client_timeout=timeout_s)
    ready_s = time.monotonic() - started
    if (serving := model_versions(url, model)) and max(serving) != version:
        raise RuntimeError(f"{model}: serving versions {serving} after the load, not {version}: is it staged?")
    only_version(url, model, version, started + timeout_s)
    return {"model": model, "version": version, "previous_versions": old, "ready_s": round(ready_s, 3),
            "old_unloaded_s": round(time.monotonic() - started, 3)}


def only_version(url: str, model: str, version: int, deadline: float) -> None:
    """Wait (until ``deadline``, monotonic) until ``version`` is the one version of ``model`` the server holds,
    loaded or unloading: an old version unloads once its requests finish, its series in /metrics with it."""
    while (held := model_versions(url, model, ("READY", "UNLOADING"))) != [version]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{model}: versions {held} still loaded; waiting for {version} alone")
        time.sleep(0.05)


def model_config(url: str, model: str) -> dict[str, Any]:
    return _call(url, "GET", f"/v2/models/{model}/config")


# --- the server `servelab triton up` leaves running, stopped by `servelab triton down` ---

def state_of(server: LocalTriton) -> dict[str, Any]:
    """What `down` needs to stop the server, and `stage` to render for it and switch it (its key)."""
    return {"pids": [server.process.pid], "url": server.url, "key": server.key, "shm_prefix": server.shm_prefix,
            "ports": asdict(server.ports), "stage": server.stage, "kind": server.kind, "onnxruntime": server.onnxruntime,
            "repository": str(server.repository), "log": str(server.process.log)}


def save_state(state: dict[str, Any]) -> None:
    procs.save_state(STATE_FILE, state)


@dataclass(frozen=True)
class SwitchTarget:
    """A running Triton as `servelab triton stage` switches it; ``saved``: `up`'s state, if it started it."""

    url: str
    kind: Kind
    onnxruntime: bool
    repository: Path
    saved: dict[str, Any] | None


def switch_target(url: str | None = None, kind: str | None = None) -> SwitchTarget:
    """The server at ``url`` (default: the one `up` started, else ``TRITON_SERVER_URL``) as `stage` sees it."""
    settings = get_settings()
    running = load_state()
    url = server_address(url or (running["url"] if running else settings.triton_server_url))
    ours = running if running is not None and running["url"] == url else None
    kind = resolve_kind(kind or (ours["kind"] if ours else settings.triton_instance_kind))
    # The server `up` started lacks the onnxruntime backend, and so does a Triton on the stand-in base.
    onnxruntime = ours["onnxruntime"] if ours else settings.triton_onnxruntime
    repository = Path(ours["repository"]) if ours else settings.triton_model_repository
    return SwitchTarget(url, kind, onnxruntime, repository, ours)


def load_state() -> dict[str, Any] | None:
    return procs.load_state(STATE_FILE)


def stop_saved() -> dict[str, Any] | None:
    """Stop the server `up` started (its process group, its segments in /dev/shm)."""
    if state := procs.stop_saved(STATE_FILE, EXIT_TIMEOUT_S + 15):
        remove_segments(state["shm_prefix"])
    return state


def remove_segments(prefix: str) -> None:
    """Remove what a SIGKILL left in /dev/shm of an ended server's stubs, which named their segments ``prefix...``."""
    for segment in Path("/dev/shm").glob(f"{prefix}*") if prefix else ():
        segment.unlink(missing_ok=True)
