"""One ``servelab lab`` run as a whole (``LabRun``, ``results/run.json``): which plan and stages, on what
machine, how long it took and what it showed; and how it is printed at the end of the run."""

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from servelab.core.artifacts import write_atomic
from servelab.core.hardware import describe, stack
from servelab.core.variants.build import machine
from servelab.measure.records import machine_info

RUN_FILE = "run.json"  # what the run was and how long it took, beside its records
TOUR_AIM_S = 600  # the default `make lab` (the tour) should take at most this on 2 CPUs, the model built


def machine_line() -> str:
    """The machine a lab time depends on: the CPU (model, count, instruction sets), the memory, any GPU."""
    return f"{machine()}; {machine_info()['memory_gib']:g} GiB; {describe(stack())[0]}"


@dataclass(frozen=True)
class LabRun:
    """One `servelab lab` run as a whole; docs/records/make-lab.json, a tour's, is where the docs take its time."""

    plan: str
    stages: list[str]
    device: str
    machine: str
    finished: str  # ISO 8601, UTC
    models_s: float  # the model and its variants: built on a first run, checked after that
    total_s: float  # from the command's start to the report
    failures: list[str]
    summary: list[str]  # the report's "What this run shows", Markdown lines
    not_run: dict[str, str] = field(default_factory=dict)  # stage -> why it was not started (--budget)

    def write(self, path: Path) -> None:
        write_atomic(path, lambda tmp: tmp.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"))

    @classmethod
    def read(cls, path: Path) -> "LabRun":
        return cls(**json.loads(path.read_text(encoding="utf-8")))

    def timing(self) -> str:
        line = (f"lab finished in {minutes(self.total_s)} (the model and its variants {minutes(self.models_s)}, "
                f"the {len(self.stages)} stages {minutes(self.total_s - self.models_s)}); plan {self.plan}")
        if self.plan == "tour":
            line += f", aim ≤ {minutes(TOUR_AIM_S)} on 2 CPUs: {'met' if self.total_s <= TOUR_AIM_S else 'MISSED'}"
        return line


def minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"
