"""``servelab perf-analyzer install | check | run``, ``servelab prometheus install | check`` and ``servelab redis
install | check``: the fronts of ``servelab.core.installers`` (the pinned third-party binaries the lab runs)."""

import os
import subprocess
import sys

from servelab.core.installers import perf_analyzer_install as perf_analyzer, prometheus_install as prometheus
from servelab.core.installers import redis_install as redis
from servelab.core.installers.opt_tools import InstallError, cmd_check, cmd_install


def register(subparsers) -> None:
    register_perf_analyzer(subparsers)
    register_prometheus(subparsers)
    register_redis(subparsers)


def register_perf_analyzer(subparsers) -> None:
    p = subparsers.add_parser(
        "perf-analyzer", help="install, check or run perf_analyzer (with its libraries on the library path)",
        description="perf_analyzer, the same way locally and on the lab node. `servelab perf-analyzer run -- "
                    "-m food_classifier -u 127.0.0.1:8000 --concurrency-range 8` runs it with its libraries; "
                    "`servelab load perf-analyzer` runs it and records its results.")
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


def register_prometheus(subparsers) -> None:
    p = subparsers.add_parser("prometheus", help="install or check the Prometheus the lab scrapes its servers with")
    sub = p.add_subparsers(dest="prom_command", required=True)
    inst = sub.add_parser("install", help="unpack Debian's Prometheus into this environment (no root)")
    inst.add_argument("--if-missing", action="store_true", help="do nothing when it is already installed")
    inst.set_defaults(func=_install_prometheus)
    sub.add_parser("check", help="say which Prometheus would run, or how to get one").set_defaults(func=_check_prometheus)


def _install_prometheus(args) -> int:
    return cmd_install("prometheus", args.if_missing, prometheus.installed, prometheus.install,
                       (InstallError, prometheus.PrometheusNotFound, subprocess.SubprocessError))


def _check_prometheus(args) -> int:
    return cmd_check("prometheus", prometheus.locate, prometheus.PrometheusNotFound)


def register_redis(subparsers) -> None:
    p = subparsers.add_parser("redis", help="install or check the redis-server of the response cache")
    sub = p.add_subparsers(dest="redis_command", required=True)
    inst = sub.add_parser("install", help="unpack Debian's redis-server into this environment (no root)")
    inst.add_argument("--if-missing", action="store_true", help="do nothing when it is already installed")
    inst.set_defaults(func=_install_redis)
    sub.add_parser("check", help="say which redis-server would run, or how to get one").set_defaults(func=_check_redis)


def _install_redis(args) -> int:
    return cmd_install("redis", args.if_missing, redis.installed, redis.install,
                       (InstallError, redis.RedisNotFound, subprocess.SubprocessError))


def _check_redis(args) -> int:
    return cmd_check("redis", redis.locate, redis.RedisNotFound)
