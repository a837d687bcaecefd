"""What a server process knows of the service it is one of, handed over once: ``Siblings``, one typed object that
``workers.serve`` writes into one variable before uvicorn starts the processes, and each reads as it starts.

Light on purpose: the model's side (``runtimes``) reads it without loading uvicorn or the supervisor's machinery.
"""

import json
import os
import signal
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from servelab.core.artifacts import write_atomic
from servelab.core.procs import cpu_count, take_place

WIRING_ENV = "SERVELAB_SIBLINGS"  # the one variable: Siblings as JSON, set for the server processes only
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own, read when it is first imported
WANTED = "model.json"


@dataclass(frozen=True)
class Siblings:
    """A service's server processes on one port: their shared ``folder``, how many there are (``expected``), each
    one's share of the CPUs (``cpus``) and the batcher processes' sockets (``batchers``; empty: each process
    loads its model). Safe across processes: they share only files, each written whole (``write_atomic``)."""

    folder: Path
    expected: int
    cpus: int
    batchers: tuple[str, ...] = ()
    supervisor: int = field(default_factory=os.getppid, compare=False)  # uvicorn's, which started this process

    def env(self) -> dict[str, str]:  # what the server processes inherit (each finds its supervisor itself)
        return {WIRING_ENV: json.dumps({k: v for k, v in asdict(self).items() if k != "supervisor"}, default=str)}

    @staticmethod
    @cache
    def here() -> "Siblings | None":  # None: a process of its own
        if not (wiring := os.environ.get(WIRING_ENV)):
            return None
        read = json.loads(wiring)
        return Siblings(Path(read["folder"]), read["expected"], read["cpus"], tuple(read["batchers"]))

    def batcher(self) -> str:
        """This process's batcher socket: its place (``claim``) modulo their number, so the processes spread."""
        return self.batchers[claim(self.folder, self.expected) % len(self.batchers)]

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
            with suppress(FileNotFoundError, json.JSONDecodeError, KeyError):  # left or being replaced meanwhile
                found[pid] = json.loads(path.read_text())["version"]
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


def cpus() -> int:
    """The CPUs this process's model may use: its share where it is one of a service's server processes."""
    return siblings.cpus if (siblings := Siblings.here()) else cpu_count()


@cache
def claim(folder: Path, count: int) -> int:
    """One of ``count`` places, kept while this process lives (a reload asks again: the same one): the server
    processes of a service hold different ones (``take_place``)."""
    fd = os.open(folder / "processes.places", os.O_RDWR | os.O_CREAT, 0o600)  # open for life: closing drops locks
    place = take_place(fd, count, set())
    return os.getpid() % count if place is None else place  # one more for a moment (a replacement): any will do


def _forget_metrics(pid: int) -> None:
    if os.environ.get(METRICS_ENV):
        # Here, not at the top: the supervisor (workers.serve) imports this module and no prometheus_client.
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
