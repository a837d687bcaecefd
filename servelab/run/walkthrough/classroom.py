"""A class's leases with python-chi (``1_create_lease``, ``servelab class status``): the budget, one lease per
student (``serve_system_<netID>``, or the Ray part's ``serve_ray_<netID>`` with a head and a worker) planned
from Blazar's reservations, deleting them, and where each student stands. A kept lease is replaced only where
``replace`` names a bad node of it; one refused lease does not stop the others. Runs in Chameleon Jupyter
(python-chi and the standard library only); every value comes from the notebook."""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta, timezone

from chi import clients, hardware, lease, network, server
from paramiko.ssh_exception import SSHException

from servelab.core.catalogue import CORE_PATH, STAGES
from servelab.core.tables import text
from servelab.run.walkthrough import ray_nodes

Interval = tuple[datetime, datetime]
# Blazar keeps these leases, but they no longer hold a node.
ENDED = frozenset({"TERMINATED", "DELETED", "ERROR"})
# Chameleon charges an allocation by the node-hour for bare metal; the notebook may set another rate.
SU_PER_NODE_HOUR = 1.0


@dataclass(frozen=True)
class Slot:
    nodes: tuple[str, ...]
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Row:
    student: str
    lease: str
    node: str  # the nodes planned, comma-separated ("" where none was)
    start: datetime | None
    end: datetime | None
    status: str  # reserved, replaced, kept (Chameleon's status), no free node, failed: <why>, deleted; or a standing
    servers: str = ""  # ``status``: each server's name, state and floating IP
    progress: str = ""  # ``status`` with ``progress``: the runs the student's node holds, by notebook


@dataclass
class Site:
    """Every reservable node of the types asked for, with its reserved times, and each lease's nodes."""

    busy: dict[str, dict[str, list[Interval]]] = field(default_factory=dict)  # type -> node -> intervals
    nodes_of_lease: dict[str, set[str]] = field(default_factory=dict)

    def free(self) -> dict[str, int]:
        """How many nodes of each type the site has for leases."""
        return {node_type: len(nodes) for node_type, nodes in self.busy.items()}


@dataclass(frozen=True)
class Budget:
    """What one part of the lab costs a class: one lease of ``nodes`` nodes for ``length`` per student."""

    part: str
    leases: int
    nodes: int
    length: timedelta
    blocks: int | None  # consecutive blocks of the lease's length (rounded up to the hour); None: too few nodes
    su_per_node_hour: float = SU_PER_NODE_HOUR

    @property
    def node_hours(self) -> float:
        return self.leases * self.nodes * self.length.total_seconds() / 3600

    @property
    def sus(self) -> float:
        return self.node_hours * self.su_per_node_hour

    @property
    def block(self) -> timedelta:
        return timedelta(hours=math.ceil(self.length.total_seconds() / 3600))

    def line(self) -> str:
        hours = self.block.total_seconds() / 3600
        blocks = ("the site has too few nodes for one lease" if self.blocks is None else
                  f"{self.blocks} consecutive {hours:g}-hour block{'s' if self.blocks != 1 else ''} of the site's nodes")
        return (f"{self.part}: {self.leases} lease{'s' if self.leases != 1 else ''} x {self.nodes} node"
                f"{'s' if self.nodes != 1 else ''} = {self.node_hours:.1f} node-hours = {self.sus:.1f} SUs; {blocks}")


def utc(moment: datetime) -> datetime:
    """An aware UTC time; a naive one (python-chi's lease times, Blazar's) is taken to be UTC already."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def daytime(first: date, last: date, hours: tuple[int, int], weekdays: Collection[int] = range(7)) -> list[Interval]:
    """A window per allowed weekday (0: Monday) from ``first`` to ``last``, ``hours`` o'clock UTC (24: midnight)."""
    start, end = hours
    if not 0 <= start < end <= 24:
        raise ValueError(f"class hours {hours}: give (from, until) with 0 <= from < until <= 24")
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    midnights = [datetime(d.year, d.month, d.day, tzinfo=timezone.utc) for d in days if d.weekday() in weekdays]
    return [(midnight + timedelta(hours=start), midnight + timedelta(hours=end)) for midnight in midnights]


