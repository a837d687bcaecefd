"""``servelab class status NETID [NETID ...]``: where each student of a class stands, from what Chameleon reports
(``servelab.run.walkthrough.classroom.status``, the instructors' status cell of ``1_create_lease`` too): each
lease ``serve_system_<netID>`` (and ``serve_ray_<netID>`` with ``--ray-worker``), its nodes and its servers.

It needs python-chi and your Chameleon credentials in the environment (an OpenStack RC file, sourced).
"""

import argparse
from typing import Any

from servelab.core.hardware import NODE_TYPES, node_type


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("class", help="where each student of a class stands on Chameleon",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    status = sub.add_parser("status", help="each student's leases, nodes, servers and where they stand")
    status.add_argument("students", nargs="+", metavar="NETID", help="the class's netIDs")
    status.add_argument("--node-type", default="gpu_p100", choices=sorted(NODE_TYPES),
                        help="the class's NODE_TYPE; its site is the one asked (default %(default)s)")
    status.add_argument("--ray-worker", metavar="TYPE",
                        help="also the Ray part's leases, whose worker is of this node type")
    status.add_argument("--project", help="the Chameleon project (default: the one of your credentials)")
    status.set_defaults(func=_cmd_status)


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
        rows = classroom.status(args.students, classroom.parts(args.node_type, args.ray_worker))
    except ClientException as exc:  # keystoneauth's: no credentials, wrong ones, or Chameleon out of reach
        print(f"error: Chameleon did not answer ({type(exc).__name__}: {exc}); source your project's OpenStack RC "
              "file (Horizon: API Access) first")
        return 2
    print(classroom.table(rows))
    return 0
