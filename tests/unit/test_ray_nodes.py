"""Two nodes for the Ray Serve stages (servelab.run.walkthrough.ray_nodes), against autospec doubles of the
installed python-chi: a call the real library would refuse (a wrong keyword, a method it does not
have) fails here too. The compose commands it sends to the nodes are checked against the real
compose files."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import astuple
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from unittest import mock

import chi.exception
import chi.lease
import chi.server
import pytest

from chi_doubles import arguments, fixed_address, server_per_name
from dockerspec import REPO, load_compose
from servelab.run.walkthrough import chameleon, ray_nodes
from servelab.run.walkthrough.ray_nodes import RayNodes

UTC = timezone.utc
LENGTH = timedelta(hours=2, minutes=55)
START = datetime(2030, 1, 7, 13, tzinfo=UTC)
NODES = RayNodes.for_student("ab1234")


def reservation(rid: str, node_type: str) -> dict:
    """A node reservation as Blazar lists it in a lease (resource_properties is a JSON string)."""
    return {"id": rid, "resource_type": "physical:host", "resource_properties": json.dumps(["==", "$node_type", node_type])}


@pytest.fixture
def chi_api() -> Iterator[SimpleNamespace]:
    real_lease, real_server = chi.lease.Lease, chi.server.Server
    targets = ("chi.hardware.get_nodes", "chi.lease.Lease", "chi.lease.get_lease", "chi.server.Server", "chi.server.get_server")
    with ExitStack() as stack:
        doubles = SimpleNamespace(**{t.rsplit(".", 1)[1]: stack.enter_context(mock.patch(t, autospec=True)) for t in targets})
        doubles.Server.side_effect = server_per_name(real_server)
        doubles.made = doubles.Server.side_effect.made
        doubles.real_lease, doubles.real_server = real_lease, real_server
        yield doubles


def a_lease(real_lease: type, *reservations: dict) -> mock.Mock:
    found = mock.create_autospec(real_lease, instance=True)
    found.name, found.status, found.node_reservations = NODES.lease, "ACTIVE", list(reservations)
    return found


def test_names_follow_the_students_net_id() -> None:
    assert NODES == RayNodes("serve_ray_ab1234", "node-ray-head-ab1234", "node-ray-worker-ab1234")


def test_two_gpu_nodes_are_one_reservation_of_two(chi_api) -> None:
    ray_nodes.reserve(NODES.lease, START, LENGTH, "gpu_p100", "gpu_p100")
    (made,) = chi_api.Lease.call_args_list
    assert arguments(made, chi_api.Lease) == {"name": "serve_ray_ab1234", "start_date": START, "end_date": START + LENGTH}
    new = chi_api.Lease.return_value
    new.add_node_reservation.assert_called_once_with(amount=2, node_type="gpu_p100")
    new.submit.assert_called_once_with(idempotent=True, wait_for_active=False)


def test_a_gpu_head_and_a_cpu_worker_are_two_reservations(chi_api) -> None:
    ray_nodes.reserve(NODES.lease, START, LENGTH, "gpu_p100", "compute_cascadelake_r")
    assert chi_api.Lease.return_value.add_node_reservation.call_args_list == [
        mock.call(amount=1, node_type="gpu_p100"), mock.call(amount=1, node_type="compute_cascadelake_r")]


def test_each_server_boots_on_its_own_reservation_with_a_floating_ip(chi_api) -> None:
    found = a_lease(chi_api.real_lease, reservation("res-gpu", "gpu_p100"), reservation("res-cpu", "compute_cascadelake_r"))
    head, worker = ray_nodes.start_servers(found, NODES, "gpu_p100", "compute_cascadelake_r", "servelab-abc1234")

    assert chi_api.Server.call_args_list == [  # the class's prepared image, as 9_ray_setup's IMAGE names it
        mock.call("node-ray-head-ab1234", reservation_id="res-gpu", image_name="servelab-abc1234"),
        mock.call("node-ray-worker-ab1234", reservation_id="res-cpu", image_name="servelab-abc1234"),
    ]
    # The instructor's security groups: SSH on both, GourmetGram on the head alone (2_create_server_nvidia's).
    assert [c.args[0] for c in head.add_security_group.call_args_list] == ["servelab-allow-tcp-22", "servelab-allow-tcp-5000"]
    assert [c.args[0] for c in worker.add_security_group.call_args_list] == ["servelab-allow-tcp-22"]
    assert [head, worker] == list(chi_api.made.values())
    for s in (head, worker):
        s.submit.assert_called_once_with(idempotent=True, wait_for_active=False)
        s.wait.assert_called_once_with(status="ACTIVE")
        s.associate_floating_ip.assert_called_once_with()
        s.check_connectivity.assert_called_once_with()
    # Both submitted before either is waited for: the two nodes boot at the same time.
    assert head.submit.called and worker.submit.called
    assert (ray_nodes.private_address(head), ray_nodes.private_address(worker)) == (fixed_address(0), fixed_address(1))


def test_a_server_that_has_a_floating_ip_gets_no_second_one(chi_api) -> None:
    """Running the cell again (servers exist: submit(idempotent=True) finds them) keeps their addresses."""
    existing = [mock.create_autospec(chi_api.real_server, instance=True) for _ in range(2)]
    for s in existing:
        s.get_floating_ip.return_value = "192.0.2.30"
    chi_api.Server.side_effect = existing
    found = a_lease(chi_api.real_lease, reservation("res-gpu", "gpu_p100"))
    assert ray_nodes.start_servers(found, NODES, "gpu_p100", "gpu_p100") == tuple(existing)
    assert [c.kwargs["reservation_id"] for c in chi_api.Server.call_args_list] == ["res-gpu", "res-gpu"]
    for s in existing:
        s.associate_floating_ip.assert_not_called()
        s.check_connectivity.assert_called_once_with()


def test_a_lease_without_the_worker_type_is_refused(chi_api) -> None:
    found = a_lease(chi_api.real_lease, reservation("res-gpu", "gpu_p100"), reservation("res-x", "storage"))
    assert ray_nodes.reservation_id(found, "gpu_p100") == "res-gpu"
    with pytest.raises(ValueError, match="no reservation for compute_cascadelake_r"):
        ray_nodes.reservation_id(found, "compute_cascadelake_r")


def test_private_address_is_the_fixed_ipv4_one(chi_api) -> None:
    s = chi_api.Server("node-ray-head-ab1234")
    s.addresses = {"sharednet1": [{"addr": "fe80::1", "version": 6, "OS-EXT-IPS:type": "fixed"},
                                  {"addr": "129.114.0.5", "version": 4, "OS-EXT-IPS:type": "floating"},
                                  {"addr": "10.52.3.4", "version": 4, "OS-EXT-IPS:type": "fixed"}]}
    assert ray_nodes.private_address(s) == "10.52.3.4"
    s.addresses = {}
    with pytest.raises(ValueError, match="no fixed IPv4 address"):
        ray_nodes.private_address(s)


def test_only_gpu_nodes_get_the_nvidia_toolkit() -> None:
    gpu = ray_nodes.prepare_commands("https://git.example.org/servelab.git", gpu=True)
    cpu = ray_nodes.prepare_commands("https://git.example.org/servelab.git", gpu=False)
    assert gpu[0] == "test -d ~/servelab/.git || git clone https://git.example.org/servelab.git ~/servelab"
    assert any("nvidia-container-toolkit" in c for c in gpu) and not any("nvidia" in c for c in cpu)
    for commands in (gpu, cpu):
        # servelab and the lab's model (each node mounts its own models/), not the images: Ray's are its own.
        assert "cd ~/servelab && bin/node-setup --no-images" in commands
        # Docker is restarted after its configuration changed, and before anything uses it.
        restart = commands.index("sudo systemctl restart docker")
        assert all("daemon.json" not in c and "nvidia-ctk" not in c for c in commands[restart:])


def test_the_cluster_files_never_print_the_token() -> None:
    token = ray_nodes.new_token()
    assert re.fullmatch(r"[0-9a-f]{64}", token) and token != ray_nodes.new_token()
    command = ray_nodes.cluster_files(token, "10.52.0.11", "10.52.0.10")
    assert command.startswith("umask 077 && ") and "echo" not in command and "cat" not in command
    words = shlex.split(command)
    assert words[words.index(token) + 1:words.index(token) + 3] == [">", "~/servelab/.ray-cluster/auth_token"]


def test_the_firewall_lets_in_only_the_other_node_ssh_and_the_public_page() -> None:
    command = ray_nodes.firewall(["10.52.0.11"], [22, 5000])
    rules = [c.split(f"-A {ray_nodes.CHAIN} ", 1)[1] for c in command.split(" && ") if f"-A {ray_nodes.CHAIN} " in c]
    assert rules == ["-i lo -j ACCEPT", "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT", "-s 10.52.0.11 -j ACCEPT",
                     "-p tcp --dport 22 -j ACCEPT", "-p tcp --dport 5000 -j ACCEPT", "-p tcp --syn -j DROP"]
    # Running it again flushes the chain instead of stacking a second copy into INPUT.
    assert command.startswith(f"(sudo iptables -N {ray_nodes.CHAIN} 2>/dev/null || sudo iptables -F {ray_nodes.CHAIN})")
    assert command.endswith(f"(sudo iptables -C INPUT -j {ray_nodes.CHAIN} 2>/dev/null || sudo iptables -I INPUT -j {ray_nodes.CHAIN})")


def _compose_calls(s: mock.Mock) -> list[list[str]]:
    """The `docker compose` commands a server double was asked to run, as argv after `cd ~/servelab &&`."""
    found = []
    for recorded in s.execute.call_args_list:
        (command,) = recorded.args
        assert recorded.kwargs == {}
        if " docker compose " in command:
            found.append(shlex.split(command.split(" && ", 1)[1]))
    return found


@pytest.mark.parametrize("worker_gpu", [True, False], ids=["gpu-worker", "cpu-worker"])
def test_bring_up_starts_the_head_first_and_names_real_services(chi_api, worker_gpu: bool) -> None:
    head, worker = chi_api.Server("node-ray-head-ab1234"), chi_api.Server("node-ray-worker-ab1234")
    ray_nodes.bring_up(head, worker, worker_gpu=worker_gpu, wait_s=60)

    head_calls, worker_calls = _compose_calls(head), _compose_calls(worker)
    assert head_calls[0][-4:] == ["-d", "--wait", "--force-recreate", "ray_head"]
    assert worker_calls == [["docker", "compose", "-f", ray_nodes.WORKER_COMPOSE,
                             *([] if worker_gpu else ["--profile", "cpu"]), "up", "-d", "--force-recreate",
                             "ray_worker" if worker_gpu else "ray_worker_cpu"]]
    for argv in head_calls + worker_calls:
        path = REPO / argv[3]
        document = load_compose(path, NODE_PRIVATE_IP="10.52.0.10")
        services = [w for w in argv[argv.index("up") + 1 if "up" in argv else argv.index("exec") + 1:] if not w.startswith("-")]
        assert services[:1] and services[0] in document["services"], argv
    commands = [c.args[0] for c in head.execute.call_args_list]
    (wait,) = [c for c in commands if "exec -T ray_head python -c" in c]
    probe = shlex.split(wait)[-1]
    assert "sum(n['Alive'] for n in ray.nodes())) < 2:" in probe and "time.monotonic() + 60" in probe
    compile(probe, "probe", "exec")  # the snippet the head's Python runs is valid Python
    assert commands[-1].endswith("exec -T ray_head ray status")
    assert commands.index(wait) > commands.index(next(c for c in commands if "up -d flask jupyter" in c))
    worker.execute.assert_called_once()  # only its own compose file


def test_release_deletes_what_exists_and_goes_on(chi_api) -> None:
    chi_api.get_server.side_effect = [mock.create_autospec(chi_api.real_server, instance=True),
                                      chi.exception.CHIValueError("no server")]
    found = a_lease(chi_api.real_lease)
    chi_api.get_lease.return_value = found
    done = ray_nodes.release(NODES)
    assert chi_api.get_server.call_args_list == [mock.call("node-ray-head-ab1234"), mock.call("node-ray-worker-ab1234")]
    chi_api.get_lease.assert_called_once_with("serve_ray_ab1234")
    found.delete.assert_called_once_with()
    assert done == ["deleted server node-ray-head-ab1234", "no server node-ray-worker-ab1234 (CHIValueError: no server)",
                    "deleted lease serve_ray_ab1234"]


@pytest.mark.parametrize(("user", "net_id", "confirm", "refused"), [
    ("ab1234", "ab1234", "", False), ("AB1234@nyu.edu", "ab1234", "", False), ("ab1234_nyu_edu", "ab1234", "", False),
    ("ab1234_nyu_edu", "ab1235", "", True), ("ab1234_nyu_edu", "ab1235", "ab1235", False),
    ("", "ab1234", "", True),  # no user name known: only a second yes deletes
    ("ab123", "ab1234", "", True),  # a part of the name is not enough: the name must end in it
])
def test_only_names_that_end_in_the_jupyter_user_s_are_deleted_without_a_second_yes(user, net_id, confirm, refused) -> None:
    names = [f"node-serve-system-{net_id}", f"serve_system_{net_id}", *astuple(RayNodes.for_student(net_id))]
    if refused:
        with pytest.raises(ValueError, match=f"Not deleted: node-serve-system-{net_id}, serve_system_{net_id}, "
                                             f"serve_ray_{net_id}, .* set CONFIRM_NET_ID = '{net_id}'"):
            chameleon.not_yours(names, net_id, confirm, user=user)
    else:
        chameleon.not_yours(names, net_id, confirm, user=user)
