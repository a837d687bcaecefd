"""One model and one batcher behind all of a service's server processes (``SHARED_BATCHER``): how ``servelab
serve`` runs where the model is on a GPU.

The server processes (``workers``) carry HTTP, JSON, base64 and preprocessing; one *batcher process* holds
the model, so every request waits in one queue and batches fill as behind a single process (as Triton keeps
one scheduler per model). Each model copy would otherwise take a CUDA context and see 1/N of the traffic.

A server process writes a request's images into shared memory of its own (``Arena``: a slot per image) and
sends the batcher which slots over a Unix socket (``multiprocessing.connection``, with a key). The arena has
no name (``memfd_create``); its descriptor goes over the socket, so nothing is in /dev/shm and the kernel
frees it once both processes close it, however they end (SIGKILL too). The batcher (``batcher_process``)
answers with the logits: no image crosses the socket. This module is the server processes' side.

* The batcher loads a model when a connection first asks for it (its *hello*: folder and variant) and keeps
  it while a connection uses it or it is the newest asked for, so a replaced model finishes its requests.
* A batcher process that dies is started again by ``serve``'s parent (``BatcherProcess``); one stopped
  (SIGTERM) is not. Each server process reconnects and sends again, once, every request it was waiting on
  (their images are still in its shared memory): nothing is lost, and ``/ready`` says 503 meanwhile.
* The batcher's figures add up with the server processes' in ``/metrics`` (the multiprocess folder).
"""

import asyncio
import json
import logging
import mmap
import os
import subprocess
import sys
import threading
import time
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from multiprocessing.reduction import send_handle
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from servelab.core.settings import ServeSettings
from servelab.servers.fastapi.batcher import BatchResult
from servelab.servers.fastapi.errors import Overloaded, WorkerLost

log = logging.getLogger("servelab.servers.fastapi")

BATCHER_MODULE = "servelab.servers.fastapi.batcher_process"  # what the batcher process runs
ARENA_SLOTS = 32  # images a server process may have at the batcher at once (more wait for a slot)
CONNECT_S = 600.0  # how long a server process waits for the batcher: a restart loads and warms the model
RETRY_S = 0.1
RESTART_DELAY_S = 0.5


def authkey(path: str) -> bytes:  # every connection proves it holds it; ``BatcherProcess`` writes it
    return Path(f"{path}.key").read_bytes()


