"""servelab's client on more than one process, and what one process can send.

The load generator (``servelab.measure.loadgen``) is one asyncio event loop: on a machine with many cores one
process can send fewer requests per second than a fast server answers (on a 16-core H200 it read 13-19 % below
perf_analyzer at ~1,000 req/s). So every run:

* knows the client's **ceiling**: requests per CPU-second of one sender process, in a closed loop of
  ``CEILING_CONCURRENCY`` senders against a server that does nothing (``servelab.measure.noop_server``, on
  several processes where there are cores for them) with the run's own request body. Measured once per machine
  and body size, kept for the process (``_CEILINGS``) and, where the run writes its records to a folder, in
  ``client-ceiling.json`` there, so later runs do not pay for it (about 1.5 s);
* plans its **sender processes** (``plan_processes``): enough that their ceilings together stay ``HEADROOM`` (2x)
  above the rate it expects (an open loop's offered rate; a closed loop's rate in its warm-up, by Little's law),
  at most ``default_max_processes()`` (half the CPUs: the server needs the others). One process unless more are
  needed: on a 2-CPU machine always one;
* is marked **client-bound** (``bound_reason``) where its throughput came above ``BOUND_FRACTION`` of what its
  processes can send, or its busiest sender's event loop was on the CPU more than that share of the window
  (measured in the run itself, so it holds where the ceiling's stand-in costs less than the run's own client):
  then the figure is the client's, and the report never shows it as a server's capacity.

The processes (``SenderPool``) are started with ``spawn`` (the parent may run threads: monitors, Ray), kept for the
life of this process, and each runs the same asyncio engine on its share of the load. They share the parent's
clock: ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process of the machine
(``SHARED_CLOCK``); where it is not, every run keeps to one process.
"""

import atexit
import datetime as dt
import json
import math
import multiprocessing
import os
import platform
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path

from servelab.core.procs import ServerProcess, cpu_count, free_port
from servelab.measure.records import ClientCeiling, Load

CEILING_CONCURRENCY = 16  # senders in the ceiling's closed loop
CEILING_SECONDS, CEILING_WARMUP_S = 0.5, 0.25
HEADROOM = 2.0  # the client's processes can send at least this multiple of the rate planned for
BOUND_FRACTION = 1 / HEADROOM  # a run above this fraction of what its processes can send is client-bound
SATURATED = 0.75  # a one-process warm-up above this fraction of the ceiling may itself have been held by the client
CEILING_FILE = "client-ceiling.json"
SHARED_CLOCK = time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"

_CEILINGS: dict[str, ClientCeiling] = {}  # this process's ceilings, by ``ceiling_key``


