"""The dress rehearsal's node: a fresh clone with a HOME of its own, whose login shells run the notebooks' shell
blocks as written, and the stand-ins for what this machine lacks, declared once in STAND_INS (the record repeats
the table). Used by tests/e2e/test_rehearsal.py."""

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from notebook_harness import client, injected, prepare, record_cell_times
from servelab.core.paths import REPO_ROOT
from servelab.tools.lease_plan import code_cells, sections
from servelab.tools.render_notebooks import NOTEBOOK_DIR

# What this machine lacks, and what stands in for it: (the part, on a student's node, here).
STAND_INS = [
    ("GPU", "2x P100 with NVIDIA's driver and container toolkit",
     "none: docker/no-gpu/'s override beside each compose file, added by the `docker` below; 2_create_server_nvidia's "
     "toolkit, cgroupfs, Docker restart, nvtop and GPU checks are not run, nor `servelab doctor --node`"),
    ("Docker", "Docker's current engine with buildx and Compose",
     "a private dockerd 20.10 (tests' engine) behind a `docker` first on the node's PATH: `buildx bake` builds bake's "
     "targets one by one with the legacy builder (its BuildKit refuses `target:` contexts), `compose` adds the no-GPU "
     "override and one with faster health checks and ulimits within this VM's; `buildx bake --push` (`make images-push`) "
     "pushes bake's core group, not the ray and redis images, which nothing in the rehearsal runs; the rest is "
     "Debian's docker"),
    ("the class registry", "a registry the instructor runs or rents (docs/instructors.md)",
     "Debian's `docker-registry` (the CNCF distribution registry) on 127.0.0.1, plain HTTP; the student's node is a "
     "second private dockerd with an empty data root of its own"),
    ("NVIDIA base images", "nvcr.io/nvidia/tritonserver, ubuntu:22.04, PyTorch's CUDA build",
     "the stand-in bases (docker/standin/), picked by bake variables exported in the node's ~/.profile; the stand-in "
     "Triton has no onnxruntime backend, so ~/.profile also exports TRITON_ONNXRUNTIME=false and the ONNX stages "
     "run as the LOCAL STAND-IN (a Python model on ONNX Runtime), which their records say"),
    ("Jupyter", "the notebooks run in the jupyter container, on the compose network",
     "a kernel on this machine with the jupyter service's environment as `docker compose config` gives it "
     "(its /lab/ paths made the checkout's), reaching the services at their published 127.0.0.1 ports"),
    ("servelab's environment", "bin/node-setup makes .venv", ".venv links to this machine's, PYTHONPATH names the clone"),
    ("the lab's model", "downloaded and built by `servelab models build --source lab` (bin/node-setup)",
     "MODEL_SOURCE=offline in ~/.profile; the packaged stand-in and its variants, built once per test session "
     "(tests/conftest.py's artifacts), copied into the clone: bin/node-setup finds them up to date"),
    ("the prepared image", "`sudo cc-snapshot` uploads the instructor's node; students' nodes boot from it, and a "
     "systemd unit loads ~/servelab-images.tar at boot",
     "SNAPSHOT_ROOT is an empty folder of the node's HOME (no systemd: no unit; bin/node-setup loads the archive "
     "itself); the booted node is the same node with this commit's images removed from its engine"),
    ("the repository", "git clone of the class's GitHub repository", "git clone of this checkout's HEAD"),
    ("Chameleon and SSH", "python-chi makes the server; the student SSHes in as cc",
     "a login shell (`bash -l`) with the node's HOME; `sudo usermod -aG docker` is not run here"),
    ("scp", "the student's computer copies from the node over SSH",
     "an `scp` on the student's PATH that copies cc@A.B.C.D:PATH from the node's HOME"),
]

# What the rehearsal does not play, and where it is tested instead.
NOT_PLAYED = [
    "the ray and redis images pushed to the class registry (9_ray_setup's and the cache stage's)",
    "4_fastapi's optional sections (its core is played): they run against local servers in "
    "tests/e2e/test_notebooks_measure.py; of 6, 7 and 8, the switches to pt-4x4 and the variants (their cells run "
    "and say they skip) and the monitoring sections (no Prometheus or Grafana image here)",
    "`cc-snapshot` and a boot from its image, and the systemd unit that loads the archive at boot",
    "`servelab doctor --node` (its GPU checks fail without a GPU) and 5_triton_setup's `nvidia-smi`",
]

