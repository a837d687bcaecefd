"""The lab notebooks, executed.

The provisioning notebooks (1_, 2_, 9_, 11_) run top to bottom in a real kernel with python-chi
replaced by autospec doubles of the installed library (tests/chi_doubles.py); the last cell of
each run asserts the calls the notebook made. Rendering and what the notebooks may hold:
tests/unit/test_notebooks_render.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nbclient.exceptions import CellExecutionError

from notebook_harness import TESTS_DIR, execute

NET_ID = "ab1234"

# Runs first in the kernel: python-chi doubles, no network, tracebacks without colour codes.
PROLOGUE = f"""
%colors nocolor
import sys
sys.path.insert(0, {str(TESTS_DIR)!r})
import chi_doubles
doubles = chi_doubles.install()
"""


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel")


# --- executed with python-chi doubles ---------------------------------------------------------

CHECK_STUDENT_LEASE = """
from datetime import timedelta
from chi_doubles import arguments

doubles.choose_project.assert_called_once_with()
doubles.choose_site.assert_called_once_with(default="CHI@TACC")
doubles.get_nodes.assert_any_call(node_type="gpu_p100", filter_reserved=True)
for node in doubles.nodes:
    node.next_free_timeslot.assert_called_once_with(minimum_hours=4)

(made,) = doubles.Lease.call_args_list
args = arguments(made, doubles.Lease)
assert set(args) == {"name", "start_date", "end_date"}, args  # not duration: counted from now
assert args["name"] == "serve_system_ab1234"
earliest_free = min(node.next_free_timeslot.return_value[0] for node in doubles.nodes)
start = args["start_date"]
assert start.utcoffset() == timedelta(0) and (start.minute, start.second, start.microsecond) == (0, 0, 0)
assert earliest_free < start <= earliest_free + timedelta(hours=1)
assert args["end_date"] - start == timedelta(hours=2, minutes=55)

new_lease = doubles.Lease.return_value
new_lease.add_node_reservation.assert_called_once_with(amount=1, node_type="gpu_p100")
new_lease.submit.assert_called_once_with(idempotent=True, wait_for_active=False)
"""

CHECK_CLASS_LEASES = """
from datetime import datetime, timezone
from unittest import mock
from chi_doubles import arguments

made = [arguments(recorded, doubles.Lease) for recorded in doubles.Lease.call_args_list]
assert [(args["name"], args["start_date"]) for args in made] == [
    ("serve_system_ab1234", datetime(2030, 1, 7, 15, tzinfo=timezone.utc)),  # the student's own, at START
    ("serve_system_cd5678", datetime(2030, 1, 7, 13, tzinfo=timezone.utc)),  # the class: both free nodes at 13:00
    ("serve_system_ef9012", datetime(2030, 1, 7, 13, tzinfo=timezone.utc)),
]
assert doubles.list_leases.call_count == 2  # the booking, then the status
assert doubles.blazar.return_value.host.list_allocations.call_count == 3  # the budget, the booking, the status
assert [(r.student, r.status) for r in classroom.status(STUDENTS, PARTS)] == [("cd5678", "no lease"), ("ef9012", "no lease")]
new_lease = doubles.Lease.return_value
assert new_lease.add_node_reservation.call_args_list == [
    mock.call(amount=1, node_type="gpu_p100"),
    mock.call(amount=1, node_name="P3-GPU-009"),
    mock.call(amount=1, node_name="P3-GPU-010"),
]
new_lease.submit.assert_has_calls([mock.call(idempotent=True, wait_for_active=False)] * 3)
assert new_lease.submit.call_count == 3
assert rows[0].status == rows[1].status == "reserved"
# The class's security groups, made here once: SSH and the public list (servelab.core.exposure).
from servelab.core.exposure import ingress_ports
rules = [arguments(c, doubles.SecurityGroup.return_value.add_rule) for c in doubles.SecurityGroup.return_value.add_rule.call_args_list]
assert [r["port"] for r in rules] == list(ingress_ports()) == [22, 5000]
assert all(r["direction"] == "ingress" and r["protocol"] == "tcp" for r in rules)
doubles.SecurityGroup.return_value.submit.assert_has_calls([mock.call(idempotent=True)] * 2)
"""

# Two leases named like the class's; only the listed student's may go.
WITH_CLASS_LEASES = """
from datetime import datetime, timezone
from chi_doubles import existing_lease
class_lease = existing_lease(doubles.lease_class, "serve_system_cd5678", datetime(2030, 1, 7, 13, tzinfo=timezone.utc))
other_lease = existing_lease(doubles.lease_class, "serve_system_zz9999", datetime(2030, 1, 7, 13, tzinfo=timezone.utc))
doubles.list_leases.return_value = [class_lease, other_lease]
"""

CHECK_CLASS_DELETED = """
doubles.SecurityGroup.assert_not_called()
class_lease.delete.assert_called_once_with()
other_lease.delete.assert_not_called()
assert [arguments(c, doubles.Lease)["name"] for c in doubles.Lease.call_args_list] == ["serve_system_ab1234"]
"""


CHECK_SERVER = """
from chi_doubles import FLOATING_IP, RESERVATION_ID, arguments

