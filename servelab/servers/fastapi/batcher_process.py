"""The batcher process of a service whose server processes share one model (``shared`` says how): it loads
each model a connection asks for, warms it up and batches every connection's requests together.

``python -m servelab.servers.fastapi.batcher_process <app> <socket> <parent pid>``, started by
``shared.BatcherProcess``; ``<app>`` is the app whose ``load`` opens the model (``fastapi_onnx.app:app``).
SIGTERM stops it once the server processes connected to it have gone: a stop of the whole process group
drains them first, as they need the batcher for the requests they finish.
"""

import asyncio
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from multiprocessing.reduction import recv_handle
from pathlib import Path
from typing import Any

import numpy as np

from servelab.core.procs import die_with_parent
from servelab.core.settings import ServeSettings, get_settings
from servelab.servers.fastapi.errors import Overloaded
from servelab.servers.fastapi.metrics import Metrics
from servelab.servers.fastapi.pipeline import Pipeline, photo_text, warm
from servelab.servers.fastapi.runtimes import max_infer_batch
from servelab.servers.fastapi.shared import authkey, message, received, slots_of

log = logging.getLogger("servelab.servers.fastapi")

HELLO_S = 10.0  # a server process sends its hello as it connects
STOP_S = 30.0  # a stopped batcher serves this long at most, for the server processes draining (10 s each)


@dataclass
class Held:
    pipeline: Pipeline
    described: dict[str, Any]


class Batcher:
    """The batcher process's models and connections."""

    def __init__(self, load, settings: ServeSettings):
        # Its own Pipeline preprocesses only the warm-up's photo: one thread is enough.
        self.load, self.settings = load, settings.model_copy(update={"preprocess_processes": 0, "worker_threads": 1})
        self.metrics = Metrics(max_infer_batch(settings))
        self.models: dict[tuple, asyncio.Task[Held]] = {}
        self.users: Counter[tuple] = Counter()
        self.newest: tuple | None = None

    async def _load(self, key: tuple) -> Held:
        model_dir, variant = key
        settings = self.settings.model_copy(update={"model_dir": Path(model_dir),
                                                    **({"onnx_variant": variant} if variant else {})})
        backend = await asyncio.to_thread(self.load, settings)
        pipeline = Pipeline(backend, settings, self.metrics)
        pipeline.start()
        try:
            sizes, _ = await warm(pipeline, settings)
        except BaseException:
            await pipeline.close()
            raise
        log.info("batcher: %s version %s, %s; warm at batch sizes %s", backend.manifest.name, backend.version,
                 backend.where(), sizes)
        x = pipeline.prepare(photo_text())  # one image as the model takes it: what a slot holds
        return Held(pipeline, {"kind": backend.kind, "version": backend.version, "on_gpu": backend.on_gpu,
                               "intra_op_threads": backend.intra_op_threads, "details": backend.details,
                               "warnings": backend.warnings, "variant": backend.variant,
                               "takes_uint8": backend.takes_uint8, "instances": pipeline.batcher.instances,
                               "image": {"shape": list(x.shape), "dtype": str(x.dtype)}})

    async def acquire(self, key: tuple) -> Held:
        if key not in self.models:
            self.models[key] = asyncio.create_task(self._load(key))
        try:
            held = await self.models[key]
        except BaseException:
            self.models.pop(key, None)  # the next connection tries again
            raise
        self.users[key] += 1
        self.newest = key
        return held

    async def release(self, key: tuple) -> None:
        """A connection is done with ``key``'s model: closed unless another uses it or it is the newest."""
        self.users[key] -= 1
        if self.users[key] == 0 and key != self.newest and (task := self.models.pop(key, None)):
            log.info("batcher: closing the model in %s (variant %s): no server process uses it", *key)
            await (await task).pipeline.close()

    async def connection(self, conn: Connection) -> None:
        key = fd = memory = images = None
        answering: set[asyncio.Task] = set()
        try:
            async with asyncio.timeout(HELLO_S):
                asked = json.loads(await received(conn))
                fd = recv_handle(conn) if asked["arena"] else None  # sent with the hello: it waits for nothing
            key = (asked["model_dir"], asked.get("variant"))
            try:
                held = await self.acquire(key)
            except Exception as exc:  # noqa: BLE001 - the server process raises it in its own words
                log.error("batcher: cannot serve the model in %s: %s: %s", key[0], type(exc).__name__, exc)
                key = None
                conn.send_bytes(message({"error": type(exc).__name__, "detail": str(exc)}))
                return
            conn.send_bytes(message(held.described))
            while True:
                header = json.loads(await received(conn))
                if images is None:  # the server process sized its arena before it sent anything
                    memory, images = slots_of(fd, **held.described["image"])
                task = asyncio.create_task(self._infer(held.pipeline, images[header["slots"]], header, conn))
                answering.add(task)
                task.add_done_callback(answering.discard)
        except (EOFError, OSError, TimeoutError):
            pass  # the server process closed the connection or died
        finally:
            for task in answering:
                task.cancel()
            await asyncio.gather(*answering, return_exceptions=True)
            images = None
            if memory is not None:
                memory.close()
            if fd is not None:
                os.close(fd)
            conn.close()
            if key is not None:
                await self.release(key)

    @staticmethod
    async def _infer(pipeline: Pipeline, x: np.ndarray, header: dict[str, Any], conn: Connection) -> None:
        ident = header["id"]
        try:
            done = await pipeline.batcher.submit(x)
        except Overloaded as exc:
            answer = message({"id": ident, "error": "Overloaded", "reason": exc.reason, "detail": str(exc)})
        except Exception as exc:  # noqa: BLE001 - that request's server process answers it with a 500
            answer = message({"id": ident, "error": type(exc).__name__, "detail": str(exc)})
        else:
            logits = np.ascontiguousarray(done.logits)
            answer = message({"id": ident, "shape": list(logits.shape), "dtype": str(logits.dtype),
                              "infer_s": done.infer_s, "batch_size": done.batch_size}, logits.tobytes())
        with suppress(OSError):  # the server process has gone: its connection's reader ends
            conn.send_bytes(answer)


