"""The GPU constraints file against the torch it will meet (``make gpu-constraints-check``).

``.venv-gpu`` is installed beside the machine's own CUDA torch, so a pin that one of its requirements excludes
stops the install (torch 2.11 requires ``setuptools<82``). The file's header names each torch release it was
checked against and its requirements (``# torch==2.11.0 requires: filelock | setuptools<82 | ...``); ``main``
reads them again from the package index. Requirements on packages not pinned are the machine's, met with its torch.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEADER = re.compile(r"^# torch==(?P<version>\S+) requires: (?P<requires>.*)$")
# The machine .venv-gpu is made for (the Makefile's GPU_TARGET): markers are evaluated for it.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
              "sys_platform": "linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
PIP_TARGET = ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12", "--abi", "cp312",
              "--platform", "manylinux_2_28_x86_64"]


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file, by canonical name."""
    found = {}
    for line in path.read_text().splitlines():
        if line := line.split("#", 1)[0].strip():
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def checked_torch(path: Path) -> dict[str, list[str]]:
    return {m["version"]: [r.strip() for r in m["requires"].split(" | ")]
            for m in map(HEADER.match, path.read_text().splitlines()) if m}


def conflicts(pinned: dict[str, str], requires: list[str]) -> list[str]:
    """Each requirement (applying on the target) that a pin does not satisfy."""
    bad = []
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(TARGET_ENV):
            continue
        version = pinned.get(canonicalize_name(req.name))
        if version is not None and not req.specifier.contains(version, prereleases=True):
            bad.append(f"{req} excludes the pin {req.name}=={version}")
    return bad


def index_requires(version: str) -> list[str]:
    """torch ``version``'s requirements (extras left out) as the package index states them for the target."""
    with tempfile.TemporaryDirectory(prefix="servelab-torch-meta-") as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--no-deps", *PIP_TARGET, "--target", str(Path(tmp) / "t"), "--report", str(report),
                        f"torch=={version}"], check=True, env={**os.environ, "PIP_CONSTRAINT": ""})
        [item] = json.loads(report.read_text())["install"]
    return [r for r in item["metadata"].get("requires_dist", []) if "extra ==" not in r]


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "constraints-gpu-cu13.txt")
    pinned, checked, failed = pins(path), checked_torch(path), False
    if not checked:
        print(f"{path}: no `# torch==X requires: ...` line: it names no torch it was checked against")
        return 1
    for version, recorded in checked.items():
        live = index_requires(version)
        problems = conflicts(pinned, live)
        if sorted(live) != sorted(recorded):
            problems.insert(0, f"the index says\n  {' | '.join(live)}\nbut {path} records\n  {' | '.join(recorded)}")
        for problem in problems:  # each version on its own: one that fails does not silence the next one's OK
            print(f"torch=={version}: {problem}")
        if not problems:
            print(f"torch=={version}: its {len(live)} requirements agree with the header and every pin of {path}")
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