doubles.choose_project.assert_called_once_with()
doubles.choose_site.assert_called_once_with(default="CHI@TACC")
doubles.get_lease.assert_called_once_with("serve_system_ab1234")
doubles.Server.assert_called_once_with(
    "node-serve-system-ab1234", reservation_id=RESERVATION_ID, image_name="CC-Ubuntu24.04-CUDA"
)
s = doubles.new_server
s.submit.assert_called_once_with(idempotent=True, wait_for_active=False)
s.wait.assert_called_once_with(status="ACTIVE")
s.associate_floating_ip.assert_called_once_with()
# Security groups: the instructor's (1_create_lease) are found, none is made, each is attached before the floating IP.
from servelab.run.walkthrough.node_setup import SECURITY_GROUPS
doubles.list_security_groups.assert_called_once_with()
doubles.SecurityGroup.assert_not_called()
assert [c.args[0] for c in s.add_security_group.call_args_list] == [name for name, _, _ in SECURITY_GROUPS]
names = [c[0] for c in s.mock_calls]
assert names.index("add_security_group") < names.index("associate_floating_ip")
s.check_connectivity.assert_called_once_with()
assert ip == FLOATING_IP

commands = [recorded.args[0] for recorded in s.execute.call_args_list]
assert all(recorded.kwargs == {} for recorded in s.execute.call_args_list)

def step(fragment):
    (index,) = [i for i, command in enumerate(commands) if fragment in command]
    return index

assert "git clone https://git.example.org/course/servelab.git ~/servelab" in commands[step("git clone")]
assert step("staff_keys.pub") == step("git clone") + 1  # the class's staff keys, from the clone
assert "/etc/docker/daemon.json" in commands[step("native.cgroupdriver=cgroupfs")]
step("apt-get install -y -q nvidia-container-toolkit")
step("apt-get install -y -q nvtop")
order = [
    step("get.docker.com"),
    step("nvidia-ctk runtime configure --runtime=docker"),
    step("native.cgroupdriver=cgroupfs"),
    step("systemctl restart docker"),
    step("docker run --rm --gpus all"),
]
assert order == sorted(order), commands
assert commands[-1].endswith(" nvidia-smi"), commands
"""

CHECK_DELETE = """
from unittest import mock

doubles.choose_project.assert_called_once_with()
doubles.choose_site.assert_called_once_with(default="CHI@TACC")
# The single node, then the Ray part's two (they exist in the doubles too, so all are deleted).
assert doubles.get_server.call_args_list == [
    mock.call("node-serve-system-ab1234"), mock.call("node-ray-head-ab1234"), mock.call("node-ray-worker-ab1234")]
assert doubles.get_server.return_value.delete.call_count == 3
assert doubles.get_lease.call_args_list == [mock.call("serve_system_ab1234"), mock.call("serve_ray_ab1234")]
assert doubles.active_lease.delete.call_args_list == [mock.call(), mock.call()]
doubles.Server.assert_not_called()
doubles.Lease.assert_not_called()
"""

# Nothing of the Ray part exists: its cell reports that and the notebook still ends.
WITHOUT_RAY_NODES = """
import chi.exception
_single = doubles.get_server.return_value
doubles.get_server.side_effect = lambda name: _single if name == "node-serve-system-ab1234" else (_ for _ in ()).throw(
    chi.exception.ResourceError(f"no server {name}"))
"""

CHECK_RAY_SETUP = r"""
import shlex
from pathlib import Path
from unittest import mock
from chi_doubles import RESERVATION_ID, arguments, fixed_address

doubles.choose_project.assert_called_once_with()
doubles.choose_site.assert_called_once_with(default="CHI@TACC")
(made,) = doubles.Lease.call_args_list
assert arguments(made, doubles.Lease)["name"] == "serve_ray_ab1234"
new_lease = doubles.Lease.return_value
new_lease.submit.assert_called_once_with(idempotent=True, wait_for_active=False)
doubles.get_lease.assert_called_once_with("serve_ray_ab1234")
assert [c.args[0] for c in doubles.Server.call_args_list] == ["node-ray-head-ab1234", "node-ray-worker-ab1234"]
assert all(c.kwargs["image_name"] == "CC-Ubuntu24.04-CUDA" for c in doubles.Server.call_args_list)

