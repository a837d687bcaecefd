"""The fronts of ``servelab.core.installers``: the pinned third-party binaries the lab runs."""

import os
import subprocess
import sys

from servelab.core.installers import perf_analyzer_install as perf_analyzer
from servelab.core.installers import prometheus_install as prometheus
from servelab.core.installers import redis_install as redis
from servelab.core.installers.opt_tools import InstallError, cmd_check, cmd_install


def register(subparsers) -> None:
    pa = register_tool(subparsers, "perf-analyzer", perf_analyzer, perf_analyzer.PerfAnalyzerNotFound, "perf_analyzer",
                       "the pinned perf_analyzer into this environment, from its wheels (downloads once)",
                       help="install, check or run perf_analyzer (with its libraries on the library path)",
                       description="perf_analyzer, the same way locally and on the lab node: `servelab perf-analyzer "
                                   "run -- -m food_classifier -u 127.0.0.1:8000` runs it; `servelab load perf-analyzer` "
                                   "records its results.")
    run = pa.add_parser("run", help="run perf_analyzer with the given arguments (put them after --)")
    run.add_argument("args", nargs="*", help="perf_analyzer's own arguments")
    run.set_defaults(func=_run_perf_analyzer)
    register_tool(subparsers, "prometheus", prometheus, prometheus.PrometheusNotFound, "prometheus",
                  "Debian's prometheus into this environment, unpacked (no root)",
                  help="install or check the Prometheus the lab scrapes its servers with")
    register_tool(subparsers, "redis", redis, redis.RedisNotFound, "redis",
                  "Debian's redis-server into this environment, unpacked (no root)",
                  help="install or check the redis-server of the response cache")


def register_tool(subparsers, command: str, module, not_found: type[Exception], tool: str, what: str, **parser):
    """``servelab <command> install | check`` for a binary ``module`` installs into this environment."""
    sub = subparsers.add_parser(command, **parser).add_subparsers(dest="tool_command", required=True)
    inst = sub.add_parser("install", help=f"install {what}")
    inst.add_argument("--if-missing", action="store_true", help="do nothing when it is already installed")
    inst.set_defaults(func=lambda args: cmd_install(tool, args.if_missing, module.installed, module.install,
                                                    (InstallError, not_found, subprocess.SubprocessError)))
    sub.add_parser("check", help=f"say which {tool} would run, or how to get one").set_defaults(
        func=lambda args: cmd_check(tool, module.locate, not_found))
    return sub


def _run_perf_analyzer(args) -> int:
    try:
        pa = perf_analyzer.locate()
    except perf_analyzer.PerfAnalyzerNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.execve(pa.path, [str(pa.path), *args.args], pa.env())  # its exit code is ours
