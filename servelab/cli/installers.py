"""``servelab perf-analyzer install | check | run``, ``servelab prometheus install | check`` and ``servelab redis
install | check``: the fronts of ``servelab.core.installers`` (the pinned third-party binaries the lab runs)."""

import os
import subprocess
import sys

from servelab.core.installers import perf_analyzer_install as perf_analyzer
from servelab.core.installers import prometheus_install as prometheus
from servelab.core.installers import redis_install as redis
from servelab.core.installers.opt_tools import InstallError, cmd_check, cmd_install


def register(subparsers) -> None:
    register_perf_analyzer(subparsers)
    register_prometheus(subparsers)
    register_redis(subparsers)


def register_perf_analyzer(subparsers) -> None:
    p = subparsers.add_parser(
        "perf-analyzer", help="install, check or run perf_analyzer (with its libraries on the library path)",
        description="perf_analyzer, the same way locally and on the lab node: `servelab perf-analyzer run -- -m "
                    "food_classifier -u 127.0.0.1:8000` runs it; `servelab load perf-analyzer` records its results.")
    sub = p.add_subparsers(dest="pa_command", required=True)
    inst = sub.add_parser("install", help="extract the pinned perf_analyzer into this environment (downloads once)")
    inst.add_argument("--if-missing", action="store_true", help="do nothing when the pinned copy is already installed")
    inst.set_defaults(func=_install_perf_analyzer)
    sub.add_parser("check", help="say which perf_analyzer would run, or how to get one").set_defaults(func=_check_perf_analyzer)
    run = sub.add_parser("run", help="run perf_analyzer with the given arguments (put them after --)")
    run.add_argument("args", nargs="*", help="perf_analyzer's own arguments")
    run.set_defaults(func=_run_perf_analyzer)


def _install_perf_analyzer(args) -> int:
    return cmd_install("perf_analyzer", args.if_missing, perf_analyzer.installed, perf_analyzer.install)


def _check_perf_analyzer(args) -> int:
    return cmd_check("perf_analyzer", perf_analyzer.locate, perf_analyzer.PerfAnalyzerNotFound)


def _run_perf_analyzer(args) -> int:
    try:
        pa = perf_analyzer.locate()
    except perf_analyzer.PerfAnalyzerNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.execve(pa.path, [str(pa.path), *args.args], pa.env())  # its exit code is ours


def register_debian_tool(subparsers, name: str, what: str, module, not_found: type[Exception]) -> None:
    """``servelab <name> install | check`` for a tool unpacked from Debian's packages into this environment
    (``module``: its installer, with ``installed``, ``install`` and ``locate``)."""
    p = subparsers.add_parser(name, help=f"install or check {what}")
    sub = p.add_subparsers(dest="tool_command", required=True)
    inst = sub.add_parser("install", help=f"unpack Debian's {name} into this environment (no root)")
    inst.add_argument("--if-missing", action="store_true", help="do nothing when it is already installed")
    inst.set_defaults(func=lambda args: cmd_install(name, args.if_missing, module.installed, module.install,
                                                    (InstallError, not_found, subprocess.SubprocessError)))
    sub.add_parser("check", help=f"say which {name} would run, or how to get one").set_defaults(
        func=lambda args: cmd_check(name, module.locate, not_found))


def register_prometheus(subparsers) -> None:
    register_debian_tool(subparsers, "prometheus", "the Prometheus the lab scrapes its servers with", prometheus,
                         prometheus.PrometheusNotFound)


def register_redis(subparsers) -> None:
    register_debian_tool(subparsers, "redis", "the redis-server of the response cache", redis, redis.RedisNotFound)