def default_max_processes() -> int:
    """Sender processes a run may use: half the CPUs (the server runs on the rest), at least one."""
    return max(1, cpu_count() // 2)


def noop_server_processes() -> int:
    """The no-op server's processes for a ceiling: enough that it out-serves one sender (up to 4), leaving it a CPU."""
    return max(1, min(4, cpu_count() - 1))


@contextmanager
def noop_server(processes: int = 1, log_dir: Path | None = None) -> Iterator[str]:
    """``processes`` no-op servers sharing one port on 127.0.0.1 (``SO_REUSEPORT``) until the block ends: its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        logs = Path(log_dir) if log_dir else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="noop-")))
        for i in range(processes):
            cmd = [sys.executable, "-m", "servelab.measure.noop_server", "--port", str(port)]
            stack.enter_context(ServerProcess(cmd, f"{url}/ready", logs / f"noop-{i}.log", ready_timeout=30,
                                              stop_timeout=5))
        yield url


def machine_key() -> str:
    """What a ceiling depends on besides the body: the host, its CPUs, Python and aiohttp."""
    try:
        aiohttp = metadata.version("aiohttp")
    except metadata.PackageNotFoundError:
        aiohttp = "?"
    return f"{socket.gethostname()} {cpu_count()} CPUs {platform.machine()} python {platform.python_version()} aiohttp {aiohttp}"


def ceiling_key(what: str, body_bytes: int) -> str:
    return f"{what}, {body_bytes} B"


def _read(path: Path | None) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path and path.is_file() else {}
    except ValueError:  # a damaged file costs a measurement, not the run
        return {}


def cached_ceiling(key: str, folder: Path | None = None) -> ClientCeiling | None:
    """The ceiling measured for ``key`` earlier in this process (then also written to ``folder`` where it is not
    there yet), else in ``folder``'s ``CEILING_FILE`` on this machine; None where neither has it."""
    path = Path(folder) / CEILING_FILE if folder else None
    found = _read(path).get(machine_key(), {}).get(key)
    if key in _CEILINGS:
        if folder is not None and found is None:
            keep_ceiling(key, _CEILINGS[key], folder)
        return _CEILINGS[key].model_copy(update={"source": "cached"})
    try:
        ceiling = ClientCeiling.model_validate(found) if found else None
    except ValueError:
        return None
    if ceiling is None:
        return None
    _CEILINGS[key] = ceiling
    return ceiling.model_copy(update={"source": str(path)})


def keep_ceiling(key: str, ceiling: ClientCeiling, folder: Path | None = None) -> None:
    """Keep ``ceiling`` for this process and, with ``folder``, in its ``CEILING_FILE`` (replaced whole, atomically)."""
    _CEILINGS[key] = ceiling
    if folder is None:
        return
    path = Path(folder) / CEILING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    known = _read(path)
    known.setdefault(machine_key(), {})[key] = ceiling.model_dump()
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(json.dumps(known, indent=1) + "\n", encoding="utf-8")
    scratch.replace(path)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def planned_rate(load: Load) -> float | None:
    """An open loop's highest offered rate (its top step); None for the others (their warm-up says)."""
    if load.mode != "open" or load.rate is None:
        return None
    return max(rate for rate, _ in load.phases) if load.phases else load.rate


def little_rate(load: Load, warm_latencies_s: list[float]) -> float | None:
    """A closed loop's rate from its warm-up, by Little's law: senders / median latency (None: too few answers)."""
    if load.mode != "closed" or len(warm_latencies_s) < 3:
        return None
    senders = load.concurrency if load.warmup_s else min(load.concurrency, load.warmup)
    latencies = sorted(warm_latencies_s)
    median = latencies[len(latencies) // 2]
    return senders / median if median > 0 else None


def most_processes(load: Load, limit: int) -> int:
    """The most processes ``load`` can be split across: each needs a sender (closed) and a request to send."""
    if load.mode == "sequential":
        return 1
    most = limit
    if load.mode == "closed":
        most = min(most, load.concurrency)
    if load.requests is not None:
        most = min(most, load.requests)
    return max(1, most)


def plan_processes(load: Load, ceiling_rps: float | None, expected_rps: float | None, max_processes: int,
                   asked: int | None = None, held: str | None = None) -> tuple[int, str]:
    """(sender processes, how they were chosen) for ``load``: ``asked`` where given; one where ``held`` says why
    (a trigger runs in this process), for one request at a time, or with nothing to plan from; else enough that
    ``HEADROOM`` x ``expected_rps`` fits under processes x ``ceiling_rps``, all ``max_processes`` where a one-process
    warm-up came near the ceiling (it may itself have been held by the client); never more than the load splits into."""
    if held:
        return 1, f"one process: {held}"
    if asked is not None:
        n = min(asked, most_processes(load, asked))
        return n, f"{n} asked for" + ("" if n == asked else f" ({asked} asked; the load splits into {n})")
    if load.mode == "sequential":
        return 1, "one process: one request at a time"
    if max_processes == 1:
        return 1, "one process: the most allowed (max_processes; by default half the CPUs)"
    if not SHARED_CLOCK:
        return 1, "one process: this platform's perf_counter is not one clock for every process"
    if ceiling_rps is None or expected_rps is None:
        return 1, "one process: nothing to plan from (no ceiling, or no warm-up to estimate the rate)"
    need = math.ceil(HEADROOM * expected_rps / ceiling_rps)
    if load.mode == "closed" and expected_rps >= SATURATED * ceiling_rps:
        need = max(need, max_processes)
    n = max(1, min(need, most_processes(load, max_processes)))
    what = f"{HEADROOM:g} x {expected_rps:.0f} req/s expected, {ceiling_rps:.0f} req/s per process"
    capped = f", capped at {n}" if n < need else ""
    return n, f"{n} process{'es' if n > 1 else ''}: {what}{capped}"


def bound_reason(throughput_rps: float, processes: int, ceiling_rps: float | None,
                 busy: float | None = None) -> str | None:
    """Why a run was bound by the client (None: it was not): its throughput over ``BOUND_FRACTION`` of what its
    processes can send by their ceiling, or its busiest sender's event loop on the CPU more than ``BOUND_FRACTION``
    of the window (``busy``: the ceiling's stand-in may cost less per request than the run's own client, as a
    Triton target's does). An open loop whose sends ran late while its sender was mostly idle is not client-bound:
    the machine ran something else (its record warns that it fell behind its schedule). A run that served nothing
    measured no capacity: it is not marked."""
    if throughput_rps <= 0:
        return None
    if ceiling_rps and throughput_rps > BOUND_FRACTION * processes * ceiling_rps:
        return (f"{throughput_rps:.0f} req/s is {throughput_rps / (processes * ceiling_rps):.0%} of what "
                f"{processes} sender process{'es' if processes > 1 else ''} can send ({processes} x {ceiling_rps:.0f} "
                f"req/s), above {BOUND_FRACTION:.0%}")
    if busy is not None and busy > BOUND_FRACTION:
        return (f"the busiest sender process's event loop was on the CPU {busy:.0%} of the window, above "
                f"{BOUND_FRACTION:.0%}")
    return None


class SenderPool:
    """Sender processes kept for this process's life (``spawn``), each running ``main(conn, parent_pid)``: a loop
    over jobs sent on its pipe. ``take(n)`` starts what is missing and hands back ``n`` pipes."""

    def __init__(self, main: Callable[[Connection, int], None]) -> None:
        self.main = main
        self.context = multiprocessing.get_context("spawn")
        self.senders: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []

    def take(self, n: int) -> list[Connection]:
        self.senders = [(p, c) for p, c in self.senders if p.is_alive()]
        while len(self.senders) < n:
            ours, theirs = self.context.Pipe()
            process = self.context.Process(target=self.main, args=(theirs, os.getpid()), daemon=True,
                                           name=f"servelab-sender-{len(self.senders)}")
            process.start()
            theirs.close()
            self.senders.append((process, ours))
        return [c for _, c in self.senders[:n]]

    def close(self, wait_s: float = 5.0) -> None:
        """Ask every process to end (``None`` on its pipe), then kill those still there after ``wait_s`` (0: a run
        failed, and they may be mid-job: at once), by their PID."""
        senders, self.senders = self.senders, []
        for _, conn in senders:
            try:
                conn.send(None)
            except OSError:
                pass
        for process, conn in senders:
            process.join(wait_s)
            if process.is_alive():
                process.kill()
                process.join(5)
            conn.close()


_POOLS: dict[Callable, SenderPool] = {}


def pool(main: Callable[[Connection, int], None]) -> SenderPool:
    """This process's pool for ``main`` (closed when the process exits)."""
    if main not in _POOLS:
        _POOLS[main] = SenderPool(main)
    return _POOLS[main]


@atexit.register
def _close_pools() -> None:
    for sender_pool in _POOLS.values():
        sender_pool.close()
