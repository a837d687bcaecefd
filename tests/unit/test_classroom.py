"""Leases for a class (servelab.run.walkthrough.classroom), against autospec doubles of the installed python-chi:
a call the real library would refuse (a wrong keyword, a method it does not have) fails here too."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import date, datetime, timedelta, timezone
from types import SimpleNamespace
from unittest import mock

import chi.exception
import chi.lease
import chi.server
import invoke
import paramiko
import pytest

from chi_doubles import a_server, arguments, blazar_hosts, existing_lease, node
from servelab.cli import main
from servelab.core.paths import REPO_ROOT as REPO
from servelab.run.walkthrough import node_setup
from servelab.run.walkthrough.classroom import (
    RUNS,
    Row,
    book_class,
    budget,
    daytime,
    delete_class_leases,
    earliest,
    leases_held,
    manage,
    parts,
    plan,
    prepare,
    starts,
    status,
    table,
    with_progress,
)

UTC = timezone.utc
LENGTH = timedelta(hours=2, minutes=55)
PREFIX = "serve_system_"
# The class: Monday 7 January 2030, 13:00 to 21:00 UTC; booked the week before.
WINDOW = (datetime(2030, 1, 7, 13, tzinfo=UTC), datetime(2030, 1, 7, 21, tzinfo=UTC))
NOW = datetime(2029, 12, 31, 9, 30, tzinfo=UTC)


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2030, 1, 7, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def chi_api() -> Iterator[SimpleNamespace]:
    """python-chi patched with autospec doubles; two gpu_p100 nodes, P3-GPU-010 reserved 12:00-16:00."""
    real_lease = chi.lease.Lease
    targets = ("chi.hardware.get_nodes", "chi.clients.blazar", "chi.lease.Lease", "chi.lease.list_leases")
    with ExitStack() as stack:
        doubles = SimpleNamespace(**{t.rsplit(".", 1)[1]: stack.enter_context(mock.patch(t, autospec=True)) for t in targets})
        nodes = [node("P3-GPU-009"), node("P3-GPU-010")]
        doubles.get_nodes.return_value = nodes
        doubles.blazar.return_value.host = blazar_hosts(nodes, {"P3-GPU-010": [(at(12), at(16))]})
        doubles.list_leases.return_value = []
        doubles.real_lease, doubles.made = real_lease, []

        def new_lease(*args: object, **kwargs: object) -> mock.Mock:
            """A new lease object per Lease(...) call, as the real class makes."""
            made = mock.create_autospec(real_lease, instance=True)
            doubles.made.append(made)
            return made

        doubles.Lease.side_effect = new_lease
        yield doubles


def test_starts_are_whole_hours_in_the_windows_and_the_future() -> None:
    assert starts([WINDOW], LENGTH, NOW) == [at(h) for h in range(13, 19)]
    assert starts([WINDOW], LENGTH, at(14, 10)) == [at(h) for h in range(15, 19)]
    assert starts([WINDOW], LENGTH, at(19)) == []
    # A replaced node's student may start at the next minute.
    assert starts([WINDOW], LENGTH, at(14, 10, 30), right_away=True)[:2] == [at(14, 11), at(15)]


def test_daytime_windows_are_the_set_hours_of_the_allowed_days() -> None:
    # Friday 4 to Tuesday 8 January 2030, weekdays only, 13:00 to 21:00 UTC: no lease at 3 a.m., none on the weekend.
    windows = daytime(date(2030, 1, 4), date(2030, 1, 8), (13, 21), weekdays=range(5))
    assert windows == [(datetime(2030, 1, d, 13, tzinfo=UTC), datetime(2030, 1, d, 21, tzinfo=UTC)) for d in (4, 7, 8)]
    assert starts(windows, LENGTH, NOW)[:7] == [datetime(2030, 1, 4, h, tzinfo=UTC) for h in range(13, 19)] + [at(13)]
    assert daytime(date(2030, 1, 7), date(2030, 1, 7), (0, 24)) == [(at(0), at(0) + timedelta(days=1))]
    with pytest.raises(ValueError, match="class hours"):
        daytime(date(2030, 1, 7), date(2030, 1, 7), (21, 13))


def test_the_budget_of_a_class_of_forty() -> None:
    lab = budget("the lab", 40, ["gpu_p100"], LENGTH, {"gpu_p100": 8})
    assert (round(lab.node_hours, 1), round(lab.sus, 1), lab.blocks, lab.block) == (116.7, 116.7, 5, timedelta(hours=3))
    assert lab.line() == ("the lab: 40 leases x 1 node = 116.7 node-hours = 116.7 SUs; "
                          "5 consecutive 3-hour blocks of the site's nodes")
    ray = budget("the Ray part", 40, ["gpu_p100", "gpu_p100"], LENGTH, {"gpu_p100": 8}, su_per_node_hour=2)
    assert (round(ray.node_hours, 1), round(ray.sus, 1), ray.blocks) == (233.3, 466.7, 10)
    cpu_worker = budget("the Ray part", 40, ["gpu_p100", "compute_cascadelake_r"], LENGTH,
                        {"gpu_p100": 8, "compute_cascadelake_r": 30})
    assert cpu_worker.blocks == 5  # the GPU heads are the limit
    assert budget("x", 3, ["gpu_p100", "gpu_p100"], LENGTH, {"gpu_p100": 1}).line().endswith("too few nodes for one lease")


def test_plan_fills_free_nodes_then_later_hours_never_overlapping() -> None:
    busy = {"gpu_p100": {"A": [], "B": [(at(12), at(16))]}}
    slots = plan(["s1", "s2", "s3", "s4"], busy, [WINDOW], LENGTH, NOW, ["gpu_p100"])
    assert [(s.nodes, s.start) if s else None for s in slots.values()] == [
        (("A",), at(13)), (("A",), at(16)), (("B",), at(16)), None,  # 19:00 + 2:55 is past 21:00
    ]
    assert all(s.end - s.start == LENGTH for s in slots.values() if s)


def test_a_ray_lease_starts_at_the_first_hour_a_node_of_each_type_is_free_for_all_of_it(chi_api: SimpleNamespace) -> None:
    gpus = [node("P3-GPU-009"), node("P3-GPU-010"), node("P3-GPU-011")]
    cpus = [node("P3-CPU-001")]
    chi_api.get_nodes.side_effect = lambda node_type: {"gpu_p100": gpus, "compute_cascadelake_r": cpus}[node_type]
    # Free now, then reserved from 14:00: a lease from 12:00 would not fit. P3-GPU-011 is free from 16:00.
    chi_api.blazar.return_value.host = blazar_hosts(gpus + cpus, {
        "P3-GPU-009": [(at(14), at(20))], "P3-GPU-010": [(at(8), at(16))], "P3-GPU-011": [(at(8), at(16))],
        "P3-CPU-001": [(at(8), at(17, 30))]})
    now = at(11, 20)
    assert earliest(["gpu_p100", "gpu_p100"], LENGTH, now) == at(16)  # the second GPU node free for 2 h 55
    assert earliest(["gpu_p100", "compute_cascadelake_r"], LENGTH, now) == at(18)  # the CPU node, on the hour
    with pytest.raises(ValueError, match="no compute_cascadelake_r [+] compute_cascadelake_r free"):
        earliest(["compute_cascadelake_r", "compute_cascadelake_r"], LENGTH, now)


def test_a_class_is_booked_on_free_nodes_and_one_refusal_does_not_stop_the_rest(chi_api: SimpleNamespace) -> None:
    # Blazar refuses the second lease (someone took the node meanwhile).
    def refuse_second(*args: object, **kwargs: object) -> None:
        if len(chi_api.made) == 2:
            raise chi.exception.ResourceError("Unable to make lease")

    original = chi_api.Lease.side_effect

    def new_lease(*args: object, **kwargs: object) -> mock.Mock:
        made = original(*args, **kwargs)
        made.submit.side_effect = refuse_second
        return made

    chi_api.Lease.side_effect = new_lease
    rows = book_class(["ab1", "cd2", "ef3", "gh4"], [WINDOW], node_types=["gpu_p100"], length=LENGTH, prefix=PREFIX,
                      now=NOW)

    chi_api.get_nodes.assert_called_once_with(node_type="gpu_p100")
    made = [arguments(recorded, chi_api.real_lease) for recorded in chi_api.Lease.call_args_list]
    assert made == [
        {"name": "serve_system_ab1", "start_date": at(13), "end_date": at(15, 55)},
        {"name": "serve_system_cd2", "start_date": at(16), "end_date": at(18, 55)},
        {"name": "serve_system_ef3", "start_date": at(16), "end_date": at(18, 55)},
    ]
    nodes = [lease.add_node_reservation.call_args for lease in chi_api.made]
    assert nodes == [mock.call(amount=1, node_name=n) for n in ("P3-GPU-009", "P3-GPU-009", "P3-GPU-010")]
    for lease in chi_api.made:  # every lease was submitted, the refused one included
        lease.submit.assert_called_once_with(idempotent=True, wait_for_active=False)

    assert [(r.student, r.node, r.start, r.status) for r in rows] == [
        ("ab1", "P3-GPU-009", at(13), "reserved"),
        ("cd2", "P3-GPU-009", at(16), "failed: ResourceError: Unable to make lease"),
        ("ef3", "P3-GPU-010", at(16), "reserved"),
        ("gh4", "", None, "no free node in the windows"),
    ]
    summary = table(rows).splitlines()
    assert summary[0].split() == ["student", "lease", "node", "start", "(UTC)", "end", "(UTC)", "status"]
    assert summary[2].split()[:6] == ["cd2", "serve_system_cd2", "P3-GPU-009", "2030-01-07", "16:00", "2030-01-07"]
    assert summary[2].endswith("failed: ResourceError: Unable to make lease")
    assert summary[4].split() == ["gh4", "serve_system_gh4", "-", "-", "-", "no", "free", "node", "in", "the", "windows"]


def test_students_with_a_lease_keep_it_and_ended_leases_do_not_count(chi_api: SimpleNamespace) -> None:
    kept = existing_lease(chi_api.real_lease, "serve_system_ab1", at(17), "PENDING")
    ended = existing_lease(chi_api.real_lease, "serve_system_cd2", at(9), "TERMINATED")
    chi_api.list_leases.return_value = [kept, ended]

    rows = book_class(["ab1", "cd2", "ab1"], [WINDOW], node_types=["gpu_p100"], length=LENGTH, prefix=PREFIX, now=NOW)

    assert [(r.student, r.start, r.end, r.status) for r in rows] == [
        ("ab1", at(17), at(19, 55), "kept (PENDING)"),
        ("cd2", at(13), at(15, 55), "reserved"),
    ]
    assert [arguments(c, chi_api.real_lease)["name"] for c in chi_api.Lease.call_args_list] == ["serve_system_cd2"]


def test_deleting_a_class_touches_only_its_leases(chi_api: SimpleNamespace) -> None:
    mine = existing_lease(chi_api.real_lease, "serve_system_ab1", at(13), "ACTIVE")
    stuck = existing_lease(chi_api.real_lease, "serve_system_cd2", at(16), "PENDING")
    stuck.delete.side_effect = chi.exception.ResourceError("Lease object does not yet have a valid id")
    also_mine = existing_lease(chi_api.real_lease, "serve_system_ef3", at(16), "PENDING")
    other_section = existing_lease(chi_api.real_lease, "serve_system_zz9", at(13), "ACTIVE")
    unrelated = existing_lease(chi_api.real_lease, "ab1_thesis", at(13), "ACTIVE")
    chi_api.list_leases.return_value = [mine, stuck, other_section, unrelated, also_mine]

    rows = delete_class_leases(["ab1", "cd2", "ef3", "gh4"], prefix=PREFIX)

    for deleted in (mine, stuck, also_mine):
        deleted.delete.assert_called_once_with()
    other_section.delete.assert_not_called()
    unrelated.delete.assert_not_called()
    assert [(r.lease, r.status) for r in rows] == [
        ("serve_system_ab1", "deleted"),
        ("serve_system_cd2", "failed: ResourceError: Lease object does not yet have a valid id"),
        ("serve_system_ef3", "deleted"),
        ("serve_system_gh4", "no lease"),
    ]
    assert rows[0] == Row("ab1", "serve_system_ab1", "", at(13), at(15, 55), "deleted")


def test_the_class_cell_books_or_deletes_never_both_and_nothing_without_students(chi_api: SimpleNamespace) -> None:
    common = dict(windows=[WINDOW], node_types=["gpu_p100"], length=LENGTH, prefix=PREFIX)
    assert manage([], delete=False, **common) == [] and manage([], delete=True, **common) == []
    chi_api.list_leases.assert_not_called()  # no student: Chameleon is not even asked

    mine = existing_lease(chi_api.real_lease, "serve_system_ab1", at(13), "ACTIVE")
    chi_api.list_leases.return_value = [mine]
    rows = manage(["ab1", "cd2"], delete=True, **common)
    assert [r.status for r in rows] == ["deleted", "no lease"] and chi_api.made == []  # deleting books nothing
    mine.delete.assert_called_once_with()

    chi_api.list_leases.return_value = []
    rows = manage(["cd2"], delete=False, **common)
    assert [r.status for r in rows] == ["reserved"] and len(chi_api.made) == 1


def test_a_bad_node_is_swapped_for_a_new_lease_on_another_node_from_now(chi_api: SimpleNamespace) -> None:
    # ab1's lease holds P3-GPU-009 (Blazar's allocation says so) and has started; its node is bad.
    bad = existing_lease(chi_api.real_lease, "serve_system_ab1", at(13), "ACTIVE")
    bad.id = "lease-ab1"
    kept = existing_lease(chi_api.real_lease, "serve_system_cd2", at(13), "PENDING")
    chi_api.list_leases.return_value = [bad, kept]
    nodes = chi_api.get_nodes.return_value
    chi_api.blazar.return_value.host = blazar_hosts(nodes, {"P3-GPU-009": [(at(13), at(15, 55))]})
    chi_api.blazar.return_value.host.list_allocations.return_value[0]["reservations"][0]["lease_id"] = "lease-ab1"

    rows = book_class(["ab1", "cd2"], [WINDOW], node_types=["gpu_p100"], length=LENGTH, prefix=PREFIX,
                      replace={"ab1": "P3-GPU-009", "cd2": "P3-GPU-009"}, now=at(14, 20, 30))

    bad.delete.assert_called_once_with()
    kept.delete.assert_not_called()
    (made,) = [arguments(c, chi_api.real_lease) for c in chi_api.Lease.call_args_list]
    assert made == {"name": "serve_system_ab1", "start_date": at(14, 21), "end_date": at(17, 16)}
    chi_api.made[0].add_node_reservation.assert_called_once_with(amount=1, node_name="P3-GPU-010")
    assert [(r.student, r.node, r.status) for r in rows] == [
        ("ab1", "P3-GPU-010", "replaced (not on P3-GPU-009)"), ("cd2", "", "kept (PENDING)")]

    # Run again: ab1's new lease (on P3-GPU-010) is kept, not replaced a second time.
    new = existing_lease(chi_api.real_lease, "serve_system_ab1", at(14, 21), "PENDING")
    new.id = "lease-ab1-new"
    chi_api.list_leases.return_value = [new, kept]
    chi_api.blazar.return_value.host.list_allocations.return_value[1]["reservations"] = [
        {"id": "r", "lease_id": "lease-ab1-new", "start_date": "2030-01-07T14:21:00", "end_date": "2030-01-07T17:16:00"}]
    again = book_class(["ab1"], [WINDOW], node_types=["gpu_p100"], length=LENGTH, prefix=PREFIX,
                       replace={"ab1": "P3-GPU-009"}, now=at(14, 25))
    assert [(r.node, r.status) for r in again] == [("P3-GPU-010", "kept (PENDING)")]
    new.delete.assert_not_called()


def test_the_ray_part_s_two_node_leases_are_booked_as_9_ray_setup_books_them(chi_api: SimpleNamespace) -> None:
    nodes = [node(f"P3-GPU-0{i}") for i in (11, 12, 13, 14, 15)]
    chi_api.get_nodes.return_value = nodes
    chi_api.blazar.return_value.host = blazar_hosts(nodes, {"P3-GPU-011": [(at(12), at(16))]})

    rows = book_class(["ab1", "cd2", "ef3", "gh4"], [WINDOW], node_types=["gpu_p100", "gpu_p100"], length=LENGTH,
                      prefix="serve_ray_", not_before={"gh4": at(15, 55)}, now=NOW)

    assert [(r.lease, r.node, r.start) for r in rows] == [
        ("serve_ray_ab1", "P3-GPU-012, P3-GPU-013", at(13)),
        ("serve_ray_cd2", "P3-GPU-014, P3-GPU-015", at(13)),
        ("serve_ray_ef3", "P3-GPU-011, P3-GPU-012", at(16)),  # four free nodes at 13:00 hold two leases
        ("serve_ray_gh4", "P3-GPU-013, P3-GPU-014", at(16)),  # not before gh4's lab lease ends
    ]
    for lease in chi_api.made:  # one reservation of two nodes by type: 9_ray_setup's servers find it so
        lease.add_node_reservation.assert_called_once_with(amount=2, node_type="gpu_p100")
        lease.submit.assert_called_once_with(idempotent=True, wait_for_active=False)
    with pytest.raises(ValueError, match="one type"):
        book_class(["ab1"], [WINDOW], node_types=[], length=LENGTH, prefix=PREFIX, now=NOW)


def test_before_booking_the_instructor_reads_the_budget_and_the_groups_are_made_once(chi_api: SimpleNamespace) -> None:
    common = dict(class_parts=parts("gpu_p100", "gpu_p100"), length=LENGTH, su_per_node_hour=1.0,
                  groups=[("servelab-allow-tcp-22", 22, "SSH")])
    with mock.patch("chi.network.SecurityGroup", autospec=True) as group:
        assert prepare([], delete=False, **common) == [] and prepare(["ab1"], delete=True, **common) == []
        chi_api.get_nodes.assert_not_called()  # no student, or deleting: Chameleon is not even asked
        group.assert_not_called()
        lines = prepare(["ab1", "cd2", "ef3"], delete=False, **common)
    assert lines == [
        "Nodes for leases at this site: 2 gpu_p100",
        "the lab: 3 leases x 1 node = 8.8 node-hours = 8.8 SUs; 2 consecutive 3-hour blocks of the site's nodes",
        "the Ray part: 3 leases x 2 nodes = 17.5 node-hours = 17.5 SUs; 3 consecutive 3-hour blocks of the site's nodes",
        "security group servelab-allow-tcp-22: port 22 open to the internet (SSH)",
    ]
    group.assert_called_once_with({"name": "servelab-allow-tcp-22", "description": "SSH"})
    group.return_value.add_rule.assert_called_once_with("ingress", "tcp", 22)
    group.return_value.submit.assert_called_once_with(idempotent=True)
    assert parts("gpu_p100") == {"serve_system_": ["gpu_p100"]}
    # The Ray part's head follows the class's node type, as 9_ray_setup books it.
    assert parts("gpu_v100", "compute_cascadelake_r") == {"serve_system_": ["gpu_v100"],
                                                          "serve_ray_": ["gpu_v100", "compute_cascadelake_r"]}


@pytest.fixture
def the_class_on_the_day(chi_api: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """Eight students, one at each standing; ab1's lease was replaced (the deleted one is still listed)."""
    standings = {"cd2": "PENDING", "ef3": "ACTIVE", "gh4": "ACTIVE", "ij5": "ACTIVE", "kl6": "ERROR", "mn7": "TERMINATED",
                 "op8": "ACTIVE"}
    leases = [existing_lease(chi_api.real_lease, f"{PREFIX}{s}", at(13), state) for s, state in standings.items()]
    leases.append(existing_lease(chi_api.real_lease, f"{PREFIX}ij5", at(10), "DELETED"))  # a bad node's, replaced
    leases.append(existing_lease(chi_api.real_lease, f"{PREFIX}qr9", at(10), "DELETED"))
    chi_api.list_leases.return_value = leases
    chi_api.blazar.return_value.host.list_allocations.return_value = [
        {"resource_id": "100", "reservations": [{"id": "r1", "lease_id": "id-serve_system_ij5",
                                                 "start_date": "2030-01-07T13:00:00.000000",
                                                 "end_date": "2030-01-07T15:55:00.000000"}]}]
    servers = [a_server(chi.server.Server, "node-serve-system-gh4", "BUILD"),
               a_server(chi.server.Server, "node-serve-system-ij5", "ACTIVE", "192.0.2.30"),
               a_server(chi.server.Server, "node-serve-system-op8", "ERROR"),
               a_server(chi.server.Server, "node-ray-head-zz0", "ACTIVE", "192.0.2.31")]  # another student's
    with mock.patch("chi.server.list_servers", autospec=True, return_value=servers), \
            mock.patch("chi.context.use_site", autospec=True) as use_site:
        chi_api.use_site = use_site
        yield chi_api


