"""One routine that measures a stage, for every runner: ``servelab lab`` (``servelab.run.lab``,
``servelab.run.lab_ray``), the notebooks' walkthrough (``servelab.run.walkthrough``) and ``servelab benchmark``
(``servelab.run.side_by_side``, ``servelab.run.side_by_side_ray``).

``measure_stage(target, loads, labels, clients, keep)`` runs each load with each client in turn
(servelab's load generator first, perf_analyzer after it on the same server state) and hands every
record to ``keep``, the runner's own way of keeping it (write it, attach the server's series, print a
line). What the runners differ in, how a family's server is started or switched to a stage and what
it reports, stays with them; what every record of a stage carries is a ``Labels``, with its stand-in
note from ``stand_in_note``, the one place that note is put together.
"""

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from servelab.core.artifacts import Manifest
from servelab.measure.records import Load, Record
from servelab.measure.loadgen import run_bench
from servelab.measure.perf_analyzer import run_perf_analyzer
from servelab.measure.targets import Target
from servelab.core.hardware import options_in_force, runs_on_fastapi
from servelab.core.procs import DIRECT
from servelab.core.catalogue import PT, Stage

# Triton's Python-backend stand-in for the ONNX Runtime backend, named in every record it makes.
ONNX_STAND_IN = "Triton ONNX Runtime backend replaced by a Python-backend model calling ONNX Runtime (local stand-in)"
# The Ray nodes are processes on this one machine, sharing its cores: named in every Ray record.
RAY_STAND_IN = ("Ray nodes are `ray start` processes on one machine sharing its CPUs (logical CPUs per node), "
                "not separate machines (local stand-in)")


def family_stand_in(stage: Stage) -> str:
    """What stands in for the node's set-up when this stage runs here, named in each of its records."""
    if stage.family == "ray":
        return RAY_STAND_IN
    return ONNX_STAND_IN if stage.family == "triton" and stage.triton.model != PT else ""


def model_stand_in(manifest: Manifest) -> str | None:
    """The model's own note where it is the offline stand-in, not the lab's weights."""
    return manifest.description if manifest.stand_in else None


def stand_in_note(*notes: str | None) -> str | None:
    """Why a stage's numbers are not the lab node's own, from every stand-in it runs (None: none)."""
    return "; ".join(note for note in notes if note) or None


def served_runtime(url: str) -> tuple[str, dict[str, Any]]:
    """Where the FastAPI app at ``url`` (a FastAPI stage's, or a Ray Serve replica's) really runs, as its
    /ready says, and the options its ONNX Runtime providers really hold (for its records' config)."""
    runtime = json.loads(DIRECT.open(f"{url}/ready", timeout=30).read())["runtime"]
    return runs_on_fastapi(runtime), options_in_force(runtime)


class Labels(NamedTuple):
    """What every record of one stage's measurement carries."""

    stage: str
    config: dict[str, Any] | None = None
    stand_in: str | None = None
    server_pid: int | None = None


# A client measures one load: (target, load, labels, the records this load has so far) -> its record.
Client = Callable[[Any, Load, Labels, list[Record]], Record]


def servelab_client(**options: Any) -> Client:
    """servelab's load generator (``run_bench``); ``options``: its own (``timeout_s``, ``sampler``, ``out``)."""
    def run(target: Target, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        return run_bench(target, load, stage=labels.stage, config=labels.config, stand_in=labels.stand_in,
                         server_pid=labels.server_pid, **options)
    return run


def perf_analyzer_client(**options: Any) -> Client:
    """perf_analyzer on a Triton target; ``options``: its own (``windows``, ``timeout_s``, ``out``, ...).
    It records no config: what it measured is in its command."""
    def run(target: Any, load: Load, labels: Labels, earlier: list[Record]) -> Record:
        return run_perf_analyzer(target, load, stage=labels.stage, stand_in=labels.stand_in,
                                 server_pid=labels.server_pid, **options)
    return run


def kept(measure: Callable[[], Record], load: Load) -> Record:
    """Keep a record as it is (a runner with nothing to add to it)."""
    return measure()


def measure_stage(target: Any, loads: Iterable[Load], labels: Labels, clients: Sequence[Client] = (servelab_client(),),
                  keep: Callable[[Callable[[], Record], Load], Record] = kept) -> list[Record]:
    """Each load with each client, in order; ``keep(measure, load)`` runs each measurement (it may read
    the server before and after it) and returns its record. Every record, in the order made."""
    records: list[Record] = []
    for load in loads:
        done: list[Record] = []
        for client in clients:
            done.append(keep(lambda client=client: client(target, load, labels, list(done)), load))
        records += done
    return records


async def measure_stage_async(target: Any, loads: Iterable[Load], labels: Labels,
                              clients: Sequence[Client] = (servelab_client(),)) -> list[Record]:
    """``measure_stage`` from inside a running event loop (a notebook's): in a thread, since each
    client starts an event loop of its own."""
    return await asyncio.to_thread(measure_stage, target, list(loads), labels, clients)
