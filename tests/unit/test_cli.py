"""The command line in an image: commands whose modules the image leaves out are absent, the rest work."""

import importlib.abc
import sys

import pytest

from servelab.cli import build_parser


class LeaveOut(importlib.abc.MetaPathFinder):
    """Imports as an image without ``package`` (.dockerignore) would: that package is not there."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, name, path, target=None):
        if name == self.package or name.startswith(f"{self.package}."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def commands() -> set[str]:
    return set(build_parser()._subparsers._group_actions[0].choices)


def left_out(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    monkeypatch.setattr(sys, "meta_path", [LeaveOut(package), *sys.meta_path])
    for name in [m for m in sys.modules if m.startswith("servelab.cli.") or m.startswith(package)]:
        monkeypatch.delitem(sys.modules, name)


def test_the_fastapi_images_serve_without_the_container_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "containers" in commands()
    left_out(monkeypatch, "servelab.tools.containers")
    assert "containers" not in commands() and {"serve", "triton", "load"} <= commands()
    assert build_parser().parse_args(["serve", "fastapi-pt"]).serve_command == "fastapi-pt"


def test_a_servelab_module_that_is_there_but_broken_still_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    left_out(monkeypatch, "servelab.report")  # shipped in every image: its absence is a defect, not a role
    with pytest.raises(ModuleNotFoundError, match="servelab.report"):
        commands()


def test_triton_stage_finds_the_model_control_key_in_the_nodes_shell_and_in_an_image(tmp_path, monkeypatch) -> None:
    """No ADMIN_TOKEN in the node's shell: `servelab triton stage` sends the one `servelab secrets` wrote for the
    compose Triton; an image without the container tools (and without ADMIN_TOKEN) sends none, rather than crash."""
    from servelab.cli import triton
    from servelab.core.settings import get_settings
    from servelab.servers.triton import server
    from servelab.tools.containers import node_secrets

    monkeypatch.delenv("ADMIN_TOKEN", raising=False)
    monkeypatch.setattr(server, "STATE_FILE", tmp_path / "no-server-up.json")
    monkeypatch.setattr(node_secrets, "SECRETS_DIR", tmp_path / ".secrets")
    get_settings.cache_clear()
    try:
        assert triton._control_key("127.0.0.1:8000") == ""
        node_secrets.write(node_secrets.SECRETS_DIR)
        written = node_secrets.read(node_secrets.SECRETS_DIR / "lab.env")["ADMIN_TOKEN"]
        assert triton._control_key("127.0.0.1:8000") == written
        left_out(monkeypatch, "servelab.tools.containers")
        assert triton._control_key("127.0.0.1:8000") == ""
    finally:
        get_settings.cache_clear()
