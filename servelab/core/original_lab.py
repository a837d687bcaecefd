"""The original lab's published figures (``servelab/data/original_lab.toml``), the one place the notebooks take
them from: each step one measurement it reported on its 2x P100 node, and where ours measure the same thing."""

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from servelab.core.paths import DATA_DIR

TABLE = DATA_DIR / "original_lab.toml"


@dataclass(frozen=True)
class Figure:
    measures: str
    value: float
    unit: str  # "ms", "req/s" or "infer/s"


@dataclass(frozen=True)
class Step:
    key: str
    notebook: str
    section: str  # the notebook heading under which ours measures the same thing
    load: str
    tool: str
    figures: tuple[Figure, ...]
    source: str  # where the figures are written down (required: a figure without one is not quoted)
    method: str = ""  # how the figures were computed, where it matters for comparing them

    def __post_init__(self) -> None:
        if not self.source.strip():
            raise ValueError(f"{self.key}: every step of {TABLE.name} needs its source")

    def sentence(self) -> str:
        """The step's figures as one sentence for a notebook, with their source."""
        figures = ", ".join(f"{f.measures} {f.value:g} {f.unit}" for f in self.figures)
        method = f" ({self.method})" if self.method else ""
        return (f"**The original lab reported** on its 2× P100 node, {self.load} ({self.tool}): "
                f"{figures}{method}. *Source:* {self.source}.")


@cache
def steps(path: Path = TABLE) -> dict[str, Step]:
    table = tomllib.loads(path.read_text(encoding="utf-8"))
    return {key: Step(key=key, figures=tuple(Figure(**f) for f in entry.pop("figures")), **entry)
            for key, entry in table.items()}


def step(key: str) -> Step:
    try:
        return steps()[key]
    except KeyError:
        raise KeyError(f"no step {key!r} in {TABLE.name}; steps: {', '.join(steps())}") from None


def figures() -> set[tuple[float, str]]:
    """Every (value, unit) the original lab reported."""
    return {(f.value, f.unit) for s in steps().values() for f in s.figures}