DOCKER = '''#!{python}
"""The rehearsal's `docker` (tests/rehearsal.py, STAND_INS): bake by the legacy builder, compose without a GPU."""
import os, sys
from pathlib import Path
from servelab.tools.containers import compose_tool, images
args, cache = sys.argv[1:], Path(os.environ["REHEARSAL_CACHE"])
docker = compose_tool.docker({{"DOCKER_HOST": os.environ["DOCKER_HOST"]}}, cache, log=lambda *_: None)
if args[:2] == ["buildx", "bake"]:
    # --push alone: the core group, what a node's core path runs (STAND_INS: no ray, no redis image here)
    names = tuple(a for a in args[2:] if not a.startswith("-")) or (("core",) if "--push" in args else ("default",))
    targets = images.plan(docker, names, images.variables(dict(os.environ)))
    for ref in images.build(docker, targets):
        if "--push" in args:
            docker.run("push", ref, timeout=1800)
    sys.exit(0)
if args[:1] == ["compose"]:  # each stage file gets its no-GPU override and the local one, right after it
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if i and args[i - 1] == "-f":
            name = Path(arg).name
            for f in (Path(arg).parent / "no-gpu" / name, Path(os.environ["REHEARSAL_WORK"]) / name):
                out += ["-f", str(f)] if f.exists() else []
    args = out
os.execv("/usr/bin/docker", ["docker", *args])
'''

SCP = '''#!/usr/bin/env bash
# The rehearsal's scp (tests/rehearsal.py, STAND_INS): cc@A.B.C.D:PATH is PATH in the node's HOME.
args=()
for a in "$@"; do case "$a" in -i) skip=1 ;; cc@*:*) args+=("$REHEARSAL_NODE_HOME/${a#*:}") ;;
  *) [ -n "$skip" ] && skip= || args+=("$a") ;; esac; done
exec cp "${args[@]}"
'''


SHELL = re.compile(r"```shell\n(.*?)```", re.DOTALL)


def shell_blocks(notebook: Path) -> list[str]:
    """The notebook's ```shell blocks, as written."""
    return SHELL.findall(notebook.read_text())


def core_only(optional: bool, heading: str, kind: str) -> bool:
    """The sections a student on the core path leaves out: those marked (optional), as the lease plan does."""
    return optional


def path(text: str, left_out: Callable[[bool, str, str], bool] = core_only) -> list[tuple[str, str | int]]:
    """A notebook in the order a student meets it: ("shell", block) for each ```shell block and ("cell", n) for its
    n-th code cell, without those ``left_out(optional, heading, "shell" or "cell")`` names in their section
    (servelab/tools/lease_plan.py's ``sections``, ``code_cells``)."""
    found, at = [], 0
    for n, (optional, source, section) in enumerate(code_cells(text)):
        at = text.find(source, at)
        found.append((at, left_out(optional, section.strip().partition("\n")[0], "cell"), "cell", n))
        at += len(source)
    start = 0
    for optional, section in sections(text):
        out = left_out(optional, section.strip().partition("\n")[0], "shell")
        found += [(start + m.start(), out, "shell", m[1]) for m in SHELL.finditer(section)]
        start += len(section)
    return [(kind, what) for _, out, kind, what in sorted(found, key=lambda f: f[0]) if not out]