def test_the_status_says_where_each_student_stands_from_what_chameleon_reports(the_class_on_the_day) -> None:
    students = ["ab1", "cd2", "ef3", "gh4", "ij5", "kl6", "mn7", "op8", "qr9"]
    rows = status(students, parts("gpu_p100"))
    assert [(r.student, r.node, r.servers, r.status) for r in rows] == [
        ("ab1", "", "", "no lease"),
        ("cd2", "", "", "pending (lease PENDING)"),
        ("ef3", "", "", "active (lease ACTIVE)"),
        ("gh4", "", "node-serve-system-gh4 BUILD no floating IP", "server building (lease ACTIVE)"),
        ("ij5", "P3-GPU-009", "node-serve-system-ij5 ACTIVE 192.0.2.30", "server active (lease ACTIVE)"),
        ("kl6", "", "", "error (lease ERROR)"),
        ("mn7", "", "", "expired (lease TERMINATED)"),
        ("op8", "", "node-serve-system-op8 ERROR no floating IP", "error (lease ACTIVE)"),
        ("qr9", "", "", "no lease (lease DELETED)"),
    ]
    assert rows[4].start == at(13)  # the live lease, not the deleted one of the same name
    # The Ray part's servers are the head's and the worker's.
    (ray,) = [r for r in status(["zz0"], parts("gpu_p100", "gpu_p100")) if r.lease == "serve_ray_zz0"]
    assert (ray.servers, ray.status) == ("node-ray-head-zz0 ACTIVE 192.0.2.31", "no lease")
    summary = table(rows).splitlines()
    assert summary[0].split() == ["student", "lease", "node", "start", "(UTC)", "end", "(UTC)", "servers", "status"]
    assert summary[5].split()[-6:] == ["ACTIVE", "192.0.2.30", "server", "active", "(lease", "ACTIVE)"]
    assert status([], parts("gpu_p100")) == []
    the_class_on_the_day.list_leases.assert_called()