async def _serve(app: str, path: str) -> int:
    batcher = Batcher(importlib.import_module(app.partition(":")[0]).load, get_settings())
    loop = asyncio.get_running_loop()
    connections: set[asyncio.Task] = set()
    stop = asyncio.Event()

    def start(conn: Connection) -> None:
        if stop.is_set():
            conn.close()
            return
        connections.add(task := loop.create_task(batcher.connection(conn)))
        task.add_done_callback(connections.discard)

    def accept(listener: Listener) -> None:  # a thread of its own: accept blocks while it checks the key
        while True:
            try:
                conn = listener.accept()
            except (AuthenticationError, EOFError, ConnectionError):
                continue
            except OSError:  # closed: stopping
                return
            try:
                loop.call_soon_threadsafe(start, conn)
            except RuntimeError:  # the loop has ended: the batcher is stopping
                conn.close()
                return

    listener = Listener(path, "AF_UNIX", backlog=128, authkey=authkey(path))
    threading.Thread(target=accept, args=(listener,), name="accept", daemon=True).start()
    log.info("batcher: serving the server processes at %s", path)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    listener.close()
    # A stop drains the server processes first: they finish their requests here, then go. Exit 0 says they all
    # went (the service is stopping: nothing starts another batcher); 1, that some were still there.
    log.info("batcher: stopping once the %d server process(es) connected have gone", len(connections))
    _, left = await asyncio.wait(connections, timeout=STOP_S) if connections else (None, ())
    return 1 if left else 0


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    app, path, parent = sys.argv[1:4]
    die_with_parent(int(parent))  # here, not before exec: the parent starts this process from a thread
    sys.exit(asyncio.run(_serve(app, path)))


if __name__ == "__main__":
    main()
