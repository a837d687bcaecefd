"""The machine's CPU, memory and GPUs as Prometheus metrics, under node exporter's and dcgm-exporter's names (one
dashboard reads both): locally they replace those exporters, reading the counters the records' monitors sample.
"""

from collections.abc import Iterator
from typing import Any

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from servelab.measure.monitor import gpu_name, open_nvml


class MachineCollector(Collector):
    def __init__(self) -> None:
        self.nvml, self.handles, self.gpu_note = open_nvml()

    def collect(self) -> Iterator[Any]:
        cpu = CounterMetricFamily("node_cpu_seconds", "Seconds the CPUs spent in each mode.", labels=["cpu", "mode"])
        for index, times in enumerate(psutil.cpu_times(percpu=True)):
            for mode in ("user", "system", "idle", "iowait", "nice", "irq", "softirq", "steal"):
                if hasattr(times, mode):
                    cpu.add_metric([str(index), mode], getattr(times, mode))
        yield cpu
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily("node_memory_MemTotal_bytes", "Memory in total.", value=memory.total)
        yield GaugeMetricFamily("node_memory_MemAvailable_bytes", "Memory available to new work.",
                                value=memory.available)
        if self.handles:
            util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (%).", labels=["gpu", "modelName"])
            used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "GPU memory used (MiB).", labels=["gpu", "modelName"])
            for index, handle in enumerate(self.handles):
                labels = [str(index), gpu_name(self.nvml, handle)]
                util.add_metric(labels, float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                used.add_metric(labels, self.nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)
            yield from (util, used)
