"""`servelab triton`: stages, a local tritonserver without Docker, and stage switching."""

import json
from urllib.parse import urlsplit

from servelab.core.catalogue import TRITON, default_stage
from servelab.core.settings import get_settings
from servelab.servers.triton import configs as stages
from servelab.servers.triton import server


def register(subparsers) -> None:
    triton = subparsers.add_parser("triton", help="Triton stages and a local tritonserver without Docker")
    sub = triton.add_subparsers(dest="triton_command", required=True)
    sub.add_parser("stages", help="list the named stages").set_defaults(func=_stages)
    render = sub.add_parser("render", help="print a stage's effective configs without touching a server")
    render.add_argument("name", choices=list(stages.STAGES))
    render.add_argument("--stand-in", action="store_true",
                        help="render the ONNX model as the local Python-backend stand-in")
    up = sub.add_parser("up", help="start the bundled tritonserver (127.0.0.1) and wait until the stage is READY")
    up.add_argument("--stage", default=default_stage(TRITON.name), choices=list(stages.STAGES))
    up.add_argument("--port", type=int, help="HTTP port (default: the port of TRITON_SERVER_URL)")
    up.add_argument("--grpc-port", type=int, help="default: HTTP port + 1")
    up.add_argument("--metrics-port", type=int, help="default: HTTP port + 2")
    stage = sub.add_parser("stage", help="write a stage's configs into the model repository and (re)load it")
    stage.add_argument("name", choices=list(stages.STAGES))
    stage.add_argument("--url", help="Triton HTTP host:port (default: the server `up` started, else TRITON_SERVER_URL)")
    for command, func, kind_default in ((render, _render, "TRITON_INSTANCE_KIND"), (up, _up, "TRITON_INSTANCE_KIND"),
                                        (stage, _stage, "the kind `up` started with, else TRITON_INSTANCE_KIND")):
        command.add_argument("--kind", choices=["auto", "gpu", "cpu"], help=f"default: {kind_default}")
        command.set_defaults(func=func)
    sub.add_parser("down", help="stop the tritonserver `up` started").set_defaults(func=_down)


def _stages(args) -> None:
    for stage in stages.STAGES.values():
        print(f"{stage.name:9} {stage.triton.model:25} {stage.about}")


def _render(args) -> None:
    settings = get_settings()
    kind = stages.resolve_kind(args.kind or settings.triton_instance_kind)
    stage = stages.STAGES[args.name]
    for model in stage.triton.models:
        config = stages.effective_config(stage, model, kind=kind, onnxruntime=not args.stand_in,
                                         repository=settings.triton_model_repository)
        print(f"# {model}/configs/{stages.CONFIG_NAME}.pbtxt\n{stages.render(config)}")


def _up(args) -> int:
    if running := server.load_state():
        print(f"triton: already running (pid {running['pids'][0]}, {running['url']}, stage {running['stage']}); "
              "`servelab triton stage NAME` switches it, `servelab triton down` stops it")
        return 1
    settings = get_settings()
    http = args.port or urlsplit(f"//{server.server_address(settings.triton_server_url)}").port or 8000
    ports = server.Ports(http, args.grpc_port or http + 1, args.metrics_port or http + 2)
    stage = stages.STAGES[args.stage]
    print(f"triton: starting tritonserver with stage {stage.name} ({stage.about}) ...", flush=True)
    try:  # detached: it runs on after `up` returns, until `down`
        local = server.start_local(stage, ports=ports, kind=args.kind or settings.triton_instance_kind,
                                   repository=settings.triton_model_repository, detach=True)
    except (RuntimeError, TimeoutError) as exc:  # the message ends with the server log's last lines
        print(f"triton: tritonserver did not become ready: {exc}")
        return 1
    server.save_state(server.state_of(local))
    print(f"triton: {stage.triton.model} READY ({local.kind}) at http://{local.url}, gRPC {local.grpc_url}, "
          f"metrics http://127.0.0.1:{ports.metrics}/metrics; pid {local.process.pid}, log {local.process.log}")
    if not local.onnxruntime:
        print("triton: NOTE no onnxruntime backend here: food_classifier_onnx runs as a LOCAL STAND-IN "
              "(Python backend + ONNX Runtime)")
    return 0


def _stage(args) -> int:
    target = server.switch_target(args.url, args.kind)
    stage = stages.STAGES[args.name]
    try:
        config = server.apply_stage(target.url, stage, kind=target.kind, onnxruntime=target.onnxruntime,
                                    repository=target.repository, key=_control_key(target.url))
    except (OSError, RuntimeError) as exc:
        print(f"triton: could not switch {target.url} to stage {stage.name}: {exc}")
        return 1
    if target.saved:
        server.save_state({**target.saved, "stage": stage.name})
    print(f"# stage {stage.name} ({target.kind}) on {target.url}: {stage.about}; loaded {', '.join(stage.triton.models)}")
    # Read back and checked before this prints (a config Triton runs otherwise fails the switch): one line each.
    wanted = stages.meant(stage, kind=target.kind, onnxruntime=target.onnxruntime, repository=target.repository)
    for model, view in wanted.items():
        print(f"# {model}, the stage's config: {stages.served_line(view)}")
        print(f"# {model}, as Triton runs it: {stages.served_line(stages.served(server.model_config(target.url, model)))}")
    print(f"# GET /v2/models/{stage.triton.model}/config:\n{json.dumps(config, indent=2)}")
    return 0


def _control_key(url: str) -> str:
    """The Triton's model-control key; in the node's shell, where no ADMIN_TOKEN is set, the one `servelab
    secrets` wrote for the compose files."""
    if key := server.control_key(url):
        return key
    try:  # deferred: the images leave the container tools out (and give Jupyter ADMIN_TOKEN instead)
        from servelab.tools.containers import node_secrets
    except ImportError:
        return ""
    return node_secrets.read(node_secrets.SECRETS_DIR / "lab.env").get(node_secrets.FILES["lab.env"], "")  # {}: none


def _down(args) -> None:
    state = server.stop_saved()
    print("triton: no tritonserver started by `servelab triton up` is running" if state is None
          else f"triton: stopped pid {state['pids'][0]} ({state['url']}, stage {state['stage']})")
