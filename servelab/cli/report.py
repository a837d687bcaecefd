"""``servelab report``: the front of ``servelab.report``; with ``--check``, of ``servelab.report.check``."""

import argparse
from pathlib import Path
from typing import Any

from servelab.measure.records import DEFAULT_RECORDS, read_records
from servelab.report import check, render
from servelab.report.render import render_report, summary_table


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="render run records into results/report.md with plots",
                              description=render.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", type=Path, nargs="*", metavar="RECORDS",
                   help=f"JSONL record files (default {DEFAULT_RECORDS})")
    # The option form came first; scripts may still use it.
    p.add_argument("--records", dest="more_records", type=Path, nargs="+", default=[], metavar="RECORDS",
                   help="JSONL record files, as an option")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_RECORDS.parent, help="where report.md and plots go")
    p.add_argument("--check", action="store_true",
                   help="check instead of render: each RECORDS is a student's results folder (records.jsonl and the "
                        "report) or a records file; one line per finding, exit 1 where there is any")
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    given = [*args.records, *args.more_records]
    if args.check:
        verdicts = check.check_all(given or [DEFAULT_RECORDS.parent])
        print("\n".join(line for verdict in verdicts for line in verdict.lines()))
        return 1 if any(v.findings for v in verdicts) else 0
    files = given or [DEFAULT_RECORDS]
    missing = [p for p in files if not p.exists()]
    if missing:
        print(f"error: no records at {', '.join(map(str, missing))}; run `servelab load ... --out FILE` first")
        return 2
    records = read_records(files)
    if not records:
        print("error: the record files are empty")
        return 2
    path = render_report(records, args.out_dir, files)
    print(summary_table(records))
    print(f"wrote {path}")
    return 0
