"""The tool installers: which binary the lab starts, and their Debian packages on a machine without network:
taken from the wheelhouse (``SERVELAB_WHEELHOUSE``, as `make gpu-check` sets it), with no apt-get to fall back on."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servelab.core.installers.opt_tools import InstallError, ToolBinary, choose_binary, place, unpack_deb, unpack_pinned
from servelab.core.settings import get_settings

PATH = os.environ["PATH"]
APT_GET = shutil.which("apt-get")


@pytest.fixture
def no_apt(tmp_path, monkeypatch) -> Path:
    """A PATH with dpkg (and the dpkg-deb it runs) but no apt-get: the H100 machine's situation, where
    apt-get was there but could reach nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dpkg", "dpkg-deb", "tar"):
        found = shutil.which(tool)
        assert found, f"{tool} is part of every Debian/Ubuntu machine"
        (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def _wheelhouse(folder: Path, monkeypatch) -> Path:
    monkeypatch.setenv("SERVELAB_WHEELHOUSE", str(folder))
    get_settings.cache_clear()
    return folder


@pytest.fixture(autouse=True)
def _fresh_settings():
    yield
    get_settings.cache_clear()


def test_a_deb_in_the_wheelhouse_is_unpacked_without_apt(tmp_path, monkeypatch, no_apt):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    # What `make gpu-wheelhouse` does on a networked machine (apt checks the package against its lists).
    subprocess.run([APT_GET, "download", "libb64-0d"], cwd=house, check=True, capture_output=True,
                   env={"PATH": PATH})
    _wheelhouse(house, monkeypatch)
    (scratch := tmp_path / "scratch").mkdir()
    root, deb = unpack_deb("libb64-0d", scratch, "install libb64-0d")
    assert deb.parent == house and deb.name.startswith("libb64-0d_")
    assert [p.name for p in root.rglob("libb64.so.0d")] == ["libb64.so.0d"]


def test_without_the_deb_or_apt_the_error_says_what_to_do(tmp_path, monkeypatch, no_apt):
    _wheelhouse(tmp_path / "empty", monkeypatch)  # not a folder: as if unset
    (scratch := tmp_path / "scratch").mkdir()
    with pytest.raises(InstallError, match=r"no apt-get here and no prometheus_\*\.deb in SERVELAB_WHEELHOUSE: "
                                           r"install it yourself"):
        unpack_deb("prometheus", scratch, "install it yourself")
    assert not any(scratch.iterdir())  # nothing half-written


def test_a_package_off_its_pinned_line_is_refused_and_one_on_it_placed_whole(tmp_path, monkeypatch, no_apt):
    """A real .deb (dpkg-deb builds it) named as apt names one, epoch and '+' quoted: its upstream version is read
    from the name; another line than the one pinned is refused, saying what to do; the binary is placed whole."""
    tree = tmp_path / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text("Package: servelab-probe\nVersion: 5:1.2.3+ds-1\nArchitecture: all\n"
                                             "Maintainer: servelab\nDescription: a test package\n")
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "usr" / "bin" / "probe").write_text("#!/bin/sh\necho probe 1.2.3\n")
    house = _wheelhouse(tmp_path / "wheelhouse", monkeypatch)
    house.mkdir()
    subprocess.run(["dpkg-deb", "--build", str(tree), str(house / "servelab-probe_5%3a1.2.3%2bds-1_all.deb")],
                   check=True, capture_output=True)
    (scratch := tmp_path / "scratch").mkdir()
    with pytest.raises(InstallError, match=r"servelab-probe 1\.2\.3\+ds-1; servelab is checked against 2\.x "
                                           r"\(Debian 12\): set PROBE"):
        unpack_pinned("servelab-probe", scratch, "2.", "set PROBE")
    root, deb, version = unpack_pinned("servelab-probe", tmp_path / "scratch", "1.2.", "set PROBE")
    assert version == "1.2.3+ds-1" and deb.parent == house
    (bin_dir := tmp_path / "opt" / "bin").mkdir(parents=True)
    place(root / "usr" / "bin" / "probe", bin_dir / "probe")
    assert [p.name for p in bin_dir.iterdir()] == ["probe"] and "probe 1.2.3" in (bin_dir / "probe").read_text()


def test_a_binary_is_the_one_a_setting_names_else_the_projects_else_the_one_on_path(tmp_path, monkeypatch):
    project, bin_dir = tmp_path / "opt" / "tool", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tool").write_text("#!/bin/sh\n")
    (bin_dir / "tool").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert choose_binary(None, "TOOL", project, "tool") == ToolBinary(bin_dir / "tool", "PATH")
    project.parent.mkdir(parents=True)
    project.write_text("")
    assert choose_binary(None, "TOOL", project, "tool", "lib") == ToolBinary(project, "project", library_path="lib")
    assert choose_binary("/named/tool", "TOOL", project, "tool") == ToolBinary(Path("/named/tool"), "TOOL")
    assert choose_binary(None, "TOOL", tmp_path / "absent", "no-such-tool") is None
    assert ToolBinary(project, "project", library_path="lib").env()["LD_LIBRARY_PATH"].startswith("lib")