def test_servelab_class_status_asks_the_node_type_s_site(the_class_on_the_day, capsys: pytest.CaptureFixture) -> None:
    assert main(["class", "status", "ij5", "--node-type", "gpu_v100"]) == 0
    the_class_on_the_day.use_site.assert_called_once_with("CHI@UC")
    the_class_on_the_day.get_nodes.assert_called_once_with(node_type="gpu_v100")
    assert "node-serve-system-ij5 ACTIVE 192.0.2.30" in capsys.readouterr().out
    # Without credentials, python-chi's keystoneauth refuses: a clear error, not a traceback.
    from keystoneauth1.exceptions import MissingRequiredOptions

    the_class_on_the_day.list_leases.side_effect = MissingRequiredOptions([])
    assert main(["class", "status", "ij5"]) == 2
    assert "source your project's OpenStack RC file" in capsys.readouterr().out


def test_the_lease_file_keeps_each_student_s_windows_and_every_server_seen(the_class_on_the_day, tmp_path) -> None:
    """What the grader's check holds a submission to (servelab report --check --lease): read while the servers are
    up, and kept once Nova has forgotten them."""
    for s in chi.server.list_servers.return_value:
        s.id = f"uuid-{s.name}"  # an instance attribute, which autospec cannot see
    held = leases_held(["ij5", "mn7", "ab1"])
    window = {"start": at(13).isoformat(), "end": at(15, 55).isoformat()}
    assert held == {"ij5": [{**window, "servers": ["uuid-node-serve-system-ij5"]},
                            {"start": at(10).isoformat(), "end": at(12, 55).isoformat(), "servers": []}],
                    "mn7": [{**window, "servers": []}], "ab1": []}
    out = tmp_path / "leases.json"
    assert main(["class", "status", "ij5", "--leases", str(out)]) == 0
    chi.server.list_servers.return_value = []  # the lease has ended: its server is gone
    assert main(["class", "status", "ij5", "mn7", "--leases", str(out)]) == 0
    assert json.loads(out.read_text())["ij5"][0] == {**window, "servers": ["uuid-node-serve-system-ij5"]}
    out.write_text("[1, 2]")
    assert main(["class", "status", "ij5", "--leases", str(out)]) == 2