head, worker = doubles.Server.side_effect.made.values()
head_ip, worker_ip = fixed_address(0), fixed_address(1)
on_head = [c.args[0] for c in head.execute.call_args_list]
on_worker = [c.args[0] for c in worker.execute.call_args_list]
assert all(c.kwargs == {} for s in (head, worker) for c in s.execute.call_args_list)
for commands in (on_head, on_worker):
    assert commands[0] == "test -d ~/servelab/.git || git clone https://git.example.org/course/servelab.git ~/servelab"
    assert "cd ~/servelab && bin/node-setup --no-images" in commands  # servelab and the model, no images

def token_of(commands, node_ip):
    (files,) = [c for c in commands if "/.ray-cluster/auth_token" in c]
    words = shlex.split(files)
    assert f"NODE_PRIVATE_IP={node_ip}\nHEAD_PRIVATE_IP={head_ip}\n" in words
    return words[words.index("~/servelab/.ray-cluster/auth_token") - 2]

token = token_of(on_head, head_ip)
assert token == token_of(on_worker, worker_ip) and len(token) == 64
Path("token").write_text(token)  # the test checks that no output of the notebook shows it
assert any(f"-s {worker_ip} -j ACCEPT" in c and "--dport 5000" in c for c in on_head)
assert any(f"-s {head_ip} -j ACCEPT" in c and "--dport 5000" not in c and "--dport 22" in c for c in on_worker)
# The head's Ray before the worker's, the worker's before the check that counts both nodes.
assert [i for i, c in enumerate(on_head) if "up -d --wait --force-recreate ray_head" in c] != []
assert on_worker[-1].endswith(WORKER_UP)
assert "sum(n['Alive'] for n in ray.nodes())) < 2" in shlex.split(on_head[-2])[-1]
assert on_head[-1].endswith("exec -T ray_head ray status")
"""


def _ray_setup(kernel_dir: Path, tmp_path: Path, worker_type: str, prologue: str, worker_up: str) -> None:
    nb = execute(
        "9_ray_setup",
        kernel_dir,
        tmp_path,
        parameters={"NET_ID": NET_ID, "REPO_URL": "https://git.example.org/course/servelab.git", "WORKER_NODE_TYPE": worker_type},
        prologue=PROLOGUE + "doubles.Server.side_effect = chi_doubles.server_per_name(doubles.server_class)\n" + prologue,
        epilogue=f"WORKER_UP = {worker_up!r}\n" + CHECK_RAY_SETUP,
    )
    token = (tmp_path / "token").read_text()
    shown = [str(output) for cell in nb.cells if "injected-epilogue" not in cell.metadata.get("tags", [])
             for output in cell.get("outputs", [])]
    assert shown and not any(token in text for text in shown), "the cluster's token must never be printed"


def test_ray_setup_with_two_gpu_nodes(kernel_dir: Path, tmp_path: Path) -> None:
    _ray_setup(kernel_dir, tmp_path, "gpu_p100", "", "up -d --force-recreate ray_worker")


def test_ray_setup_with_a_cpu_worker(kernel_dir: Path, tmp_path: Path) -> None:
    two_reservations = (
        "doubles.active_lease.node_reservations = [\n"
        "    {'id': 'res-gpu', 'resource_type': 'physical:host', 'resource_properties': '[\"==\", \"$node_type\", \"gpu_p100\"]'},\n"
        "    {'id': 'res-cpu', 'resource_type': 'physical:host', 'resource_properties': '[\"==\", \"$node_type\", \"compute_cascadelake_r\"]'}]\n"
    )
    _ray_setup(kernel_dir, tmp_path, "compute_cascadelake_r", two_reservations, "--profile cpu up -d --force-recreate ray_worker_cpu")


def test_create_lease_for_a_student(kernel_dir: Path, tmp_path: Path) -> None:
    execute(
        "1_create_lease", kernel_dir, tmp_path, parameters={"NET_ID": NET_ID}, prologue=PROLOGUE, epilogue=CHECK_STUDENT_LEASE
    )


def test_create_lease_at_a_chosen_time_and_for_a_class(kernel_dir: Path, tmp_path: Path) -> None:
    execute(
        "1_create_lease",
        kernel_dir,
        tmp_path,
        parameters={"NET_ID": NET_ID, "START": "2030-01-07 15:00", "STUDENTS": ["cd5678", "ef9012"],
                    "CLASS_FIRST_DAY": "2030-01-07", "CLASS_LAST_DAY": "2030-01-07", "CLASS_HOURS": (13, 21)},
        prologue=PROLOGUE,
        epilogue=CHECK_CLASS_LEASES,
    )


def test_delete_a_class_s_leases(kernel_dir: Path, tmp_path: Path) -> None:
    execute(
        "1_create_lease",
        kernel_dir,
        tmp_path,
        parameters={"NET_ID": NET_ID, "STUDENTS": ["cd5678"], "DELETE_CLASS_LEASES": True},
        prologue=PROLOGUE + WITH_CLASS_LEASES,
        epilogue="from chi_doubles import arguments\n" + CHECK_CLASS_DELETED,
    )


def test_a_newer_node_type_is_booked_and_started_at_its_site(kernel_dir: Path, tmp_path: Path) -> None:
    site = 'doubles.choose_site.assert_called_once_with(default="CHI@UC")\n'
    execute("1_create_lease", kernel_dir, tmp_path, parameters={"NET_ID": NET_ID, "NODE_TYPE": "gpu_rtx_6000"},
            prologue=PROLOGUE, epilogue=site + "doubles.Lease.return_value.add_node_reservation.assert_called_once_with("
                                              "amount=1, node_type='gpu_rtx_6000')")
    execute("2_create_server_nvidia", kernel_dir, tmp_path,
            parameters={"NET_ID": NET_ID, "REPO_URL": "https://git.example.org/course/servelab.git",
                        "NODE_TYPE": "gpu_a100_pcie"}, prologue=PROLOGUE, epilogue=site)
    with pytest.raises(CellExecutionError, match="'gpu_k80' is not one the lab knows: gpu_p100, gpu_v100"):
        execute("1_create_lease", kernel_dir, tmp_path, parameters={"NET_ID": NET_ID, "NODE_TYPE": "gpu_k80"},
                prologue=PROLOGUE)


def test_create_lease_asks_for_the_net_id_first(kernel_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(CellExecutionError, match="Set NET_ID"):
        execute("1_create_lease", kernel_dir, tmp_path, prologue=PROLOGUE)


def test_create_server(kernel_dir: Path, tmp_path: Path) -> None:
    execute(
        "2_create_server_nvidia",
        kernel_dir,
        tmp_path,
        parameters={"NET_ID": NET_ID, "REPO_URL": "https://git.example.org/course/servelab.git"},
        prologue=PROLOGUE,
        epilogue=CHECK_SERVER,
    )


def test_create_server_without_the_security_groups_or_past_a_timeout_says_what_to_do(kernel_dir: Path, tmp_path: Path) -> None:
    parameters = {"NET_ID": NET_ID, "REPO_URL": "https://git.example.org/course/servelab.git"}
    with pytest.raises(CellExecutionError, match="ask your instructor to run the security-group cell of 1_create_lease"):
        execute("2_create_server_nvidia", kernel_dir, tmp_path, parameters=parameters,
                prologue=PROLOGUE + "doubles.list_security_groups.return_value = []\n")
    timeout = ("import chi.exception\ndoubles.new_server.wait.side_effect = "
               "chi.exception.ServiceError('Timeout waiting for server to reach ACTIVE status')\n")
    # The cell prints the runbook's advice (servelab.run.walkthrough.runbook), then stops with python-chi's error.
    with pytest.raises(CellExecutionError, match="What to do: Run the cell again: it finds the same server") as stopped:
        execute("2_create_server_nvidia", kernel_dir, tmp_path, parameters=parameters, prologue=PROLOGUE + timeout)
    assert "ServiceError: Timeout waiting for server to reach ACTIVE status" in str(stopped.value)
    in_error = "doubles.new_server.status = 'ERROR'\ndoubles.new_server.name = 'node-serve-system-ab1234'\n"
    with pytest.raises(CellExecutionError, match="What to do: Delete it in Horizon") as stopped:
        execute("2_create_server_nvidia", kernel_dir, tmp_path, parameters=parameters, prologue=PROLOGUE + in_error)
    assert "RuntimeError: node-serve-system-ab1234 is in ERROR" in str(stopped.value)


def test_create_lease_for_a_class_with_the_ray_part_and_a_bad_node_replaced(kernel_dir: Path, tmp_path: Path) -> None:
    bad_lease = """
