"""Every import servelab defers ("# Deferred...: importing it loads X (...)") does so for a true reason: the module
holding it imports without loading X, and the deferred import then loads X. A reason that went false (a split
module that no longer loads X, or one the holding module loads anyway) fails here: move that import to the top
of its file. Each site in a fresh interpreter."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REASON = re.compile(r"# Deferred[^:]*: importing it loads (.+?) \(")
# The words the comments use -> the import names of those packages.
PACKAGES = {"tritonclient": "tritonclient", "aiohttp": "aiohttp", "prometheus-client": "prometheus_client",
            "fastapi": "fastapi", "onnx": "onnx", "onnx runtime": "onnxruntime", "torch": "torch", "ray": "ray"}
CHECK = """
import importlib, sys
named = set(sys.argv[3].split(","))
importlib.import_module(sys.argv[1])  # the module that defers
before = {p for p in named if p in sys.modules}
for target in sys.argv[2].split(","):
    importlib.import_module(target)
print(",".join(sorted(p for p in named - before if p in sys.modules)))
"""

def sites() -> list[tuple[str, str, list[str], list[str]]]:
    """(where, the module holding it, what the import loads, the packages its comment names)."""
    found = []
    for path in sorted((REPO / "servelab").rglob("*.py")):
        lines = path.read_text().splitlines()
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for i, line in enumerate(lines):
            if not (reason := REASON.search(line)):
                continue
            j = i + 1
            while lines[j].strip().startswith("#"):
                j += 1
            node = ast.parse(lines[j].strip()).body[0]
            targets = [f"{node.module}.{a.name}" if (REPO / node.module.replace(".", "/") / f"{a.name}.py").exists()
                       else node.module for a in node.names]
            words = [w.strip().lower() for w in re.split(r",| and ", reason[1])]
            found.append((f"{path.relative_to(REPO)}:{j + 1}", module, sorted(set(targets)),
                          [PACKAGES[w] for w in words if w in PACKAGES]))
    return found


def test_the_comments_name_packages_this_test_knows():
    assert all(packages for *_, packages in sites()), [s for s in sites() if not s[3]]
    assert len(sites()) >= 5  # the scan finds them (8 when notebook_blocks took its imports to the top)


@pytest.mark.parametrize("site", sites(), ids=lambda s: s[0])
def test_a_deferred_import_is_deferred_for_a_true_reason(site):
    where, module, targets, packages = site
    run = subprocess.run([sys.executable, "-c", CHECK, module, ",".join(targets), ",".join(packages)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip(), (f"{where}: importing {targets} loads none of {packages} that {module} does not load "
                                "already: import it at the top of the file")
