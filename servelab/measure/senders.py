"""servelab's client on more than one process, and when a run was bound by the client.

The load generator is one asyncio event loop: on a machine with many cores one process can send fewer requests
per second than a fast server answers (on a 16-core H200 it read 13-19 % below perf_analyzer at ~1,000 req/s). So
every run plans its sender processes (``plan_processes``), and is marked client-bound (``bound_reason``) where its
busiest sender's event loop was on the CPU more than ``BOUND_FRACTION`` of the window: the figure is then the
client's, never a server's capacity. The processes are started with ``spawn`` (the parent may run threads) and
share the parent's clock, ``time.perf_counter`` (CLOCK_MONOTONIC on Linux; elsewhere a run keeps to one process).
"""

import atexit
import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from contextlib import suppress
from functools import cache
from multiprocessing.connection import Connection

from servelab.core.procs import cpu_count
from servelab.measure.records import Load

HEADROOM = 2.0  # the client's processes can send at least this multiple of the rate planned for
BOUND_FRACTION = 1 / HEADROOM  # a sender's event loop on the CPU over this share of the window: client-bound
SATURATED = 0.75  # a one-process warm-up above this share of what it can send may itself have been held by the client
SHARED_CLOCK = time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"


def planned_rate(load: Load) -> float | None:
    """An open loop's highest offered rate (its top step); None for the others (their warm-up says)."""
    if load.mode != "open" or load.rate is None:
        return None
    return max(rate for rate, _ in load.phases) if load.phases else load.rate


def little_rate(load: Load, warm_latencies_s: list[float]) -> float | None:
    """A closed loop's rate from its warm-up, by Little's law: senders / median latency (None: too few answers)."""
    if load.mode != "closed" or len(warm_latencies_s) < 3:
        return None
    return load.warmup_senders / median if (median := statistics.median_high(warm_latencies_s)) > 0 else None


def most_processes(load: Load, limit: int) -> int:
    """The most processes ``load`` can be split across: each needs a sender (closed) and a request to send."""
    if load.mode == "sequential":
        return 1
    senders = load.concurrency if load.mode == "closed" else limit
    return max(1, min(limit, senders, limit if load.requests is None else load.requests))


def plan_processes(load: Load, per_process_rps: float | None, expected_rps: float | None, max_processes: int | None,
                   asked: int | None = None, held: str | None = None) -> tuple[int, str]:
    """(sender processes, how they were chosen): ``asked`` where given; one where ``held`` says why, for one request
    at a time, or with nothing to plan from; else enough that ``HEADROOM`` x ``expected_rps`` fits under processes x
    ``per_process_rps`` (requests per CPU-second), all ``max_processes`` (default: half the CPUs, the server has the
    rest) where a one-process warm-up came near that (the client may have held it)."""
    max_processes = max_processes or max(1, cpu_count() // 2)
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
    if per_process_rps is None or expected_rps is None:
        return 1, "one process: nothing to plan from (no warm-up to measure the client's cost or the rate)"
    need = math.ceil(HEADROOM * expected_rps / per_process_rps)
    if load.mode == "closed" and expected_rps >= SATURATED * per_process_rps:
        need = max(need, max_processes)
    n = max(1, min(need, most_processes(load, max_processes)))
    what = f"{HEADROOM:g} x {expected_rps:.0f} req/s expected, {per_process_rps:.0f} req/s per process"
    capped = f", capped at {n}" if n < need else ""
    return n, f"{n} process{'es' if n > 1 else ''}: {what}{capped}"


def bound_reason(throughput_rps: float, busy: float | None) -> str | None:
    """Why a run was bound by the client (None: it was not): its busiest sender's event loop was on the CPU more
    than ``BOUND_FRACTION`` of the window (``busy``), so the client, not the server, set the pace. An open loop whose
    sends ran late while its sender was mostly idle is not client-bound: the machine ran something else (its record
    warns that it fell behind its schedule). A run that served nothing measured no capacity: it is not marked."""
    if throughput_rps <= 0 or busy is None or busy <= BOUND_FRACTION:
        return None
    return (f"the busiest sender process's event loop was on the CPU {busy:.0%} of the window, above "
            f"{BOUND_FRACTION:.0%}")


class SenderPool:
    """Sender processes kept for this process's life (``spawn``), each running ``main(conn, parent_pid)``: a loop
    over jobs sent on its pipe. ``take(n)`` starts what is missing and hands back ``n`` pipes."""

    def __init__(self, main: Callable[[Connection, int], None]) -> None:
        self.main = main
        self.context = multiprocessing.get_context("spawn")
        self.senders: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        atexit.register(self.close)

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
            with suppress(OSError):  # its end of the pipe is gone already
                conn.send(None)
        for process, conn in senders:
            process.join(wait_s)
            if process.is_alive():
                process.kill()
                process.join(5)
            conn.close()


pool = cache(SenderPool)  # ``pool(main)``: this process's pool for ``main`` (closed when the process exits)