def budget(part: str, students: int, node_types: Sequence[str], length: timedelta, free: Mapping[str, int],
           su_per_node_hour: float = SU_PER_NODE_HOUR) -> Budget:
    """With its blocks: how many in a row the ``free`` nodes need to hold every student's lease (None: not one)."""
    at_once = min(free.get(t, 0) // count for t, count in Counter(node_types).items())
    blocks = math.ceil(students / at_once) if at_once else None
    return Budget(part, students, len(node_types), length, blocks, su_per_node_hour)


def parts(node_type: str, ray_worker_type: str | None = None) -> dict[str, list[str]]:
    """Each part's lease name prefix and node types: the lab's, and the Ray part's where a worker type is given."""
    found = {"serve_system_": [node_type]}
    if ray_worker_type:
        found["serve_ray_"] = [node_type, ray_worker_type]
    return found


def make_security_groups(groups: Iterable[tuple[str, int, str]]) -> list[str]:
    """Each group (name, port, why) with its one ingress rule; a group of that name in the project is kept."""
    made = []
    for name, port, why in groups:
        group = network.SecurityGroup({"name": name, "description": why})
        group.add_rule("ingress", "tcp", port)
        group.submit(idempotent=True)
        made.append(f"security group {name}: port {port} open to the internet ({why})")
    return made


def prepare(students: Sequence[str], *, delete: bool, class_parts: Mapping[str, Sequence[str]], length: timedelta,
            su_per_node_hour: float, groups: Iterable[tuple[str, int, str]]) -> list[str]:
    """Before booking: the site's nodes, each part's budget, the security groups made; nothing without students."""
    if not students or delete:
        return []
    free = site({t for types in class_parts.values() for t in types}).free()
    lines = ["Nodes for leases at this site: " + ", ".join(f"{n} {t}" for t, n in free.items())]
    lines += [budget("the lab" if prefix == "serve_system_" else "the Ray part", len(students), types, length, free,
                     su_per_node_hour).line() for prefix, types in class_parts.items()]
    return lines + make_security_groups(groups)


def site(node_types: Iterable[str]) -> Site:
    """Every reservable node of ``node_types`` with its reserved times, from Blazar's host allocations:
    ``Node.next_free_timeslot`` gives only a node's first gap from now, which says nothing of next week."""
    found = Site()
    type_of: dict[str, tuple[str, str]] = {}  # uid -> (type, name)
    for node_type in dict.fromkeys(node_types):
        nodes = [node for node in hardware.get_nodes(node_type=node_type) if node.reservable]
        found.busy[node_type] = {node.name: [] for node in nodes}
        type_of.update({node.uid: (node_type, node.name) for node in nodes})
    blazar = clients.blazar()
    uid_of_host = {host["id"]: host["hypervisor_hostname"] for host in blazar.host.list()}
    for allocation in blazar.host.list_allocations():
        if (known := type_of.get(uid_of_host.get(allocation["resource_id"], ""))) is None:
            continue
        node_type, name = known
        for r in allocation["reservations"]:
            found.busy[node_type][name].append((utc(datetime.fromisoformat(r["start_date"])),
                                                utc(datetime.fromisoformat(r["end_date"]))))
            found.nodes_of_lease.setdefault(r.get("lease_id", ""), set()).add(name)
    return found


def starts(windows: Sequence[Interval], length: timedelta, now: datetime, right_away: bool = False) -> list[datetime]:
    """Whole hours from which a lease of ``length`` fits in a window; ``right_away``: the next minute too."""
    found = []
    for window_start, window_end in windows:
        earliest = max(utc(window_start), utc(now))
        start = earliest.replace(minute=0, second=0, microsecond=0)
        if start < earliest:
            start += timedelta(hours=1)
        while start + length <= utc(window_end):
            found.append(start)
            start += timedelta(hours=1)
        soon = (utc(now) + timedelta(minutes=1)).replace(second=0, microsecond=0)
        if right_away and utc(window_start) <= soon and soon + length <= utc(window_end):
            found.append(soon)
    return sorted(set(found))


def plan(students: Sequence[str], busy: Mapping[str, Mapping[str, Sequence[Interval]]], windows: Sequence[Interval],
         length: timedelta, now: datetime, node_types: Sequence[str], *, avoid: Collection[str] = (),
         right_away: Collection[str] = (), not_before: Mapping[str, datetime | None] | None = None
         ) -> dict[str, Slot | None]:
    """A slot per student: the earliest start (not before ``not_before``, so that no one holds two leases at once),
    then the first free nodes by name not in ``avoid``. Each slot is taken before the next student is placed,
    so a class fills the free nodes first, then the next hours. None: no nodes free long enough."""
    taken = {t: {n: list(intervals) for n, intervals in nodes.items()} for t, nodes in busy.items()}
    slots: dict[str, Slot | None] = {}
    for student in students:
        slots[student] = None
        earliest = (not_before or {}).get(student)
        for start in starts(windows, length, max(utc(now), utc(earliest)) if earliest else now, student in right_away):
            end, chosen = start + length, []
            for node_type in node_types:
                node = next((n for n in sorted(taken.get(node_type, {})) if n not in chosen and n not in avoid
                             and all(end <= b or e <= start for b, e in taken[node_type][n])), None)
                if node is None:
                    break
                chosen.append(node)
            else:
                for node_type, node in zip(node_types, chosen):
                    taken[node_type][node].append((start, end))
                slots[student] = Slot(tuple(chosen), start, end)
                break
    return slots


def earliest(node_types: Sequence[str], length: timedelta, now: datetime | None = None) -> datetime:
    """The first hour within 30 days with a node of each of ``node_types`` free for ``length``, as ``plan``s."""
    now = now or datetime.now(timezone.utc)
    slot = plan([""], site(node_types).busy, [(now, now + timedelta(days=30))], length, now, node_types)[""]
    if slot is None:
        raise ValueError(f"no {' + '.join(node_types)} free for {length} in the next 30 days at this site")
    return slot.start


def _live_leases(prefix: str) -> dict[str, lease.Lease]:
    """This project's leases whose name starts with ``prefix`` and that still hold (or will hold) a node."""
    return {found.name: found for found in lease.list_leases()
            if found.name.startswith(prefix) and found.status not in ENDED}


def _submit(name: str, slot: Slot, node_types: Sequence[str], length: timedelta) -> None:
    if len(node_types) == 2:  # the Ray part's lease, as 9_ray_setup makes it (its servers find it by type)
        ray_nodes.reserve(name, slot.start, length, *node_types)
        return
    new = lease.Lease(name, start_date=slot.start, end_date=slot.end)
    new.add_node_reservation(amount=1, node_name=slot.nodes[0])
    # idempotent: a lease made meanwhile under the same name is kept, not doubled.
    new.submit(idempotent=True, wait_for_active=False)


def book_class(students: Iterable[str], windows: Sequence[Interval], *, node_types: Sequence[str], length: timedelta,
               prefix: str, replace: Mapping[str, str] | None = None,
               not_before: Mapping[str, datetime | None] | None = None, now: datetime | None = None) -> list[Row]:
    """Reserve ``node_types`` nodes for each student within ``windows`` (UTC); a Row per student, in order."""
    if not 1 <= len(node_types) <= 2:
        raise ValueError(f"node_types {node_types}: one type (the lab's lease) or two (the Ray part's head and worker)")
    students = list(dict.fromkeys(students))
    now = now or datetime.now(timezone.utc)
    existing = _live_leases(prefix)
    found = site(node_types)
    rows: dict[str, Row] = {}
    bad: set[str] = set()
    replaced: set[str] = set()
    for s in students:
        if (old := existing.get(f"{prefix}{s}")) is None:
            continue
        held = found.nodes_of_lease.get(old.id, set())
        if (replace or {}).get(s) not in held:  # not replaced, or already off the bad node
            rows[s] = Row(s, old.name, ", ".join(sorted(held)), utc(old.start_date), utc(old.end_date),
                          f"kept ({old.status})")
            continue
        bad |= held
        replaced.add(s)
        try:
            old.delete()
        except Exception as exc:  # noqa: BLE001 - the old lease stays: say so, book nothing for this student
            rows[s] = Row(s, old.name, "", utc(old.start_date), utc(old.end_date),
                          f"failed to delete the old lease: {type(exc).__name__}: {exc}")
    to_book = [s for s in students if s not in rows]
    slots = plan(to_book, found.busy, windows, length, now, node_types, avoid=bad,
                 right_away=replaced, not_before=not_before)
    for student in to_book:
        name, slot = f"{prefix}{student}", slots[student]
        if slot is None:
            rows[student] = Row(student, name, "", None, None, "no free node in the windows")
            continue
        try:
            _submit(name, slot, node_types, length)
            status = f"replaced (not on {', '.join(sorted(bad))})" if student in replaced else "reserved"
        except Exception as exc:  # noqa: BLE001 - Blazar refusing one lease must not stop the class
            status = f"failed: {type(exc).__name__}: {exc}"
        rows[student] = Row(student, name, ", ".join(slot.nodes), slot.start, slot.end, status)
    return [rows[s] for s in students]


def delete_class_leases(students: Iterable[str], *, prefix: str) -> list[Row]:
    """Delete ``<prefix><netID>`` for each student that has one; other leases, even with the prefix, stay."""
    existing = _live_leases(prefix)
    rows = []
    for student in dict.fromkeys(students):
        name = f"{prefix}{student}"
        if (found := existing.get(name)) is None:
            rows.append(Row(student, name, "", None, None, "no lease"))
            continue
        try:
            found.delete()
            status = "deleted"
        except Exception as exc:  # noqa: BLE001 - one lease that cannot be deleted must not keep the others
            status = f"failed: {type(exc).__name__}: {exc}"
        rows.append(Row(student, name, "", utc(found.start_date), utc(found.end_date), status))
    return rows


def server_names(prefix: str, student: str) -> list[str]:
    """The servers a student's lease holds once they start them: 2_create_server_nvidia's, or 9_ray_setup's two."""
    if prefix == "serve_ray_":
        nodes = ray_nodes.RayNodes.for_student(student)
        return [nodes.head, nodes.worker]
    return [f"node-serve-system-{student}"]


def standing(found: lease.Lease, servers: Sequence[server.Server]) -> str:
    """Where the student stands, from the lease's and its servers' states (a deleted lease counts as none)."""
    if found.status == "DELETED":
        return "no lease"
    if found.status == "ERROR" or any(s.status == "ERROR" for s in servers):
        return "error"
    if found.status in ("TERMINATING", "TERMINATED"):
        return "expired"
    if found.status != "ACTIVE":
        return "pending"
    if not servers:
        return "active"
    return "server active" if all(s.status == "ACTIVE" for s in servers) else "server building"


def status(students: Iterable[str], class_parts: Mapping[str, Sequence[str]], progress: bool = False,
           key: str | None = None) -> list[Row]:
    """A Row per student and part, from the leases (a live one before an ended one), their nodes and servers;
    ``progress``: with each active node's runs (``with_progress``, ``key``: the staff key)."""
    students = list(dict.fromkeys(students))
    if not students:
        return []
    # The live ones last: they win.
    leases = {found.name: found for found in sorted(lease.list_leases(), key=lambda found: found.status not in ENDED)}
    servers = {s.name: s for s in server.list_servers()}
    nodes_of_lease = site({t for types in class_parts.values() for t in types}).nodes_of_lease
    rows = []
    for prefix in class_parts:
        for student in students:
            name = f"{prefix}{student}"
            found = leases.get(name)
            theirs = [servers[n] for n in server_names(prefix, student) if n in servers]
            shown = ", ".join(" ".join([s.name, s.status or "-", s.get_floating_ip() or "no floating IP"]) for s in theirs)
            if found is None:
                rows.append(Row(student, name, "", None, None, "no lease", shown))
            else:
                rows.append(Row(student, name, ", ".join(sorted(nodes_of_lease.get(found.id, ()))), utc(found.start_date),
                                utc(found.end_date), f"{standing(found, theirs)} (lease {found.status})", shown))
    return with_progress(rows, servers, key) if progress else rows


# Run on a student's node over SSH (``progress``): per run record of the lab's results its stage, load mode, whether it
# failed and when it started; not the records themselves (each carries its timelines) and no servelab install.
_RUNS = """import json, pathlib
p = pathlib.Path.home() / "servelab/results/records.jsonl"
for line in p.read_text(errors="replace").splitlines() if p.exists() else []:
    try:
        r = json.loads(line)
        print(json.dumps([r["stage"], r["load"]["mode"], bool(r.get("failed")), r.get("started_at") or ""]))
    except (ValueError, KeyError, TypeError):
        pass
"""
RUNS = f"python3 -c {shlex.quote(_RUNS)}"


def runs_summary(lines: str) -> str:
    """``RUNS``'s output in a phrase: the runs of each notebook (failed ones apart), the core path's stages whose
    every run is there (what the grader's check asks, servelab.report.check) and when the last run started."""
    runs, ok, failed = [], Counter(), Counter()
    for line in lines.splitlines():
        try:
            stage, mode, bad, started = json.loads(line)
        except (ValueError, TypeError):
            continue
        runs.append((stage, mode, bad, started))
        notebook = STAGES[stage].notebook.split("_")[0] if stage in STAGES else "other"
        (failed if bad else ok)[notebook] += 1
    if not runs:
        return "no runs yet"
    order = sorted(ok | failed, key=lambda n: int(n) if n.isdigit() else 99)  # 4 before 10, "other" last
    shown = [f"{n}: {ok[n]}" + (f" ({failed[n]} failed)" if failed[n] else "") for n in order]
    have = {(stage, mode) for stage, mode, bad, _ in runs if not bad}
    core = sum(all((stage, mode) in have for mode in modes) for stage, modes in CORE_PATH.items())
    last = max(started for *_, started in runs)[11:16] or "-"
    return f"runs of notebook {', '.join(shown)}; core path {core}/{len(CORE_PATH)} stages; last run {last} UTC"


def node_progress(found: server.Server, key: str | None = None) -> str:
    """The runs one node holds (``runs_summary``), read over SSH as ``cc``, as the notebooks run their commands,
    with the staff key (``key``: a private key file; None: python-chi's own, Chameleon Jupyter's) that
    2_create_server_nvidia added from notebooks/staff_keys.pub. A node that refuses it or does not answer says so."""
    try:
        with found.ssh_connection(connect_timeout=10, connect_kwargs={"key_filename": key} if key else {}) as conn:
            out = conn.run(RUNS, hide=True, warn=True)
    except (OSError, SSHException) as exc:  # refused key, no route, timeout: one student's, not the table's
        return f"no SSH: {type(exc).__name__}: {exc}"
    if not out.ok:
        return f"cannot read its runs: {(out.stderr.strip().splitlines() or [f'exit {out.exited}'])[-1]}"
    return runs_summary(out.stdout)


def with_progress(rows: Sequence[Row], servers: Mapping[str, server.Server], key: str | None = None) -> list[Row]:
    """``rows`` with the progress of each student's working node (the single node, or the Ray part's head; ``servers``
    by name) where it is active with a floating IP, read from up to eight nodes at once (a class of forty in seconds)."""
    def of(row: Row) -> str:
        found = servers.get(server_names(row.lease.removesuffix(row.student), row.student)[0])
        if found is None or found.status != "ACTIVE" or not found.get_floating_ip():
            return "-"
        return node_progress(found, key)

    with ThreadPoolExecutor(max_workers=8) as pool:
        return [replace(row, progress=shown) for row, shown in zip(rows, pool.map(of, rows))]


def leases_held(students: Iterable[str], known: Mapping[str, list[dict]] | None = None,
                prefix: str = "serve_system_") -> dict[str, list[dict]]:
    """Each student's leases as the grader's check reads them (``servelab report --check --lease``): every lease
    Chameleon lists under their name, its window, and the ids of its servers (Nova lists a server only while it
    exists: an active lease's), added to what ``known`` (an earlier reading) holds."""
    servers = server.list_servers()
    found = {s: [dict(held) for held in (known or {}).get(s, [])] for s in dict.fromkeys(students)}
    for held in lease.list_leases():
        student = held.name.removeprefix(prefix)
        if not held.name.startswith(prefix) or student not in found:
            continue
        window = {"start": utc(held.start_date).isoformat(), "end": utc(held.end_date).isoformat()}
        ids = [s.id for s in servers if s.name in server_names(prefix, student)] if held.status == "ACTIVE" else []
        if (same := next((old for old in found[student] if window.items() <= old.items()), None)) is None:
            found[student].append({**window, "servers": ids})
        else:
            same["servers"] = sorted({*same.get("servers", []), *ids})
    return found


def manage(students: Iterable[str], windows: Sequence[Interval], *, delete: bool, node_types: Sequence[str],
           length: timedelta, prefix: str, replace: Mapping[str, str] | None = None,
           not_before: Mapping[str, datetime | None] | None = None) -> list[Row]:
    """Book the class's leases, or with ``delete`` only delete them (a notebook run never does both)."""
    students = list(students)
    if not students:
        return []
    if delete:
        return delete_class_leases(students, prefix=prefix)
    return book_class(students, windows, node_types=node_types, length=length, prefix=prefix, replace=replace,
                      not_before=not_before)


def table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, times in UTC."""
    def when(moment: datetime | None) -> str:
        return f"{moment:%Y-%m-%d %H:%M}" if moment else "-"

    servers, progress = any(r.servers for r in rows), any(r.progress for r in rows)  # only the status has them
    columns = ("student", "lease", "node", "start (UTC)", "end (UTC)", *(["servers"] if servers else []), "status",
               *(["progress"] if progress else []))
    cells = [(r.student, r.lease, r.node or "-", when(r.start), when(r.end), *([r.servers or "-"] if servers else []),
              r.status, *([r.progress] if progress else [])) for r in rows]
    return "\n".join(line.rstrip() for line in text(columns, cells).splitlines())
