"""``servelab class``: a class on Chameleon, for its instructor.

``status NETID ...``: where each student stands, from what Chameleon reports (``servelab.run.walkthrough.classroom``,
the status cell of ``1_create_lease`` too): each lease ``serve_system_<netID>`` (``serve_ray_<netID>`` with
``--ray-worker``), its nodes and servers; with ``--progress``, which notebooks' runs each active node holds, read over
SSH with the staff key that 2_create_server_nvidia added from notebooks/staff_keys.pub; with ``--leases FILE``, each student's leases and servers are added to FILE
for the grader's check (run it while the servers are up: Nova forgets a deleted one). It needs python-chi and your
Chameleon credentials (an OpenStack RC file, sourced). ``grade SUBMISSIONS/``: ``servelab report --check`` over each
student's ``SUBMISSIONS/<netID>/results``, held to their leases with ``--leases FILE``, as one table (docs/class.md).
"""

import argparse
import json
from pathlib import Path
from typing import Any

from servelab.core.hardware import NODE_TYPES, node_type
from servelab.report import check


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("class", help="a class on Chameleon: where each student stands; their grades",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    status = sub.add_parser("status", help="each student's leases, nodes, servers and where they stand")
    status.add_argument("students", nargs="+", metavar="NETID", help="the class's netIDs")
    status.add_argument("--node-type", default="gpu_p100", choices=sorted(NODE_TYPES),
                        help="the class's NODE_TYPE; its site is the one asked (default %(default)s)")
    status.add_argument("--ray-worker", metavar="TYPE",
                        help="also the Ray part's leases, whose worker is of this node type")
    status.add_argument("--project", help="the Chameleon project (default: the one of your credentials)")
    status.add_argument("--leases", type=Path, metavar="FILE", help="add each student's leases and servers to FILE")
    status.add_argument("--progress", action="store_true",
                        help="also the runs each active node holds, by notebook, read over SSH (who is stuck)")
    status.add_argument("--ssh-key", type=Path, metavar="FILE", help="with --progress: the private key of a key in "
                        "notebooks/staff_keys.pub (default: python-chi's own, Chameleon Jupyter's key pair)")
    status.set_defaults(func=_cmd_status)
    grade = sub.add_parser("grade", help="check every student's submission: one table with the rubric's points")
    grade.add_argument("submissions", type=Path, metavar="SUBMISSIONS", help="one folder per student, named by netID")
    grade.add_argument("--leases", type=Path, metavar="FILE", help="the class's lease file (servelab class status)")
    grade.set_defaults(func=_cmd_grade)


def _lease_file(path: Path | None) -> dict:
    """The class's lease file ({netID: [lease, ...]}); none yet: empty. A ValueError in one line where unreadable."""
    try:
        found = json.loads(path.read_text(encoding="utf-8")) if path and path.exists() else {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"cannot read the lease file {path}: {exc}") from None
    if not isinstance(found, dict):
        raise ValueError(f"the lease file {path} is not {{netID: [lease, ...]}}")
    return found


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        # Deferred: python-chi (about a hundred packages) is on the instructor's machine only, not in the images.
        from chi import context
        from keystoneauth1.exceptions import ClientException

        from servelab.run.walkthrough import classroom  # imports python-chi
    except ModuleNotFoundError as exc:
        print(f"error: servelab class needs python-chi ({exc}): pip install python-chi chameleon-blazarclient")
        return 2
    context.use_site(node_type(args.node_type).site)
    if args.project:
        context.use_project(args.project)
    try:
        known = _lease_file(args.leases)
        key = args.ssh_key and args.ssh_key.expanduser()
        if args.progress and key and not key.is_file():
            raise ValueError(f"no key file {args.ssh_key}: --ssh-key names the staff key's private half")
        rows = classroom.status(args.students, classroom.parts(args.node_type, args.ray_worker), args.progress,
                                key and str(key))
        held = classroom.leases_held(args.students, known) if args.leases else {}
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    except ClientException as exc:  # keystoneauth's: no credentials, wrong ones, or Chameleon out of reach
        print(f"error: Chameleon did not answer ({type(exc).__name__}: {exc}); source your project's OpenStack RC "
              "file (Horizon: API Access) first")
        return 2
    print(classroom.table(rows))
    if args.leases:
        args.leases.write_text(json.dumps({**known, **held}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.leases}: the leases and servers of {len(held)} students")
    return 0


def _cmd_grade(args: argparse.Namespace) -> int:
    """One table for the class; a student missing from the lease file is checked without leases, and said to be."""
    students = sorted(p for p in args.submissions.iterdir() if p.is_dir()) if args.submissions.is_dir() else []
    if not students:
        print(f"error: {args.submissions} holds no student's folder (SUBMISSIONS/<netID>/results/records.jsonl)")
        return 2
    try:
        if args.leases and not args.leases.is_file():
            raise ValueError(f"no lease file {args.leases}: servelab class status NETID ... --leases FILE writes it")
        held = _lease_file(args.leases)
        leases = {s.name: check.leases_of(held[s.name]) for s in students if s.name in held}
    except ValueError as exc:  # one line, not a traceback
        print(f"error: {exc}")
        return 2
    folders = {s.name: s / "results" if (s / "results").is_dir() else s for s in students}
    verdicts = check.check_all(list(folders.values()), leases={folders[s]: x for s, x in leases.items()})
    print(check.grade(dict(zip(folders, verdicts))))
    unleased = [s for s in folders if s not in leases]
    if unleased:
        print(f"not held to a lease (not in {args.leases or 'a lease file: --leases FILE'}): {', '.join(unleased)}")
    print("\n".join(line for verdict in verdicts for line in verdict.lines()[1:]))  # each finding, under the table
    return 1 if any(v.findings for v in verdicts) else 0
