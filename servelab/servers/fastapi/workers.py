"""Several server processes on one port: how ``servelab serve fastapi-onnx|fastapi-pt`` runs by default.

One process carries every request's HTTP, JSON and base64 on one event loop and one GIL: on 16 cores
without a GPU that turned 40 % of the machine's limit into answers (docs/gpu/nvidia-h200.md). So ``serve``
starts ``WORKERS`` copies of the app under uvicorn's supervisor (the parent binds the port and replaces a
child that dies), each on its share of the CPUs (``SHARE_ENV``, read by ``servelab.core.procs.cpu_count``).
With ``SHARED_BATCHER`` the children load no model (``servelab.servers.fastapi.shared``); each takes a place
(``claim``), and place i goes to batcher i modulo their number.

The children share a folder (``Siblings``), so the service still answers as one:

* a child takes connections only once warm (``warm_up_first``), so a restarted child never answers 503;
  ``/ready`` says 200 only while every child is warm;
* Prometheus figures add up over the children (multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR`` under the
  folder, set before any child starts);
* ``POST /admin/reload`` reaches one child: it swaps its own model (refusing one that cannot serve), writes
  it as the model every child loads as it starts (``want``), then sends SIGHUP to the supervisor
  (``restart``), which replaces the children one at a time, each replacement warm first. Nothing polls: a
  child reads the folder once, as it starts.

``uvicorn fastapi_onnx.app:app``, the app file students read, stays one process: none of this is set there.
"""

import json
import os
import signal
import sys
import tempfile
from contextlib import ExitStack
from functools import cache
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import multiprocess
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from servelab.core.artifacts import write_atomic
from servelab.core.hardware import gpu_count, visible_gpus
from servelab.core.procs import SHARE_ENV, cpu_count, take_place
from servelab.core.settings import ServeSettings

FOLDER_ENV, COUNT_ENV = "SERVELAB_WORKERS_DIR", "SERVELAB_WORKERS"
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when first imported
WANTED = "model.json"
# How long uvicorn waits for a replacement to load and warm its model before it keeps the old process; also how
# long its supervisor may wait on the health check of a process that died as it was asked (its one setting).
START_S = 60
# WORKERS=auto's most, whatever the machine's size: each process is an interpreter with its memory (and beside a
# batcher, its arena and connection); past 8, each just takes a larger share of the CPUs.
AUTO_WORKERS_MAX = 8


def on_gpu(settings: ServeSettings, runtime: str) -> bool:  # decided before any process loads the model
    asked_cpu = settings.ort_providers == "cpu" if runtime == "onnx" else settings.torch_device == "cpu"
    return not asked_cpu and gpu_count() > 0


def worker_count(settings: ServeSettings, runtime: str) -> int:
    """WORKERS, else one process per CPU, but one on a GPU without a shared batcher (each process would load a
    model of its own there)."""
    if settings.workers != "auto":
        return settings.workers
    return 1 if on_gpu(settings, runtime) and settings.shared_batcher is False else min(cpu_count(), AUTO_WORKERS_MAX)


def batcher_devices(settings: ServeSettings, runtime: str) -> list[str | None]:
    """Each batcher process's CUDA_VISIBLE_DEVICES: a visible GPU each, or None (the CPU) BATCHERS times."""
    gpus = visible_gpus() if on_gpu(settings, runtime) else []
    count = settings.batchers if settings.batchers != "auto" else max(1, len(gpus))
    return [gpus[i % len(gpus)] if gpus else None for i in range(count)]


@cache
def claim(folder: Path, count: int) -> int:
    """One of ``count`` places, kept while this process lives (a reload asks again: the same one): the server
    processes of a service hold different ones (``take_place``)."""
    fd = os.open(folder / "processes.places", os.O_RDWR | os.O_CREAT, 0o600)  # open for life: closing drops locks
    place = take_place(fd, count, set())
    return os.getpid() % count if place is None else place  # one more for a moment (a replacement): any will do


def shares_batcher(settings: ServeSettings, runtime: str, workers: int) -> bool:  # SHARED_BATCHER
    return workers > 1 and (on_gpu(settings, runtime) if settings.shared_batcher == "auto" else settings.shared_batcher)


