"""Doubles for python-chi, for executing the provisioning notebooks without Chameleon.

This module is imported *inside the notebook's kernel* by a cell the tests put in front of the
notebook. Every double is built with autospec from the installed python-chi, so a call with an
argument name the real library does not take, or of a method it no longer has, fails the
notebook. ``submit`` accepts ``**kwargs``, so the tests also assert the exact calls.
"""

from __future__ import annotations

import inspect
import socket
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any, Callable
from unittest import mock

import chi.clients
import chi.context
import chi.hardware
import chi.lease
import chi.network
import chi.server
from blazarclient.v1.hosts import ComputeHostClientManager

from servelab.run.walkthrough.node_setup import SECURITY_GROUPS

# The names the notebooks go through (`from chi import lease` then `lease.Lease(...)`).
PATCHED = (
    "chi.clients.blazar",
    "chi.context.choose_project",
    "chi.context.choose_site",
    "chi.hardware.get_nodes",
    "chi.lease.Lease",
    "chi.lease.get_lease",
    "chi.lease.list_leases",
    "chi.network.SecurityGroup",
    "chi.network.list_security_groups",
    "chi.server.Server",
    "chi.server.get_server",
    "chi.server.list_servers",
)
RESERVATION_ID = "0b7c4f9e-5d1a-4e8b-9c2f-reservation"
FLOATING_IP = "192.0.2.10"  # TEST-NET-1 (RFC 5737): documentation only, never routed


def _refuse_network(*args: Any, **kwargs: Any) -> None:
    raise ConnectionError("a notebook under test tried to reach the network")


def node(name: str, free_from: datetime | None = None, free_until: datetime | None = None) -> mock.Mock:
    """A gpu_p100 ``hardware.Node``; ``next_free_timeslot`` answers (free_from, free_until)."""
    found = mock.create_autospec(chi.hardware.Node, instance=True)
    # Dataclass fields are instance attributes, which autospec cannot see.
    found.name, found.type, found.uid, found.reservable = name, "gpu_p100", f"uid-{name}", True
    found.next_free_timeslot.return_value = (free_from or datetime.now(timezone.utc), free_until)
    return found


def blazar_hosts(nodes: Sequence[mock.Mock], reserved: Mapping[str, Sequence[tuple[datetime, datetime]]]) -> mock.Mock:
    """Blazar's host manager (``chi.clients.blazar().host``) knowing these nodes and, by node name, their
    reservations, in Blazar's own form (host ids, naive UTC times with microseconds)."""
    host = mock.create_autospec(ComputeHostClientManager, instance=True)
    host.list.return_value = [{"id": str(100 + i), "hypervisor_hostname": n.uid} for i, n in enumerate(nodes)]
    host.list_allocations.return_value = [
        {"resource_id": str(100 + i), "reservations": [
            {"id": f"r{i}-{j}", "lease_id": f"l{i}-{j}", "start_date": f"{start:%Y-%m-%dT%H:%M:%S.%f}",
             "end_date": f"{end:%Y-%m-%dT%H:%M:%S.%f}"} for j, (start, end) in enumerate(reserved.get(n.name, []))]}
        for i, n in enumerate(nodes)
    ]
    return host


def existing_lease(lease_class: type, name: str, start: datetime, status: str = "PENDING") -> mock.Mock:
    """A lease as ``list_leases`` gives it: naive UTC times, as python-chi parses Blazar's."""
    found = mock.create_autospec(lease_class, instance=True)
    found.name, found.status, found.id = name, status, f"id-{name}"
    found.start_date, found.end_date = start.replace(tzinfo=None), (start + timedelta(hours=2, minutes=55)).replace(tzinfo=None)
    return found


def a_server(server_class: type, name: str, status: str, floating_ip: str | None = None) -> mock.Mock:
    """A server as ``server.list_servers`` gives it: its name, Nova's status and its floating IP, if any."""
    found = mock.create_autospec(server_class, instance=True)
    found.name, found.status = name, status  # instance attributes and a property, which autospec cannot answer
    found.get_floating_ip.return_value = floating_ip
    return found


def security_groups(group_class: type, names: Sequence[str]) -> list[mock.Mock]:
    """Security groups as ``network.list_security_groups`` gives them, by name."""
    groups = []
    for name in names:
        group = mock.create_autospec(group_class, instance=True)
        group.name = name  # an instance attribute, which autospec cannot see
        groups.append(group)
    return groups


def fixed_address(index: int) -> str:
    """The private address of the index-th server a test starts (sharednet1-like)."""
    return f"10.52.0.{10 + index}"


def server_per_name(server_class: type) -> Callable[..., mock.Mock]:
    """A side effect for the ``Server`` double: a new autospec server per name, as the real class makes,
    with a fixed address on sharednet1 and no floating IP until one is associated. ``made`` holds them."""
    made: dict[str, mock.Mock] = {}

    def new_server(name: str, *args: Any, **kwargs: Any) -> mock.Mock:
        s = mock.create_autospec(server_class, instance=True)
        s.name = name
        index = len(made)
        # Nova's address list; a floating IP appears once associate_floating_ip was called.
        s.addresses = {"sharednet1": [{"addr": fixed_address(index), "version": 4, "OS-EXT-IPS:type": "fixed"}]}
        s.get_floating_ip.side_effect = lambda: f"192.0.2.{20 + index}" if s.associate_floating_ip.called else None
        made[name] = s
        return s

    new_server.made = made
    return new_server


def install() -> SimpleNamespace:
    """Patch python-chi in this process, block sockets, and return the doubles by name."""
    real_lease, real_server, real_group = chi.lease.Lease, chi.server.Server, chi.network.SecurityGroup
    doubles = {target.rsplit(".", 1)[1]: mock.patch(target, autospec=True).start() for target in PATCHED}
    for name in ("connect", "connect_ex"):
        setattr(socket.socket, name, _refuse_network)
    socket.getaddrinfo = _refuse_network

    now = datetime.now(timezone.utc)
    nodes = [
        node("P3-GPU-009", now + timedelta(hours=6), None),
        node("P3-GPU-010", now + timedelta(minutes=20), now + timedelta(days=1)),
    ]
    doubles["get_nodes"].return_value = nodes
    doubles["list_leases"].return_value = []
    doubles["list_servers"].return_value = []
    doubles["blazar"].return_value.host = blazar_hosts(nodes, {})
    # The instructor made the class's security groups (1_create_lease).
    doubles["list_security_groups"].return_value = security_groups(real_group, [name for name, _, _ in SECURITY_GROUPS])

    # A lease that has started, as `get_lease` finds it.
    active = mock.create_autospec(real_lease, instance=True)
    active.status = "ACTIVE"
    active.node_reservations = [{"id": RESERVATION_ID, "resource_type": "physical:host"}]
    doubles["get_lease"].return_value = active

    # A fresh server: no floating IP until one is associated.
    new_server = doubles["Server"].return_value
    new_server.get_floating_ip.side_effect = lambda: FLOATING_IP if new_server.associate_floating_ip.called else None
    doubles["get_server"].return_value = mock.create_autospec(real_server, instance=True)

    return SimpleNamespace(**doubles, nodes=nodes, active_lease=active, new_server=new_server, lease_class=real_lease,
                           server_class=real_server, group_class=real_group)


def arguments(recorded: mock._Call, double: Callable[..., Any]) -> dict[str, Any]:
    """The arguments of a call recorded by an autospec double, by parameter name, however passed."""
    return dict(inspect.signature(double).bind(*recorded.args, **recorded.kwargs).arguments)
