"""``servelab report``: the front of ``servelab.report``; with ``--check``, of ``servelab.report.check``."""

import argparse
import json
from pathlib import Path
from typing import Any

from servelab.measure.records import DEFAULT_RECORDS, read_records
from servelab.report import check, render


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="render run records into results/report.md with plots",
                              description=render.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", type=Path, nargs="*", metavar="RECORDS",
                   help=f"JSONL record files, or folders holding a {DEFAULT_RECORDS.name} (default {DEFAULT_RECORDS})")
    # The option form came first; scripts may still use it.
    p.add_argument("--records", dest="more_records", type=Path, nargs="+", default=[], metavar="RECORDS",
                   help="JSONL record files, as an option")
    p.add_argument("--out-dir", type=Path, help=f"where report.md and plots go (default: the one folder given, else "
                                                 f"{DEFAULT_RECORDS.parent})")
    p.add_argument("--check", action="store_true",
                   help="check instead of render: each RECORDS is a student's results folder (records.jsonl and the "
                        "report) or a records file; one line per finding, exit 1 where there is any")
    p.add_argument("--lease", type=Path, metavar="FILE", help='with --check: the student\'s leases, JSON: {"start": '
                   'ISO, "end": ISO, "servers": [server id, ...]} or a list (a student of servelab class status --leases)')
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    given = [*args.records, *args.more_records]
    if args.check:
        try:
            leases = check.leases_of(json.loads(args.lease.read_text(encoding="utf-8"))) if args.lease else []
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # one line, not a traceback
            print(f"error: {exc}")
            return 2
        verdicts = check.check_all(paths := given or [DEFAULT_RECORDS.parent], leases={p: leases for p in paths})
        print("\n".join(line for verdict in verdicts for line in verdict.lines()))
        return 1 if any(v.findings for v in verdicts) else 0
    # A folder stands for its records file: `servelab report results` is what the check tells a student to run.
    files = [p / DEFAULT_RECORDS.name if p.is_dir() else p for p in given] or [DEFAULT_RECORDS]
    try:  # missing, unreadable, not UTF-8, not a record or none: one line, not a traceback
        if missing := [p for p in files if not p.is_file()]:
            raise ValueError(f"no records at {', '.join(map(str, missing))}; run `servelab load ... --out FILE` first")
        if not (records := read_records(files)):
            raise ValueError("the record files are empty")
    except (OSError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    out_dir = args.out_dir or (given[0] if len(given) == 1 and given[0].is_dir() else DEFAULT_RECORDS.parent)
    path = render.render_report(records, out_dir, files)
    print(f"{render.summary_table(records)}\nwrote {path}")
    return 0

