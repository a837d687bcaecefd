"""Utilization recorded with every run, from a background thread (so a busy event loop cannot delay the samples):
per-core CPU, the server process's resident memory with its children, and each GPU's utilization and memory
through NVML (without one, ``gpu_note`` says why).
"""

import threading
import time
from contextlib import suppress
from typing import Any

import psutil

from servelab.measure.records import GpuSeries, Monitors

MAX_SAMPLES = 100_000  # a bound on memory, even if a run is left going for a day


def open_nvml() -> tuple[Any, list[Any], str | None]:
    """(pynvml module, device handles, note); no handles when NVML cannot start."""
    try:
        import pynvml  # deferred: present only where NVIDIA's library is; loaded when monitoring GPUs

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return pynvml, handles, None if handles else "NVML found no GPU"
    except Exception as exc:  # no library, no driver, no device: all mean "no GPU samples"
        return None, [], f"no GPU monitoring ({type(exc).__name__}: {exc})"


def gpu_name(nvml: Any, handle: Any) -> str:
    return name.decode() if isinstance(name := nvml.nvmlDeviceGetName(handle), bytes) else str(name)


class Monitor:
    def __init__(self, interval_s: float = 0.5, server_pid: int | None = None) -> None:
        self.interval_s, self.server_pid, self.gpu_note = interval_s, server_pid, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="servelab-monitor", daemon=True)
        self._series = Monitors(interval_s=interval_s, server_pid=server_pid)  # the samples, as recorded

    def __enter__(self) -> "Monitor":
        self._nvml, self._handles, self.gpu_note = open_nvml()
        self._series.gpus = [GpuSeries(index=i, name=gpu_name(self._nvml, h),
                                       mem_total_mib=self._nvml.nvmlDeviceGetMemoryInfo(h).total / 2**20)
                             for i, h in enumerate(self._handles)]
        self._process = None
        if self.server_pid is not None:
            with suppress(psutil.NoSuchProcess):
                self._process = psutil.Process(self.server_pid)
        psutil.cpu_percent(percpu=True)  # the first reading only sets the baseline
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._nvml:
            self._nvml.nvmlShutdown()

    def _loop(self) -> None:
        t = self._series.t_s
        while not self._stop.wait(self.interval_s) and len(t) < MAX_SAMPLES:
            self._sample()
        # The partial interval at the end is a sample too (a run shorter than one interval gets one),
        # unless it is too short for a CPU percentage to mean anything.
        if time.perf_counter() - self._t0 - (t[-1] if t else 0.0) > min(0.1, self.interval_s / 2):
            self._sample()

    def _sample(self) -> None:
        m = self._series
        m.t_s.append(round(time.perf_counter() - self._t0, 4))
        m.cpu_pct.append(psutil.cpu_percent(percpu=True))
        if self._process is not None:
            try:
                procs = [self._process, *self._process.children(recursive=True)]
            except psutil.NoSuchProcess:
                self._process = None  # the server went away: its series simply ends here
            else:
                rss = 0
                for p in procs:
                    with suppress(psutil.NoSuchProcess, psutil.AccessDenied):  # a child that just exited
                        rss += p.memory_info().rss
                m.rss_mib.append(rss / 2**20)
        for series, h in zip(m.gpus, self._handles):
            series.util_pct.append(float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            series.mem_used_mib.append(self._nvml.nvmlDeviceGetMemoryInfo(h).used / 2**20)

    def result(self) -> Monitors:
        return self._series.model_copy(update={"gpu_note": self.gpu_note})
