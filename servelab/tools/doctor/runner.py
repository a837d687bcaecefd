"""What every check (``Context -> Result``) shares. Programs run only through ``Context.output``: its runner is a
subprocess with a timeout, or in tests one that answers with a tool's recorded output, and each answer is kept,
so several checks read one ``nvidia-smi`` or ``docker info`` call."""

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from servelab.core.paths import REPO_ROOT


@dataclass(frozen=True)
class Result:
    name: str
    status: Literal["pass", "warn", "fail", "skip"]
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status.upper():4}  {self.name}: {self.detail}"
        return f"{text}  Fix: {self.fix}" if self.fix else text


@dataclass(frozen=True)
class Output:
    """What a program said. ``returncode`` is None when it did not run to the end: ``problem`` says why."""

    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    problem: str = ""
    missing: bool = False  # the program is not installed

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def why(self) -> str:
        """Why it failed, in one line: our own reason, else the first line of its error output."""
        said = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return self.problem or (said[0] if said else f"exit status {self.returncode}")


def run_command(argv: Sequence[str], timeout_s: float) -> Output:
    """Run a program, never waiting more than ``timeout_s`` (a hung driver or daemon must not hang us)."""
    if shutil.which(argv[0]) is None:
        return Output(None, problem=f"{argv[0]} not found", missing=True)
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Output(None, problem=f"`{' '.join(argv[:3])}` did not answer within {timeout_s:g} s")
    except OSError as exc:
        return Output(None, problem=f"{argv[0]} could not start: {exc}")
    return Output(done.returncode, done.stdout, done.stderr)


@dataclass
class Context:
    """The machine under examination. ``node``: the lab's GPU node, where GPUs and Docker are required."""

    node: bool = False
    run: Callable[[Sequence[str], float], Output] = run_command
    repo: Path = REPO_ROOT
    _outputs: dict[tuple[tuple[str, ...], float], Output] = field(default_factory=dict, repr=False)

    def output(self, argv: Sequence[str], timeout_s: float = 20.0) -> Output:
        key = (tuple(argv), timeout_s)
        if key not in self._outputs:
            self._outputs[key] = self.run(argv, timeout_s)
        return self._outputs[key]


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], Result]
    where: frozenset[Literal["node", "local"]] = frozenset({"node", "local"})


def run_checks(checks: Sequence[Check], ctx: Context) -> list[Result]:
    """Every check that applies where we are; a check that crashes is a failure, not the end of the run."""
    results = []
    for check in checks:
        if ("node" if ctx.node else "local") not in check.where:
            continue
        try:
            results.append(check.run(ctx))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' answers
            results.append(Result(check.name, "fail", f"the check itself failed: {type(exc).__name__}: {exc}"))
    return results


def exit_code(results: Sequence[Result]) -> int:
    return 1 if any(r.status == "fail" for r in results) else 0
