"""Leases for a whole class (``1_create_lease``, instructors' section), with python-chi.

* ``book_class``: one lease per student within a time window, each on a node that is free for the
  whole lease, planned from Blazar's reservations of every node of the type; students who already
  have a lease keep it; one refused lease does not stop the others. Returns a ``Row`` per student.
* ``delete_class_leases``: deletes the leases named ``<prefix><netID>`` of the given students, and
  only those.
* ``table(rows)``: the summary (student, lease, node, start, end, status) as text.

Runs in Chameleon Jupyter, from the ``notebooks`` folder of a clone: it needs python-chi and the
standard library only. Every value (node type, lease length, name prefix) comes from the notebook.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from chi import clients, hardware, lease

Interval = tuple[datetime, datetime]
# Blazar keeps these leases, but they no longer hold a node.
ENDED = frozenset({"TERMINATED", "DELETED", "ERROR"})


@dataclass(frozen=True)
class Slot:
    node: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Row:
    student: str
    lease: str
    node: str
    start: datetime | None
    end: datetime | None
    status: str  # reserved, kept (it existed), no free node, failed: <why>, deleted


def utc(moment: datetime) -> datetime:
    """An aware UTC time; a naive one (python-chi's lease times, Blazar's) is taken to be UTC already."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def blazar_time(text: str) -> datetime:
    return utc(datetime.fromisoformat(text))


def reservations_by_node(node_type: str) -> dict[str, list[Interval]]:
    """Every reservable node of ``node_type`` at the chosen site, by name, with the times it is reserved.

    ``Node.next_free_timeslot`` only gives a node's first gap from now, which says nothing about a
    class next week; Blazar's host allocations (one call for all hosts) give every reservation."""
    nodes = {node.uid: node.name for node in hardware.get_nodes(node_type=node_type) if node.reservable}
    blazar = clients.blazar()
    uid_of_host = {host["id"]: host["hypervisor_hostname"] for host in blazar.host.list()}
    busy: dict[str, list[Interval]] = {name: [] for name in nodes.values()}
    for allocation in blazar.host.list_allocations():
        name = nodes.get(uid_of_host.get(allocation["resource_id"], ""))
        if name is not None:
            busy[name] += [(blazar_time(r["start_date"]), blazar_time(r["end_date"])) for r in allocation["reservations"]]
    return busy


def hourly_starts(window: Interval, length: timedelta, now: datetime) -> list[datetime]:
    """Whole hours from which a lease of ``length`` fits in the window and starts in the future."""
    earliest = max(utc(window[0]), utc(now))
    start = earliest.replace(minute=0, second=0, microsecond=0)
    if start < earliest:
        start += timedelta(hours=1)
    starts = []
    while start + length <= utc(window[1]):
        starts.append(start)
        start += timedelta(hours=1)
    return starts


def plan(students: Sequence[str], busy: Mapping[str, Sequence[Interval]], window: Interval, length: timedelta,
         now: datetime) -> dict[str, Slot | None]:
    """A slot per student: the earliest whole hour, then the first node by name, free for the whole lease.

    Each slot is taken before the next student is placed, so a class fills the free nodes first and
    then the following hours. None: no node is free long enough anywhere in the window."""
    taken = {node: list(intervals) for node, intervals in busy.items()}
    slots: dict[str, Slot | None] = {}
    for student in students:
        slots[student] = None
        for start in hourly_starts(window, length, now):
            end = start + length
            node = next((n for n in sorted(taken) if all(end <= b or e <= start for b, e in taken[n])), None)
            if node is not None:
                taken[node].append((start, end))
                slots[student] = Slot(node, start, end)
                break
    return slots


def _live_leases(prefix: str) -> dict[str, lease.Lease]:
    """This project's leases whose name starts with ``prefix`` and that still hold (or will hold) a node."""
    return {found.name: found for found in lease.list_leases()
            if found.name.startswith(prefix) and found.status not in ENDED}


def book_class(students: Iterable[str], window: Interval, *, node_type: str, length: timedelta, prefix: str,
               now: datetime | None = None) -> list[Row]:
    """Reserve a ``node_type`` node for each student within ``window`` (UTC); a Row per student, in order."""
    students = list(dict.fromkeys(students))
    existing = _live_leases(prefix)
    rows = {s: Row(s, f"{prefix}{s}", "", utc(existing[f"{prefix}{s}"].start_date),
                   utc(existing[f"{prefix}{s}"].end_date), "kept (it existed)")
            for s in students if f"{prefix}{s}" in existing}
    to_book = [s for s in students if s not in rows]
    slots = plan(to_book, reservations_by_node(node_type), window, length, now or datetime.now(timezone.utc))
    for student in to_book:
        name, slot = f"{prefix}{student}", slots[student]
        if slot is None:
            rows[student] = Row(student, name, "", None, None, "no free node in the window")
            continue
        try:
            new = lease.Lease(name, start_date=slot.start, end_date=slot.end)
            new.add_node_reservation(amount=1, node_name=slot.node)
            # idempotent: a lease made meanwhile under the same name is kept, not doubled.
            new.submit(idempotent=True, wait_for_active=False)
            status = "reserved"
        except Exception as exc:  # noqa: BLE001 - Blazar refusing one lease must not stop the class
            status = f"failed: {type(exc).__name__}: {exc}"
        rows[student] = Row(student, name, slot.node, slot.start, slot.end, status)
    return [rows[s] for s in students]


def delete_class_leases(students: Iterable[str], *, prefix: str) -> list[Row]:
    """Delete ``<prefix><netID>`` for each student that has one; other leases, even with the prefix, stay."""
    existing = _live_leases(prefix)
    rows = []
    for student in dict.fromkeys(students):
        name = f"{prefix}{student}"
        found = existing.get(name)
        if found is None:
            rows.append(Row(student, name, "", None, None, "no lease"))
            continue
        try:
            found.delete()
            status = "deleted"
        except Exception as exc:  # noqa: BLE001 - one lease that cannot be deleted must not keep the others
            status = f"failed: {type(exc).__name__}: {exc}"
        rows.append(Row(student, name, "", utc(found.start_date), utc(found.end_date), status))
    return rows


def manage(students: Iterable[str], window: Interval, *, delete: bool, node_type: str, length: timedelta,
           prefix: str) -> list[Row]:
    """The instructor's one cell: book the class's leases, or with ``delete`` only delete them (so a
    notebook run top to bottom never books and deletes); nothing at all without students."""
    students = list(students)
    if not students:
        return []
    if delete:
        return delete_class_leases(students, prefix=prefix)
    return book_class(students, window, node_type=node_type, length=length, prefix=prefix)


def table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table, times in UTC."""
    def when(moment: datetime | None) -> str:
        return f"{moment:%Y-%m-%d %H:%M}" if moment else "-"

    cells = [("student", "lease", "node", "start (UTC)", "end (UTC)", "status")]
    cells += [(r.student, r.lease, r.node or "-", when(r.start), when(r.end), r.status) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in cells)