@dataclass
class Node:
    """A student's node: its HOME, its checkout (~/servelab), and the steps it played with their wall times."""

    home: Path
    profile: dict[str, str]
    steps: list[dict] = field(default_factory=list)

    @property
    def checkout(self) -> Path:
        return self.home / "servelab"

    def write_profile(self, tools: Path) -> None:
        """~/.profile: the stand-ins' variables (a login shell reads it after /etc/profile resets PATH)."""
        tools.mkdir(parents=True, exist_ok=True)
        (tools / "docker").write_text(DOCKER.format(python=sys.executable))
        (tools / "scp").write_text(SCP)
        for tool in ("docker", "scp"):
            (tools / tool).chmod(0o755)
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.profile.items()]
        (self.home / ".profile").write_text("\n".join([*lines, f'export PATH="{tools}:$PATH"', ""]))

    def session(self, step: str, blocks: list[str], check: bool = True, timeout: float = 1800) -> str:
        """One SSH session: a login shell that runs ``blocks`` as written, one after another; its output."""
        started = time.monotonic()
        script = "set -e\n" + "\n".join(blocks)
        done = subprocess.run(["bash", "-l", "-s"], input=script, cwd=self.home, capture_output=True, text=True,
                              env={"HOME": str(self.home), "USER": "cc", "TERM": "dumb"}, timeout=timeout)
        self.steps.append({"step": step, "wall_s": round(time.monotonic() - started, 1), "rc": done.returncode})
        if check:
            assert done.returncode == 0, f"{step}:\n{script}\n--- out:\n{done.stdout[-4000:]}\n--- err:\n{done.stderr[-4000:]}"
        return done.stdout + done.stderr

    def jupyter_env(self, every_session: str, compose_file: str) -> dict[str, str]:
        """The Jupyter service's environment as compose gives it (its secrets file included), its /lab/ paths
        made the checkout's: the kernel runs here, not in the container (STAND_INS)."""
        out = self.session(f"Jupyter's environment ({compose_file})", [
            every_session, f"docker compose -f docker/{compose_file} config --format json jupyter"])
        env = json.loads(out[out.index("{"):])["services"]["jupyter"].get("environment") or {}
        return {k: (v or "").replace("/lab/", f"{self.checkout}/") for k, v in env.items()}

    def play(self, stem: str, every_session: str, kernel_dir: Path, parameters: dict, env: dict[str, str], *,
             left_out: Callable[[bool, str, str], bool] = core_only, prologue: str = "", epilogue: str = "",
             answer_edits: dict[str, str] | None = None, timeout: int = 600) -> str:
        """A notebook as a student plays it (``path``; by default its core): each ```shell block typed into a new SSH
        session after ``every_session``'s lines, the code cells run in one kernel in ~/servelab/notebooks with
        ``env`` (the Jupyter service's, ``jupyter_env``), in order, each student's cell as its answer
        (tests/notebook_harness.py's ``prepare``), the epilogue last. The cells' output, as shown."""
        nb = prepare(stem, parameters=parameters, prologue=prologue, epilogue=epilogue, answer_edits=answer_edits)
        own = [cell for cell in nb.cells if cell.cell_type == "code" and not injected(cell)]
        position = {id(cell): index for index, cell in enumerate(nb.cells)}  # by identity: two cells may read alike
        run = client(nb, kernel_dir, self.checkout / "notebooks", timeout)
        started, done, shown = time.monotonic(), 0, []
        env = {"PATH": os.environ["PATH"], **self.profile, **env, "HOME": str(self.home)}
        with run.setup_kernel(env=env):
            for kind, what in [*path((NOTEBOOK_DIR / f"{stem}.md").read_text(), left_out), ("cell", None)]:
                if kind == "shell":
                    self.session(f"{stem}: {what.strip().splitlines()[-1][:60]}", [every_session, what])
                    continue
                end = len(nb.cells) if what is None else position[id(own[what])] + 1  # None: the epilogue
                for index in range(done, end):  # with the injected cells before it
                    cell = nb.cells[index]
                    if cell.cell_type == "code" and (injected(cell) or what is not None and cell is own[what]):
                        run.execute_cell(cell, index)
                        shown.append("".join(out.get("text", "") for out in cell.get("outputs", [])))
                done = end
        if os.environ.get("SERVELAB_RECORD_CELL_TIMES") == "1":
            record_cell_times(stem, own, parameters)
        part = "the core" if left_out is core_only else "played"
        self.steps.append({"step": f"{stem}: {part}, shell steps included", "wall_s": round(time.monotonic() - started, 1),
                           "rc": 0})
        return "\n".join(shown)

    def wait_for_images(self, step: str, timeout: float = 3600) -> str:
        """The student's `tail -f ~/images.log` until it ends: the line `images: done`, or a failure with what to do
        (each ends with the runbook's pointer; the advice quotes `images: done`, so only the whole line counts)."""
        started, log = time.monotonic(), self.home / "images.log"
        while time.monotonic() - started < timeout:
            text = log.read_text() if log.exists() else ""
            done = "images: done" in text.splitlines()
            if done or ("images: FAILED" in text and "(docs/class.md, When something fails)" in text):
                self.steps.append({"step": step, "wall_s": round(time.monotonic() - started, 1), "rc": 0 if done else 1})
                return text
            time.sleep(2)
        raise AssertionError(f"{step}: ~/images.log did not end within {timeout:.0f} s:\n{text[-2000:]}")


def write_record(steps: list[dict], out: Path) -> None:
    """docs/records/rehearsal-2cpu.json and .md: each step's wall time, the machine, the commit, the stand-ins."""
    commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {"kind": "rehearsal", "commit": commit, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "system": platform.platform(), "python": platform.python_version()},
              "steps": steps, "not_played": NOT_PLAYED, "stand_ins": [dict(zip(("part", "on the node", "here"), row, strict=True))
                                            for row in STAND_INS]}
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    rows = [f"| {s['step']} | {s['wall_s']:.1f} | {s['rc']} |" for s in steps]
    stand_ins = [f"| {part} | {node} | {here} |" for part, node, here in STAND_INS]
    out.with_suffix(".md").write_text("\n".join([
        f"# The dress rehearsal at {commit} ({record['date']})", "",
        f"`make rehearse` on {os.cpu_count()} CPUs ({record['machine']['system']}): the node path played in order "
        "(tests/e2e/test_rehearsal.py). Figures from rehearsal-2cpu.json.", "",
        "| step | wall s | rc |", "|---|---:|---:|", *rows, "", "## Stand-ins", "",
        "| part | on a student's node | here |", "|---|---|---|", *stand_ins, "", "## Not played here", "",
        *(f"- {line}" for line in NOT_PLAYED), ""]))