def test_the_staff_keys_join_the_node_s_authorized_keys_once(tmp_path) -> None:
    """2_create_server_nvidia's command, run twice in bash on a node's home: the keys of notebooks/staff_keys.pub
    (the committed file's comments skipped) join the student's own, each once."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/authorized_keys").write_text("ssh-ed25519 AAAAstudent student@jupyter\n")
    (tmp_path / "servelab/notebooks").mkdir(parents=True)
    staff = "ssh-ed25519 AAAAstaff instructor@course"
    (tmp_path / "servelab/notebooks/staff_keys.pub").write_text(
        (REPO / "notebooks/staff_keys.pub").read_text() + f"{staff}\n\nnot a key\n")
    for _ in range(2):
        subprocess.run(["bash", "-c", node_setup.STAFF_KEYS], env={**os.environ, "HOME": str(tmp_path)}, check=True)
    assert (tmp_path / ".ssh/authorized_keys").read_text().splitlines() == [
        "ssh-ed25519 AAAAstudent student@jupyter", staff]
    assert node_setup.node_commands("https://example.org/s.git", gpu=True)[:2] == [
        node_setup.clone("https://example.org/s.git"), node_setup.STAFF_KEYS]  # 9_ray_setup's nodes too


def test_the_progress_says_which_notebooks_runs_each_active_node_holds(the_class_on_the_day, tmp_path, capsys) -> None:
    """``servelab class status --progress``: RUNS runs for real in a shell on a node's home that holds a lab's records
    (the H200 run's, one failed and a torn line added); a node that refuses the staff key says so in its row."""
    results = tmp_path / "servelab/results"
    results.mkdir(parents=True)
    lines = (REPO / "docs/records/gpu-h200-2026-11-28/records.jsonl").read_text().splitlines()
    failed = {**json.loads(lines[0]), "failed": "connection refused", "started_at": "2030-01-07T14:02:09+00:00"}
    (results / "records.jsonl").write_text("\n".join([*lines, json.dumps(failed), '{"stage": "torn']) + "\n")
    servers = {s.name: s for s in chi.server.list_servers.return_value}
    node = servers["node-serve-system-ij5"].ssh_connection.return_value.__enter__.return_value
    node.run.side_effect = lambda command, **kw: invoke.run(command, env={"HOME": str(tmp_path)}, in_stream=False, **kw)
    refusing = a_server(chi.server.Server, "node-serve-system-ef3", "ACTIVE", "192.0.2.32")
    refusing.ssh_connection.side_effect = paramiko.AuthenticationException("Authentication failed.")
    chi.server.list_servers.return_value.append(refusing)
    listed = chi.server.list_servers.call_count
    rows = status(["ij5", "ef3", "gh4"], parts("gpu_p100"), progress=True, key="/home/staff/.ssh/id_staff")
    assert chi.server.list_servers.call_count == listed + 1  # the progress reads the servers the status listed
    # The H200 run measured 4's, 7's and 8's stages, not the Python backend's (pt-1, pt-2x2: 6's core).
    assert rows[0].progress == "runs of notebook 4: 12 (1 failed), 7: 16, 8: 4; core path 4/6 stages; last run 14:02 UTC"
    servers["node-serve-system-ij5"].ssh_connection.assert_called_once_with(
        connect_timeout=10, connect_kwargs={"key_filename": "/home/staff/.ssh/id_staff"})
    node.run.assert_called_once_with(RUNS, hide=True, warn=True)
    assert rows[1].progress == "no SSH: AuthenticationException: Authentication failed."
    assert rows[2].progress == "-"  # still building
    assert table(rows).splitlines()[0].split()[-2:] == ["status", "progress"]
    key = tmp_path / "id_staff"
    assert main(["class", "status", "ij5", "--progress", "--ssh-key", str(key)]) == 2
    assert f"no key file {key}" in capsys.readouterr().out
    key.write_text("a private key")
    assert main(["class", "status", "ij5", "--progress", "--ssh-key", str(key)]) == 0
    assert "core path 4/6 stages; last run 14:02 UTC" in capsys.readouterr().out
    (results / "records.jsonl").unlink()
    assert with_progress(rows[:1], servers)[0].progress == "no runs yet"