def serve(app: str, settings: ServeSettings, runtime: str, host: str, port: int) -> None:
    workers = worker_count(settings, runtime)
    options = dict(host=host, port=port, access_log=settings.access_log, timeout_graceful_shutdown=10)
    if workers == 1:  # a reload swaps the model in this process (Service.reload): no supervisor to restart it
        uvicorn.run(app, **options)
        return
    share = max(1, cpu_count() // workers)
    with tempfile.TemporaryDirectory(prefix="servelab-workers-") as folder, ExitStack() as batcher:
        (Path(folder) / "metrics").mkdir()
        metrics = {METRICS_ENV: str(Path(folder) / "metrics")}
        # The children inherit these (uvicorn spawns them); this process imports no prometheus_client.
        children = {FOLDER_ENV: folder, COUNT_ENV: str(workers), SHARE_ENV: str(share), **metrics}
        shared = shares_batcher(settings, runtime, workers)
        devices = batcher_devices(settings, runtime) if shared else []
        if shared:
            # Deferred: the batcher's side of the service imports the model's (numpy, the pipeline).
            from servelab.servers.fastapi.shared import SOCKET_ENV, BatcherProcess, hello

            paths = [str(Path(folder) / f"batcher-{i}.sock") for i in range(len(devices))]
            for path, device in zip(paths, devices):  # every CPU is theirs; a GPU each where there are GPUs
                gpu = {} if device is None else {"CUDA_VISIBLE_DEVICES": device}
                batcher.enter_context(BatcherProcess(app, Path(path), {**os.environ, **metrics, **gpu}))
            try:  # the model loads and warms up there before any server process starts: a fatal problem ends here
                for path in paths:
                    hello(path, settings)[0].close()
            except Exception as exc:  # noqa: BLE001 - said in a line, as a server process's start would
                sys.exit(f"ERROR:    servelab: the batcher process cannot serve the model: {exc}")
            children[SOCKET_ENV] = os.pathsep.join(paths)
        os.environ.update(children)
        where = "on the CPU" if None in devices else f"on GPUs {','.join(devices)}"
        # uvicorn's logging is set up once it runs; this line goes before it, beside its own.
        print(f"INFO:     servelab: {workers} server processes on port {port}, {share} CPU(s) each "
              f"(WORKERS={settings.workers})" + (f", {len(devices)} batcher process(es) for the model {where} "
                                                  f"(SHARED_BATCHER={settings.shared_batcher})" if shared else ""),
              file=sys.stderr, flush=True)
        uvicorn.run(app, workers=workers, timeout_worker_healthcheck=START_S, http=Draining, **options)


class Draining(HttpToolsProtocol):
    """uvicorn's HTTP, but a stopping process closes no idle connection: uvicorn does at once (its issue #2757), so a
    request sent on one meanwhile is lost, though the other processes serve on. Here the next response on each says
    ``Connection: close``; one left idle closes at its keep-alive timeout, as it would have anyway."""

    stopping = False  # this process's server is stopping (one server a process)

    def shutdown(self) -> None:
        Draining.stopping = True
        if self.cycle is not None and not self.cycle.response_complete:  # unless its headers are out, they say close
            self.cycle.keep_alive = self.cycle.keep_alive and self.cycle.response_started
        elif self.timeout_keep_alive_task is None:  # accepted, nothing read yet: idle from now on
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        if Draining.stopping and self.cycle is not None:
            self.cycle.keep_alive = False


class Siblings:
    def __init__(self, folder: Path, expected: int):
        self.folder, self.expected, self.supervisor = folder, expected, os.getppid()  # uvicorn's, which started it

    @classmethod
    def here(cls) -> "Siblings | None":  # None: a process of its own
        folder = os.environ.get(FOLDER_ENV)
        return cls(Path(folder), int(os.environ[COUNT_ENV])) if folder else None

    def _write(self, name: str, data: dict[str, Any]) -> None:
        write_atomic(self.folder / name, lambda tmp: tmp.write_text(json.dumps(data)))  # read whole, old or new

    def announce(self, version: str) -> None:  # this process is warm
        self._write(f"worker-{os.getpid()}.json", {"version": version})

    def leave(self) -> None:
        (self.folder / f"worker-{os.getpid()}.json").unlink(missing_ok=True)
        _forget_metrics(os.getpid())  # its live gauges (the version it served) go with it

    def serving(self) -> dict[int, str]:
        """Warm processes alive now and the version each serves; a dead one's files are cleared."""
        found = {}
        for path in self.folder.glob("worker-*.json"):
            pid = int(path.stem.removeprefix("worker-"))
            try:
                os.kill(pid, 0)
            except ProcessLookupError:  # killed before it could leave: its live gauges go with it
                path.unlink(missing_ok=True)
                _forget_metrics(pid)
                continue
            try:
                found[pid] = json.loads(path.read_text())["version"]
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                continue  # left or being replaced meanwhile
        return found

    def wanted(self) -> dict[str, str] | None:
        """The model the last reload asked for (None: the one each process started on)."""
        try:
            return json.loads((self.folder / WANTED).read_text())
        except FileNotFoundError:
            return None

    def want(self, model_dir: Path, variant: str) -> None:
        self._write(WANTED, {"model_dir": str(model_dir), "variant": variant})

    def restart(self) -> None:
        """uvicorn's supervisor, on SIGHUP, replaces every process by one started afresh (on ``wanted``), one
        at a time, each replacement up before it stops the one it replaces."""
        if os.getppid() != self.supervisor:  # never a signal to a process that is not ours
            raise RuntimeError(f"the supervisor (pid {self.supervisor}) is gone: restart the service")
        os.kill(self.supervisor, signal.SIGHUP)


def _forget_metrics(pid: int) -> None:
    if os.environ.get(METRICS_ENV):
        multiprocess.mark_process_dead(pid)
