"""What the lab node lets in from the internet is one list (servelab.core.exposure): the security groups
2_create_server_nvidia attaches open SSH and that list only, the notebooks' tunnels forward only ports that
are on the node's 127.0.0.1, and ``servelab secrets`` writes the compose files' secrets for their owner
only. (The compose files are held to the same list by test_compose.py.)"""

import re
import stat
from pathlib import Path

import pytest

from servelab.cli import main
from servelab.core import exposure
from servelab.core.paths import REPO_ROOT
from servelab.run.walkthrough import node_setup, ray_nodes
from servelab.tools.containers import node_secrets

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
# A page a notebook sends students to on the node's public address (http://A.B.C.D:PORT) must be public.


def test_the_security_groups_open_ssh_and_the_public_list_only():
    ports = [port for _, port, _ in node_setup.SECURITY_GROUPS]
    assert ports == [exposure.SSH_PORT, *exposure.public_ports()] == [22, 5000]
    names = [name for name, _, _ in node_setup.SECURITY_GROUPS]
    assert all(name.endswith(f"-{port}") for name, port in zip(names, ports)), "a group found by name has that port's rule"
    assert len(set(names)) == len(names) and all(why for _, _, why in node_setup.SECURITY_GROUPS)


def test_the_provisioning_notebooks_open_only_the_listed_groups():
    """The instructor's cell (1_create_lease) makes the groups of node_setup.SECURITY_GROUPS alone; the student's
    notebook attaches those groups before it asks for a floating IP, and makes none (the executed notebooks,
    tests/e2e/test_notebooks.py, check the calls)."""
    made = (NOTEBOOKS / "1_create_lease.md").read_text()
    assert "groups=node_setup.SECURITY_GROUPS" in made  # classroom.make_security_groups: one ingress rule per group
    attached = (NOTEBOOKS / "2_create_server_nvidia.md").read_text()
    assert "for name, port, why in node_setup.SECURITY_GROUPS:" in attached and "add_rule" not in attached
    assert attached.index("s.add_security_group(name)") < attached.index("s.associate_floating_ip()")


def test_the_ray_nodes_firewall_lets_in_the_same_public_port():
    assert ray_nodes.SSH_PORT == exposure.SSH_PORT and ray_nodes.GOURMETGRAM_PORT in exposure.public_ports()


def test_notebook_tunnels_forward_only_what_the_node_keeps_on_its_loopback():
    tunnels, public_pages = [], set()
    for path in sorted(NOTEBOOKS.glob("*.md")):
        text = path.read_text()
        for forwards in re.findall(r"ssh((?: -L \d+:127\.0\.0\.1:\d+)+)", text):
            tunnels += [(path.stem, int(a), int(b)) for a, b in re.findall(r"-L (\d+):127\.0\.0\.1:(\d+)", forwards)]
        public_pages |= {(path.stem, int(port)) for port in re.findall(r"http://A\.B\.C\.D:(\d+)", text)}
    assert tunnels and all(port in exposure.TUNNELLED for _, _, port in tunnels), tunnels
    assert {(stem, port) for stem, _, port in tunnels} >= {("3_fastapi_setup", 8888), ("3_fastapi_setup", 8000)}
    assert {port for _, port in public_pages} >= {5000}
    wrong = {(stem, port) for stem, port in public_pages if port not in exposure.public_ports()}
    assert not wrong, f"pages on the public address that are not public: {wrong}"


def test_the_tunnel_command_forwards_loopback_ports_only():
    assert exposure.tunnel("192.0.2.10") == ("ssh -L 8888:127.0.0.1:8888 -L 8000:127.0.0.1:8000 -L 3000:127.0.0.1:3000 "
                                              "-i ~/.ssh/id_rsa_chameleon cc@192.0.2.10")
    with pytest.raises(ValueError, match="5000"):
        exposure.tunnel("192.0.2.10", (5000,))


def test_servelab_secrets_writes_each_secret_once_for_its_owner_only(tmp_path: Path):
    folder = tmp_path / ".secrets"
    assert node_secrets.write(folder) == {"lab.env": "written", "grafana.env": "written"}
    first = {name: node_secrets.read(folder / name) for name in node_secrets.FILES}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name, variable in node_secrets.FILES.items():
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
        assert len(first[name][variable]) >= 40 and re.fullmatch(r"[\w-]+", first[name][variable])
    assert first["lab.env"]["ADMIN_TOKEN"] != first["grafana.env"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert node_secrets.write(folder) == {"lab.env": "kept", "grafana.env": "kept"}
    assert {name: node_secrets.read(folder / name) for name in node_secrets.FILES} == first
    node_secrets.write(folder, rotate=True)
    assert node_secrets.read(folder / "lab.env")["ADMIN_TOKEN"] != first["lab.env"]["ADMIN_TOKEN"]


def test_the_command_never_prints_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setattr("servelab.cli.node_secrets.SECRETS_DIR", tmp_path / ".secrets")
    monkeypatch.setattr("servelab.cli.node_secrets.write", lambda rotate: node_secrets.write(tmp_path / ".secrets", rotate))
    monkeypatch.setattr("servelab.cli.node_secrets.REPO_ROOT", tmp_path)
    assert main(["secrets"]) == 0
    printed = capsys.readouterr().out
    assert "written .secrets/lab.env (ADMIN_TOKEN)" in printed and "grafana.env" in printed
    for name in node_secrets.FILES:
        for value in node_secrets.read(tmp_path / ".secrets" / name).values():
            assert value not in printed


def test_node_setup_writes_the_secrets_after_servelab_is_installed():
    assert node_setup.SERVELAB == ["cd ~/servelab && bin/node-setup --no-images"]
    script = (REPO_ROOT / "bin" / "node-setup").read_text()
    assert script.index("pip install") < script.index(".venv/bin/servelab secrets\n")
