"""The node's own Python: bin/node-setup (3_fastapi_setup) makes a venv with Ubuntu 24.04's Python 3.12 and installs
constraints.txt with the node's extras, which the local environment (3.11) never resolves. Here pip
resolves exactly that set for CPython 3.12 on manylinux x86-64 (the way servelab.tools.gpu_constraints
reads the GPU environment's), from the package index, and the test fails on a pin with no 3.12 wheel.

Needs the package index (metadata only: pip reads each wheel's metadata file, downloads no wheel); skipped,
saying so, where it cannot be reached. torch comes from PyPI here: the node takes the same release's CPU
build from PyTorch's own index, which this machine cannot reach."""

import json
import os
import re
import subprocess
import sys
import tomllib
import urllib.request

import pytest

from servelab.core.paths import REPO_ROOT
from servelab.tools.gpu_constraints import PIP_TARGET, pins

INDEX = "https://pypi.org/simple/"
# gpu_constraints' target (CPython 3.12, x86-64, wheels only), on every manylinux tag Ubuntu 24.04's glibc
# 2.39 runs: pip takes the platforms it is given literally, and many wheels are tagged manylinux_2_17.
PLATFORMS = [*(f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)), "manylinux2014_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
TARGET = [*PIP_TARGET[:PIP_TARGET.index("--platform")], *(a for p in PLATFORMS for a in ("--platform", p))]
NODE_SETUP = REPO_ROOT / "bin" / "node-setup"


def node_extras() -> list[str]:
    """The extras bin/node-setup installs on the node (its `pip install ... -e ".[...]"` line)."""
    (extras,) = re.findall(r'pip install .*-e "\.\[([\w,]+)\]"', NODE_SETUP.read_text())
    return extras.split(",")


def requirements(extras: list[str]) -> list[str]:
    """servelab's own requirements with those extras (an extra naming servelab[...] expanded)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    wanted, todo = list(project["dependencies"]), list(extras)
    while todo:
        for req in project["optional-dependencies"][todo.pop()]:
            nested = re.fullmatch(r"servelab\[([\w,]+)\]", req)
            todo += nested[1].split(",") if nested else []
            wanted += [] if nested else [req]
    return sorted(set(wanted))


@pytest.fixture(scope="module")
def index():
    try:
        urllib.request.urlopen(f"{INDEX}pip/", timeout=15)
    except OSError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must reach the package index: {exc}")
        pytest.skip(f"the package index cannot be reached from here ({exc}): nothing to resolve against")
    return INDEX


def test_the_node_environment_resolves_for_python_3_12(index, tmp_path):
    extras = node_extras()
    assert {"torch", "onnx", "bench"} <= set(extras)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                           *TARGET, "--target", str(tmp_path / "t"), "--index-url", index, "--report", str(report),
                           "-c", str(REPO_ROOT / "constraints.txt"), *requirements(extras)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PIP_CONSTRAINT": ""})
    assert done.returncode == 0, f"no CPython 3.12 wheel for a pin of constraints.txt:\n{done.stderr[-3000:]}"
    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
              for item in json.loads(report.read_text())["install"]}
    pinned = pins(REPO_ROOT / "constraints.txt")
    assert len(chosen) > 30
    differ = {name: (version, pinned[name]) for name, version in chosen.items() if name in pinned and pinned[name] != version}
    assert not differ, f"resolved away from the pins: {differ}"
    wheels = [item["download_info"]["url"].rsplit("/", 1)[-1] for item in json.loads(report.read_text())["install"]]
    assert all(w.endswith(".whl") for w in wheels)
    assert all(re.search(r"-(cp312|abi3|py3|py2\.py3)-", w) for w in wheels), [w for w in wheels
                                                                               if not re.search(r"-(cp312|abi3|py3)-", w)]
