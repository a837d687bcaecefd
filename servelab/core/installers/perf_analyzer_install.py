"""perf_analyzer, *extracted* from the pinned ``tritonclient==2.50.0`` wheel (the last that carries it; later
ones need glibc 2.38), never pip-installed, so the project's own ``tritonclient`` pin stays as it is. It needs
``libcudart.so.12`` even for HTTP and gRPC (from a pinned wheel) and Debian's ``libb64-0d``; all of it lands in
``<environment>/opt/perf_analyzer/{bin,lib}``."""

import json
import platform
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from servelab.core.fetch import sha256_file
from servelab.core.installers.opt_tools import (
    InstallError,
    ToolBinary,
    add_library,
    binary_version,
    choose_binary,
    opt_dir,
    place,
    wheelhouse,
)
from servelab.core.settings import get_settings


@dataclass(frozen=True)
class Pin:
    """One file taken out of one pinned wheel."""

    package: str
    version: str
    sha256: str
    member: str  # path of the file inside the wheel
    dest: str  # "bin" or "lib"


PINS = (
    Pin("tritonclient", "2.50.0", "421fbb69ae6ab8cdb2c35b82134fcef2fe11e7af7718b1fcbc53335ab9bfe889",
        "tritonclient-2.50.0.data/data/bin/perf_analyzer", "bin"),
    Pin("nvidia-cuda-runtime-cu12", "12.6.77", "ba3b56a4f896141e25e19ab287cd71e52a6a0f4b29d0d31609f60e3b4d5219b7",
        "nvidia/cuda_runtime/lib/libcudart.so.12", "lib"),
)
LIBB64 = "libb64.so.0d"
LIBB64_PACKAGE = "libb64-0d"  # Debian and Ubuntu
SDK_IMAGE_HINT = "on the lab node it ships in NVIDIA's Triton SDK image (nvcr.io/nvidia/tritonserver:<yy.mm>-py3-sdk)"
INSTALL_HINT = "run `make perf-analyzer` (or `servelab perf-analyzer install`)"


class PerfAnalyzerNotFound(RuntimeError):
    pass


def install_dir() -> Path:
    return opt_dir("perf_analyzer")


def _version(pa: ToolBinary) -> str:
    """``perf_analyzer --version``; raises with the loader's own message when it cannot start."""
    said = binary_version(pa.path, r"(?s)(.*\S)", PerfAnalyzerNotFound, pa.env())
    # The wheel's build prints no number ("Perf Analyzer Version  (commit unknown)"): name its pin instead.
    return f"from tritonclient {PINS[0].version}" if pa.source == "project" else " ".join(said.split())


@lru_cache
def locate() -> ToolBinary:
    """The one ``PERF_ANALYZER`` names, else the project's, else PATH's (NVIDIA's Triton SDK image on the lab
    node), checked to start. The first that exists decides: a broken PERF_ANALYZER is an error, not skipped."""
    pa = choose_binary(get_settings().perf_analyzer, "PERF_ANALYZER", install_dir() / "bin" / "perf_analyzer",
                       "perf_analyzer", library_path=str(install_dir() / "lib"))
    if pa is None:
        raise PerfAnalyzerNotFound(f"perf_analyzer is not installed: {INSTALL_HINT}; {SDK_IMAGE_HINT}")
    try:
        return replace(pa, version=_version(pa))
    except PerfAnalyzerNotFound as exc:
        fix = f"install {LIBB64_PACKAGE} or {INSTALL_HINT}" if LIBB64 in str(exc) else INSTALL_HINT
        raise PerfAnalyzerNotFound(f"{exc}; {fix}") from None


# --- installing ------------------------------------------------------------------------------------


def _download(pin: Pin, into: Path) -> Path:
    """The pinned wheel through pip (its cache and index settings), hash-checked by pip and by us."""
    requirement = into / f"{pin.package}.txt"
    requirement.write_text(f"{pin.package}=={pin.version} --hash=sha256:{pin.sha256}\n")
    local = wheelhouse()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--require-hashes",
         *(["--find-links", str(local)] if local else []), "--dest", str(into), "-r", str(requirement)],
        capture_output=True, text=True,
    )
    wheels = [w for w in into.glob("*.whl") if w.name.lower().startswith(pin.package.replace("-", "_"))]
    if done.returncode != 0 or len(wheels) != 1:
        raise InstallError(f"could not download {pin.package}=={pin.version}: {done.stderr.strip()[-1500:]}")
    if sha256_file(wheels[0]) != pin.sha256:
        raise InstallError(f"{wheels[0].name}: sha256 differs from the pinned {pin.sha256}")
    return wheels[0]


def _manifest() -> dict:
    return {pin.package: f"{pin.version} sha256:{pin.sha256}" for pin in PINS}


def installed() -> bool:
    """The project's copy is there and was made from the current pins."""
    try:
        return json.loads((install_dir() / "installed.json").read_text()).get("wheels") == _manifest()
    except (OSError, ValueError):
        return False


def extract_pinned(home: Path, scratch: Path, log=print) -> None:
    """perf_analyzer into ``home/bin`` and libcudart into ``home/lib``, from the pinned wheels
    (also the stand-in Triton SDK image of `servelab containers`, which adds libb64 with apt)."""
    for pin in PINS:
        (home / pin.dest).mkdir(parents=True, exist_ok=True)
        wheel = _download(pin, scratch)
        with zipfile.ZipFile(wheel) as zf:
            taken = Path(zf.extract(pin.member, wheel.parent))
        taken.chmod(0o755)
        place(taken, home / pin.dest / taken.name)
        log(f"perf_analyzer: {home / pin.dest / taken.name} from {wheel.name} (sha256 verified)")


def install(log=print) -> ToolBinary:
    """Download the pinned wheels, take out perf_analyzer and libcudart, add libb64; check it starts."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise InstallError(f"the pinned perf_analyzer is an x86_64 Linux binary; this is {platform.system()} "
                           f"{platform.machine()}: {SDK_IMAGE_HINT}")
    home = install_dir()
    (home / "installed.json").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="servelab-pa-install-") as tmp:
        extract_pinned(home, Path(tmp), log)  # it makes bin/ and lib/
        deb = add_library(LIBB64, LIBB64_PACKAGE, home / "lib", Path(tmp),
                          f"install {LIBB64_PACKAGE} (the b64 library, {LIBB64})")
        log(f"perf_analyzer: {LIBB64} from {f'{deb.name} (unpacked)' if deb else 'system'}")
    locate.cache_clear()
    pa = ToolBinary(home / "bin" / "perf_analyzer", "project", library_path=str(home / "lib"))
    pa = replace(pa, version=_version(pa))
    (home / "installed.json").write_text(json.dumps({"wheels": _manifest()}, indent=1) + "\n")
    return pa