from datetime import datetime, timezone
from chi_doubles import existing_lease
bad = existing_lease(doubles.lease_class, "serve_system_cd5678", datetime(2030, 1, 7, 13, tzinfo=timezone.utc), "ACTIVE")
bad.id = "lease-cd5678"
doubles.list_leases.return_value = [bad]
doubles.blazar.return_value.host.list_allocations.return_value[0]["reservations"] = [
    {"id": "r", "lease_id": "lease-cd5678", "start_date": "2030-01-07T13:00:00.000000", "end_date": "2030-01-07T15:55:00.000000"}]
"""
    check = """
from chi_doubles import arguments
bad.delete.assert_called_once_with()
made = [arguments(c, doubles.Lease)["name"] for c in doubles.Lease.call_args_list]
assert made == ["serve_system_ab1234", "serve_system_cd5678", "serve_ray_cd5678"], made
assert doubles.Lease.return_value.add_node_reservation.call_args_list[-2:] == [
    mock.call(amount=1, node_name="P3-GPU-010"), mock.call(amount=2, node_type="gpu_p100")]
assert [r.status for r in rows] == ["replaced (not on P3-GPU-009)", "reserved"], rows
"""
    nb = execute(
        "1_create_lease", kernel_dir, tmp_path,
        parameters={"NET_ID": NET_ID, "STUDENTS": ["cd5678"], "CLASS_HOURS": (0, 24), "CLASS_WEEKDAYS": list(range(7)), "RAY_PART": True,
                    "REPLACE": {"cd5678": "P3-GPU-009"}, "SU_PER_NODE_HOUR": 2.0},
        prologue=PROLOGUE + bad_lease, epilogue="from unittest import mock\n" + check,
    )
    printed = "".join(output.get("text", "") for cell in nb.cells for output in cell.get("outputs", []))
    assert "the lab: 1 lease x 1 node = 2.9 node-hours = 5.8 SUs; 1 consecutive 3-hour block of the site's nodes" in printed
    assert "the Ray part: 1 lease x 2 nodes = 5.8 node-hours = 11.7 SUs; 1 consecutive 3-hour block" in printed


# Chameleon Jupyter's user: a federated name that holds the student's netID.
AS_STUDENT = f"\nimport os\nos.environ['JUPYTERHUB_USER'] = '{NET_ID}_nyu_edu'\n"


def test_delete_resources(kernel_dir: Path, tmp_path: Path) -> None:
    execute("11_delete_resources", kernel_dir, tmp_path, parameters={"NET_ID": NET_ID}, prologue=PROLOGUE + AS_STUDENT,
            epilogue=CHECK_DELETE)


def test_delete_resources_at_the_site_of_the_node_type(kernel_dir: Path, tmp_path: Path) -> None:
    """A CHI@UC student's node is deleted at CHI@UC, not at the CHI@TACC default."""
    execute("11_delete_resources", kernel_dir, tmp_path, parameters={"NET_ID": NET_ID, "NODE_TYPE": "gpu_v100"},
            prologue=PROLOGUE + AS_STUDENT, epilogue=CHECK_DELETE.replace('"CHI@TACC"', '"CHI@UC"'))