def message(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """A JSON header, then raw bytes (the logits): a JSON text holds no raw newline."""
    return json.dumps(header).encode() + b"\n" + payload


def parse(data: bytes) -> tuple[dict[str, Any], bytes]:
    header, _, payload = data.partition(b"\n")
    return json.loads(header), payload


async def received(conn: Connection) -> bytes:
    """``conn``'s next message, without blocking the event loop. Sends stay blocking: each side reads all the
    time, and a server process's slots bound its answers."""
    loop = asyncio.get_running_loop()
    arrived = loop.create_future()
    loop.add_reader(conn.fileno(), lambda: arrived.done() or arrived.set_result(None))
    try:
        await arrived
    finally:
        loop.remove_reader(conn.fileno())
    return conn.recv_bytes()


def hello(path: str, settings: ServeSettings, arena: int | None = None) -> tuple[Connection, dict[str, Any]]:
    """A blocking connection to the batcher at ``path`` serving ``settings``' model (loaded and warmed first),
    and the model's description; ``arena``'s descriptor goes after the hello (SCM_RIGHTS). Retries while the
    batcher starts; a model it cannot load raises FileNotFoundError, else RuntimeError."""
    deadline = time.monotonic() + CONNECT_S
    while True:
        conn = None
        try:
            conn = Client(path, "AF_UNIX", authkey=authkey(path))
            conn.send_bytes(json.dumps({"model_dir": str(settings.model_dir), "variant": settings.onnx_variant,
                                        "arena": arena is not None}).encode())
            if arena is not None:
                send_handle(conn, arena, None)
            described = json.loads(conn.recv_bytes())
            break
        except BaseException as exc:
            if conn is not None:
                conn.close()
            # Not started yet, or a killed one's socket: refused, or accepted into its backlog and reset as it closes.
            if not isinstance(exc, (FileNotFoundError, ConnectionError, EOFError)):
                raise
            if time.monotonic() > deadline:
                raise WorkerLost(f"no batcher process answers at {path} after {CONNECT_S:g} s") from None
            time.sleep(RETRY_S)
    if error := described.get("error"):
        conn.close()
        raise (FileNotFoundError if error == "FileNotFoundError" else RuntimeError)(described["detail"])
    return conn, described


def slots_of(fd: int, shape: list[int], dtype: str) -> tuple[mmap.mmap, np.ndarray]:  # as many as the file holds
    memory = mmap.mmap(fd, os.fstat(fd).st_size)
    return memory, np.frombuffer(memory, dtype).reshape(-1, *shape)


class Arena:
    """A server process's shared memory for the images it has at the batcher: one slot per image, in the file
    ``fd`` (a memfd, already passed to the batcher: the batcher maps it once it has this size)."""

    def __init__(self, fd: int, slots: int, shape: list[int], dtype: str):
        self.fd = fd
        os.ftruncate(fd, slots * int(np.prod(shape)) * np.dtype(dtype).itemsize)
        self.memory, self.images = slots_of(fd, shape, dtype)
        self.free = list(range(slots))
        self.freed = asyncio.Condition()

    async def put(self, x: np.ndarray) -> list[int]:
        """Copies ``x`` [n, *shape] into n free slots, waiting for them; their indices. One event loop's, not threads'."""
        async with self.freed:
            await self.freed.wait_for(lambda: len(self.free) >= len(x))
            slots = [self.free.pop() for _ in range(len(x))]
        self.images[slots] = x
        return slots

    async def release(self, slots: list[int]) -> None:
        async with self.freed:
            self.free.extend(slots)
            self.freed.notify_all()

    def close(self) -> None:
        del self.images  # a view of the memory: it cannot close while one exists
        self.memory.close()
        os.close(self.fd)


@dataclass
class _Waiting:
    future: asyncio.Future
    header: dict[str, Any]
    sent: float
    tries: int = 0


class SharedBatcher:
    """The batcher process's micro-batcher as one server process sees it: ``MicroBatcher``'s interface."""

    def __init__(self, path: str, settings: ServeSettings, slots: int):
        self.path, self.settings = path, settings
        fd = os.memfd_create("servelab-arena")
        try:  # blocking: in the app's load thread, before the loop
            self._conn, self.described = hello(path, settings, fd)
        except BaseException:
            os.close(fd)
            raise
        self.instances = self.described["instances"]  # the batcher's inferences at once
        # Sized before any request goes: the batcher maps it when the first arrives.
        self.arena = Arena(fd, max(ARENA_SLOTS, slots), **self.described["image"])
        self._waiting: dict[int, _Waiting] = {}
        self._ids = 0
        self._connected = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="shared-batcher")

    def _send(self, header: dict[str, Any]) -> None:
        with suppress(OSError):  # the batcher has gone: the reader sees it, and sends this again to the next
            self._conn.send_bytes(message(header))

    def _attach(self) -> None:
        for waiting in self._waiting.values():  # a new batcher: what the last one had not answered, again
            if waiting.future.done():  # its caller went away
                continue
            waiting.tries += 1
            if waiting.tries > 1:
                waiting.future.set_exception(WorkerLost("the batcher process died twice while this request waited "
                                                        "for its inference (it was restarted each time); retry"))
            else:
                self._send(waiting.header)
        self._waiting = {k: w for k, w in self._waiting.items() if not w.future.done()}
        self._connected.set()

    async def _run(self) -> None:
        while True:
            self._attach()
            try:
                while True:
                    header, payload = parse(await received(self._conn))
                    if (waiting := self._waiting.pop(header["id"], None)) is not None:
                        self._answer(waiting, header, payload)
            except (EOFError, OSError):
                self._connected.clear()
                self._conn.close()
                log.error("the batcher process went away with %d request(s) waiting; reconnecting", len(self._waiting))
            self._conn = await self._reconnect()

    async def _reconnect(self) -> Connection:
        """A connection to the batcher started again, serving this model; requests wait meanwhile."""
        while True:
            try:
                conn, described = await asyncio.to_thread(hello, self.path, self.settings, self.arena.fd)
                if described["version"] == self.described["version"]:
                    return conn
                conn.close()  # the model's folder changed under the batcher: this model is gone
                why = f"the batcher serves version {described['version']} of it, not {self.described['version']}"
            except Exception as exc:  # noqa: BLE001 - said to the requests waiting, and tried again
                why = f"{type(exc).__name__}: {exc}"
            log.error("cannot reach the batcher's model again (%s); failing %d waiting request(s)", why,
                      len(self._waiting))
            for waiting in self._waiting.values():
                if not waiting.future.done():
                    waiting.future.set_exception(WorkerLost(f"the batcher process died; {why}"))
            self._waiting.clear()
            await asyncio.sleep(1)

    @staticmethod
    def _answer(waiting: _Waiting, header: dict[str, Any], payload: bytes) -> None:
        if waiting.future.done():
            return
        if error := header.get("error"):
            waiting.future.set_exception(Overloaded(header["reason"], header["detail"]) if error == "Overloaded"
                                         else RuntimeError(f"the batcher process failed the inference: {header['detail']}"))
            return
        logits = np.frombuffer(payload, header["dtype"]).reshape(header["shape"])
        # The way to and from the batcher counts as queueing: it is neither preprocessing nor inference.
        waiting.future.set_result(BatchResult(logits, perf_counter() - waiting.sent - header["infer_s"],
                                              header["infer_s"], header["batch_size"]))

    async def submit(self, x: np.ndarray) -> BatchResult:
        """``MicroBatcher.submit``'s contract, through the batcher process: images [n, 3, H, W] -> logits [n, classes].
        WorkerLost: the batcher process died, or did not come back within CONNECT_S; its refusals as Overloaded or RuntimeError."""
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher connection is not running")
        slots = await self.arena.put(x)
        try:
            self._ids += 1
            header = {"id": (ident := self._ids), "slots": slots}
            waiting = _Waiting(self._loop.create_future(), header, perf_counter())
            try:
                await asyncio.wait_for(self._connected.wait(), CONNECT_S)
            except TimeoutError:
                raise WorkerLost(f"the batcher process has not come back in {CONNECT_S:g} s; retry") from None
            self._waiting[ident] = waiting
            self._send(header)
            return await waiting.future
        finally:
            await self.arena.release(slots)

    def infer(self, x: np.ndarray) -> np.ndarray:  # from a thread other than the event loop's (the warm-up's)
        return asyncio.run_coroutine_threadsafe(self.submit(x), self._loop).result().logits

    async def warm_up(self, fn, threads: int | None = None) -> list:
        """``fn`` once in a thread: the model is warm in the batcher; this warms the way there."""
        return [await asyncio.to_thread(fn)]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for waiting in self._waiting.values():
            if not waiting.future.done():
                waiting.future.set_exception(RuntimeError("the service is shutting down"))
        self._conn.close()
        self.arena.close()


