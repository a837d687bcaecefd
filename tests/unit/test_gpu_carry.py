"""`make gpu-carry` and servelab/tools/gpu_carry.py (docs/gpu/README.md): a small wheelhouse of real files, a
1 MiB folder limit so each test is quick, the real Makefile target, and the join run as the GPU machine runs it (the
script by its path, in a subprocess), into a fresh folder."""

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "servelab" / "tools" / "gpu_carry.py"
MIB = 1 << 20
SIZES = {  # bytes: small files, one just under the limit, one several times over it, a .deb
    "numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl": 600_000,
    "zope_event-6.2-py3-none-any.whl": 9_000,
    "pillow-13.0.0-cp312-cp312-manylinux_2_28_x86_64.whl": 700_000,
    "setuptools-81.0.0-py3-none-any.whl": 400_000,
    "near_limit-1.0-py3-none-any.whl": MIB - 100,
    "big_wheel-2.0-cp312-cp312-manylinux_2_28_x86_64.whl": 3 * MIB + 500_000,
    "prometheus_2.42.0+ds-5+deb12u1_amd64.deb": 300_000,
}
BIG = "big_wheel-2.0-cp312-cp312-manylinux_2_28_x86_64.whl"


@pytest.fixture
def house(tmp_path: Path) -> Path:
    """A wheelhouse as `make gpu-wheelhouse` leaves it: whole files and `sha256sum`'s SHA256SUMS."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    rng = random.Random(31)
    for name, size in SIZES.items():
        (folder / name).write_bytes(rng.randbytes(size))
    sums = subprocess.run(["sha256sum", *SIZES], cwd=folder, capture_output=True, text=True, check=True).stdout
    (folder / "SHA256SUMS").write_text(sums)
    return folder


def make_carry(house: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    # -o: never rebuild .venv from a test; the target only needs its python.
    return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "gpu-carry",
                           f"GPU_WHEELHOUSE={house}", f"GPU_CARRY={out}", "CARRY_SIZE=1M", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def gpu_carry(*args, python: str = sys.executable) -> subprocess.CompletedProcess:
    """The script as the GPU machine runs it: by its path, with only the standard library."""
    return subprocess.run([python, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def copied(out: Path, to: Path) -> Path:
    """The folders as the calls leave them on the GPU machine: each copied into one folder (its /tmp/carry)."""
    for folder in sorted(out.iterdir()):
        shutil.copytree(folder, to / folder.name)
    return to


def test_every_folder_fits_the_limit_and_the_join_gives_the_same_bytes(house, tmp_path):
    out = tmp_path / "carry"
    done = make_carry(house, out)
    assert done.returncode == 0, done.stdout + done.stderr
    folders = sorted(out.iterdir())
    for folder in folders:
        assert sum(f.stat().st_size for f in folder.iterdir()) <= MIB, folder.name
    total = sum(SIZES.values())
    assert len(folders) <= -(-total // MIB) + 1  # packed tightly: at most one folder over the bound
    manifest = json.loads((folders[0] / "carry.json").read_text())
    parts = {f["name"]: f["parts"] for f in manifest["files"]}
    assert len(parts[BIG]) == 4 and all(p["name"].startswith(f"{BIG}.part-") for p in parts[BIG])
    assert all(p["size"] <= MIB for ps in parts.values() for p in ps)

    carry_in = copied(out, tmp_path / "tmp-carry")
    joined = tmp_path / "fresh" / "wheelhouse"
    done = gpu_carry("join", carry_in, joined)
    assert done.returncode == 0, done.stderr
    for name in SIZES:
        assert (joined / name).read_bytes() == (house / name).read_bytes(), name
    assert subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=joined).returncode == 0
    assert gpu_carry("check", joined).returncode == 0
    assert not list(joined.parent.glob(".*"))  # no staging folder left beside it


def test_a_corrupt_part_or_a_missing_folder_is_named_and_nothing_is_joined(house, tmp_path):
    out = tmp_path / "carry"
    assert make_carry(house, out).returncode == 0
    carry_in = copied(out, tmp_path / "tmp-carry")
    part = next(carry_in.glob(f"*/{BIG}.part-01"))
    data = bytearray(part.read_bytes())
    data[1000] ^= 0xFF
    part.write_bytes(bytes(data))
    joined = tmp_path / "joined"

    done = gpu_carry("join", carry_in, joined)
    assert done.returncode == 1 and not joined.exists()
    assert f"corrupt: {part.parent.name}/{BIG}.part-01 (part of {BIG})" in done.stderr
    done = gpu_carry("check", part.parent)
    assert done.returncode == 1 and f"{BIG}.part-01" in done.stderr

    gone = sorted(carry_in.iterdir())[-1]
    shutil.rmtree(gone)
    done = gpu_carry("join", carry_in, joined)
    assert done.returncode == 1 and f"missing: folder {gone.name} (not copied to {carry_in})" in done.stderr


def test_wheels_the_gpu_python_has_are_left_out_and_the_join_still_checks(house, tmp_path):
    # A GPU_PYTHON that is a venv (as the H100's is) with distributions of its own: its preflight is the HAVE list.
    venv = tmp_path / "gpu-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(gpu_carry("sites", python=str(python)).stdout.split()[0])
    for name, version in [("NumPy", "1.26.4"), ("zope.event", "6.2"), ("setuptools", "81.0.0"), ("Pillow", "12.3.0")]:
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    have = tmp_path / "preflight.txt"
    done = gpu_carry("preflight", python=str(python))
    assert done.returncode == 0, done.stderr
    have.write_text(done.stdout)
    assert "NumPy==1.26.4" in done.stdout.splitlines()

    out = tmp_path / "carry"
    done = make_carry(house, out, f"HAVE={have}")
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads(next(out.glob("*/carry.json")).read_text())
    left_out = {e["name"]: e["reason"] for e in manifest["left_out"]}
    numpy, zope = next(n for n in SIZES if n.startswith("numpy")), "zope_event-6.2-py3-none-any.whl"
    assert set(left_out) == {numpy, zope}  # PEP 503 names; pillow's version differs; setuptools is kept
    assert left_out[numpy] == f"the GPU machine has numpy==1.26.4 ({have}): pip takes it as installed"
    kept = {f["name"]: f.get("kept") for f in manifest["files"]}
    assert "the file itself is needed" in kept["setuptools-81.0.0-py3-none-any.whl"]

    joined = tmp_path / "joined"
    done = gpu_carry("join", copied(out, tmp_path / "tmp-carry"), joined)
    assert done.returncode == 0, done.stderr
    assert f"left out {numpy}" in done.stdout
    assert not (joined / numpy).exists() and (joined / "setuptools-81.0.0-py3-none-any.whl").exists()
    assert subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=joined).returncode == 0


def test_preflight_lists_what_this_python_has_with_its_version():
    done = gpu_carry("preflight")
    assert done.returncode == 0, done.stderr
    pip_version = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True,
                                 check=True).stdout.split()[1]  # "pip X.Y from ..."
    assert f"pip=={pip_version}" in done.stdout.splitlines()
    assert done.stdout.startswith(f"# {sys.executable}: Python ")


@pytest.mark.parametrize("args, message", [
    (["CARRY_SIZE=lots"], "size 'lots': give a positive number of bytes"),
    (["CARRY_SIZE=100"], "a folder limit of 100 bytes is too small"),
    (["HAVE=/nonexistent/preflight.txt"], "HAVE list /nonexistent/preflight.txt: No such file or directory"),
])
def test_bad_input_gets_a_clear_error(house, tmp_path, args, message):
    done = make_carry(house, tmp_path / "carry", *args)
    assert done.returncode != 0 and message in done.stderr
    assert not (tmp_path / "carry").exists()


def test_a_bad_have_line_or_a_wheelhouse_that_does_not_check_is_named(house, tmp_path):
    have = tmp_path / "preflight.txt"
    have.write_text("# a comment\nnumpy==1.26.4\nnumpy 1.26.4\n")
    done = make_carry(house, tmp_path / "carry", f"HAVE={have}")
    assert done.returncode != 0 and f"{have} line 3: 'numpy 1.26.4' is not name==version" in done.stderr
    (house / "zope_event-6.2-py3-none-any.whl").write_bytes(b"not the wheel that was downloaded")
    done = make_carry(house, tmp_path / "carry")
    assert done.returncode != 0 and "zope_event-6.2-py3-none-any.whl: sha256 differs from SHA256SUMS" in done.stderr