def test_a_mistyped_net_id_deletes_nothing_without_a_second_yes(kernel_dir: Path, tmp_path: Path) -> None:
    """A classmate's netID (ab1235) is refused before python-chi is asked anything; typed again, it is deleted."""
    refused = "Not deleted: node-serve-system-ab1235, serve_system_ab1235, serve_ray_ab1235, node-ray-head-ab1235"
    with pytest.raises(CellExecutionError, match=refused):
        execute("11_delete_resources", kernel_dir, tmp_path, parameters={"NET_ID": "ab1235"},
                prologue=PROLOGUE + AS_STUDENT)
    execute("11_delete_resources", kernel_dir, tmp_path, parameters={"NET_ID": "ab1235", "CONFIRM_NET_ID": "ab1235"},
            prologue=PROLOGUE + AS_STUDENT, epilogue=CHECK_DELETE.replace("ab1234", "ab1235"))


def test_delete_resources_without_the_ray_part(kernel_dir: Path, tmp_path: Path) -> None:
    nb = execute("11_delete_resources", kernel_dir, tmp_path, parameters={"NET_ID": NET_ID},
                 prologue=PROLOGUE + AS_STUDENT + WITHOUT_RAY_NODES,
                 epilogue="doubles.get_server.return_value.delete.assert_called_once_with()")
    printed = "".join(output.get("text", "") for cell in nb.cells for output in cell.get("outputs", []))
    assert "deleted server node-serve-system-ab1234" in printed
    assert "no server node-ray-head-ab1234 (ResourceError: no server node-ray-head-ab1234)" in printed
