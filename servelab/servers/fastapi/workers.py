"""Several server processes on one port: how ``servelab serve fastapi-onnx|fastapi-pt`` runs by default.

One process carries every request's HTTP, JSON and base64 on one event loop and one GIL: on 16 cores
without a GPU that turned 40 % of the machine's limit into answers (docs/gpu/nvidia-h200.md). So ``serve``
starts ``WORKERS`` copies of the app under uvicorn's supervisor (the parent binds the port and replaces a
child that dies), each on its share of the CPUs. Each learns of the others from one object, ``Siblings``.
With ``SHARED_BATCHER`` the children load no model (``servelab.servers.fastapi.shared``); each takes a place
(``claim``), and place i goes to batcher i modulo their number.

The children share a folder (``Siblings.folder``), so the service still answers as one:

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

import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from servelab.core.hardware import gpu_count, visible_gpus
from servelab.core.procs import cpu_count
from servelab.core.settings import ServeSettings
from servelab.servers.fastapi.siblings import METRICS_ENV, Siblings

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
    """WORKERS, else one process per CPU, but one on a GPU without a shared batcher (each would load its own model)."""
    if settings.workers != "auto":
        return settings.workers
    return 1 if on_gpu(settings, runtime) and settings.shared_batcher is False else min(cpu_count(), AUTO_WORKERS_MAX)


def batcher_devices(settings: ServeSettings, runtime: str) -> list[str | None]:
    """Each batcher process's CUDA_VISIBLE_DEVICES: a visible GPU each, or None (the CPU) BATCHERS times."""
    gpus = visible_gpus() if on_gpu(settings, runtime) else []
    count = settings.batchers if settings.batchers != "auto" else max(1, len(gpus))
    return [gpus[i % len(gpus)] if gpus else None for i in range(count)]


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
        metrics = {METRICS_ENV: str(Path(folder) / "metrics")}  # set before any child imports prometheus_client
        shared = shares_batcher(settings, runtime, workers)
        devices = batcher_devices(settings, runtime) if shared else []
        paths = [str(Path(folder) / f"batcher-{i}.sock") for i in range(len(devices))]
        if shared:
            # Deferred: the batcher's side of the service imports the model's (numpy, the pipeline).
            from servelab.servers.fastapi.shared import BatcherProcess, hello

            for path, device in zip(paths, devices):  # every CPU is theirs; a GPU each where there are GPUs
                gpu = {} if device is None else {"CUDA_VISIBLE_DEVICES": device}
                batcher.enter_context(BatcherProcess(app, Path(path), {**os.environ, **metrics, **gpu}))
            try:  # the model loads and warms up there before any server process starts: a fatal problem ends here
                for path in paths:
                    hello(path, settings)[0].close()
            except Exception as exc:  # noqa: BLE001 - said in a line, as a server process's start would
                sys.exit(f"ERROR:    servelab: the batcher process cannot serve the model: {exc}")
        # The children inherit these (uvicorn spawns them); this process imports no prometheus_client.
        os.environ.update({**Siblings(Path(folder), workers, share, tuple(paths)).env(), **metrics})
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