class BatcherProcess:
    """``serve``'s parent's batcher process: started, started again whenever it dies, stopped by PID."""

    def __init__(self, app: str, path: Path, env: dict[str, str]):
        self.app, self.path, self.env = app, path, env
        key = Path(f"{path}.key")  # what connections prove they know (authkey): this user's to read only
        key.touch(0o600)
        key.write_bytes(os.urandom(32))
        self.proc: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="batcher-process", daemon=True)

    def _keep(self) -> None:
        # The batcher dies with this thread (die_with_parent, called there: never preexec_fn from a thread).
        while not self._stopping.is_set():
            self.path.unlink(missing_ok=True)
            self.proc = subprocess.Popen([sys.executable, "-m", BATCHER_MODULE, self.app, str(self.path),
                                          str(os.getpid())], env=self.env)
            self._started.set()
            if (code := self.proc.wait()) == 0:  # stopped after every server process had gone: the service is stopping
                return
            if not self._stopping.is_set():
                print(f"ERROR:    servelab: the batcher process (pid {self.proc.pid}) ended with {code}; starting "
                      "another: the server processes send it what they were waiting on", file=sys.stderr, flush=True)
                self._stopping.wait(RESTART_DELAY_S)  # one that cannot start does not restart in a tight loop

    def __enter__(self) -> "BatcherProcess":
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._thread.join(15)
