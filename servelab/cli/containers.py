"""`servelab containers`: run a lab stage from its compose file on this machine, with no GPU and no registry.

    servelab containers up --stage fastapi-pt     # private dockerd, stand-in images, compose up --wait
    servelab containers down --stage fastapi-pt   # compose down -v
    servelab containers stop                       # stop the private dockerd (by PID) and clean up
    servelab containers env                        # the variables to run `docker compose` by hand
    eval "$(servelab containers tag)"              # on the node: this commit's images (pulled where a registry is named)
"""

import argparse
import shlex
from pathlib import Path

from servelab.core.settings import get_settings
from servelab.tools.containers import compose_tool, images, standins
from servelab.tools.containers.compose_stages import STAGES, StageRunner, checkout_mounts
from servelab.tools.containers.engine import Engine, EngineState, stop_detached
from servelab.tools.docker_versions import read_env_file


def _cache() -> Path:
    return get_settings().servelab_containers_cache.expanduser()


def _runner(state: EngineState, free_ports: bool = False) -> StageRunner:
    cache = _cache()
    docker = compose_tool.docker(state.env, cache)
    settings = get_settings()
    return StageRunner(docker, cache / "work", standins.build_args(docker, cache, read_env_file()),
                       mounts=checkout_mounts(settings.model_dir, settings.triton_model_repository),
                       free_ports=free_ports)


def register(subparsers) -> None:
    p = subparsers.add_parser("containers", help="run a lab stage from its compose file on a private Docker engine",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="build the images and bring a stage up (waits until healthy)")
    up.add_argument("--free-ports", action="store_true", help="publish on free ports instead of the files' own")
    down = sub.add_parser("down", help="stop a stage and remove its containers, networks and volumes")
    for command in (up, down):  # the option they share, last
        command.add_argument("--stage", choices=sorted(STAGES), required=True)
    stop = sub.add_parser("stop", help="stop the private Docker engine (its containers stop with it)")
    env = sub.add_parser("env", help="print the shell variables for running `docker compose` by hand")
    tag = sub.add_parser("tag", help="print the exports that make `docker compose` run this commit's images")
    for command, func in ((up, _cmd_up), (down, _cmd_down), (stop, _cmd_stop), (env, _cmd_env), (tag, _cmd_tag)):
        command.set_defaults(func=func)


def _cmd_up(args) -> None:
    runner = _runner(Engine.attach(_cache()) or Engine(_cache(), detach=True).start(), args.free_ports)
    for service, ports in runner.up(STAGES[args.stage]).ports.items():
        for target, host in ports.items():
            print(f"{service}: http://127.0.0.1:{host} (container port {target})")


def _running() -> EngineState | None:
    if (state := Engine.attach(_cache())) is None:
        print("# no engine of ours is running: `servelab containers up --stage ...` starts one")
    return state


def _cmd_down(args) -> None:
    if (state := _running()) is not None:
        _runner(state).down(STAGES[args.stage])


def _cmd_stop(args) -> None:
    if not stop_detached(_cache()):
        print("no engine of ours is running")


def _cmd_env(args) -> int:
    if (state := _running()) is None:
        return 1
    variables = {**state.env, "DOCKER_CONFIG": str(compose_tool.docker_config(_cache())), "DOCKER_BUILDKIT": "0",
                 **_runner(state).build_args}
    print("\n".join(f"export {name}={shlex.quote(value)}" for name, value in variables.items()))
    print("# then, e.g.: docker compose -f docker/docker-compose-fastapi.yaml -f docker/no-gpu/docker-compose-fastapi.yaml up -d")
    return 0


def _cmd_tag(args) -> None:
    print("\n".join(f"export {name}={shlex.quote(value)}" for name, value in images.compose_env().items()))
