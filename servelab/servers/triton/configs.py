"""The Triton stages of the catalogue (``servelab.core.catalogue``) rendered as model configs.

The committed ``models_staging/<model>/config.pbtxt`` files are the *base* configs, readable as plain
Triton configs; a stage replaces a few top-level fields (``instance_group``, ``dynamic_batching``), so
nothing is edited by hand. The base is parsed with Triton's own ``ModelConfig`` protobuf (a misspelt field
fails here, not in the server), then adapted to the machine (``effective_config``). Every rendering says
its stage in a ``servelab_stage`` parameter, so the server reports which stage it runs; the result goes to
``<model>/configs/stage.pbtxt`` (git-ignored), read by a server started with ``--model-config-name=stage``.
"""

from functools import partial
from pathlib import Path
from typing import Any, Literal

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from servelab.core.artifacts import write_atomic
from servelab.core.catalogue import ONNX, TRITON, Stage, of_family
from servelab.core.catalogue import get_stage as catalogue_stage
from servelab.core.hardware import gpu_count
from servelab.core.settings import get_settings
from servelab.servers.triton.python_backend import instance_count

Kind = Literal["gpu", "cpu"]
CONFIG_NAME = "stage"  # the server's --model-config-name
# The stand-in, relative to a model's version folder (where the Python backend looks for its file).
STAND_IN_FILE = f"../../{ONNX}/1/model.py"
STAND_IN_NOTE = ("LOCAL STAND-IN: Python backend running ONNX Runtime on model.onnx, because this "
                 "tritonserver has no onnxruntime backend; timings differ from the ONNX Runtime backend")


STAGES: dict[str, Stage] = of_family(TRITON.name)


def get_stage(name: str) -> Stage:
    return catalogue_stage(name, TRITON.name)


def resolve_kind(kind: str) -> Kind:
    if kind == "auto":
        return "gpu" if gpu_count() > 0 else "cpu"
    if kind not in ("gpu", "cpu"):
        raise ValueError(f"instance kind must be auto, gpu or cpu, not {kind!r}")
    return kind  # type: ignore[return-value]


def placed_on(kind: Kind) -> int:
    """The GPUs a config rendered here places instances on (0 for CPU instances: the ids stay as written)."""
    return gpu_count() if kind == "gpu" else 0


def base_config(repository: Path, model: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse((Path(repository) / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


# The ONNX Runtime backend's cudnn_conv_algo_search parameter takes the enum's number.
CUDNN_CONV_ALGO_SEARCH = {"EXHAUSTIVE": "0", "HEURISTIC": "1", "DEFAULT": "2"}


def onnx_warm_up(fields: dict[str, Any]) -> dict[str, Any]:
    """``model_warmup``: one zero-filled batch of *every* size up to ``max_batch_size`` (none where it is 0).

    Every size, not a few: Triton's batcher hands the model whatever has queued when the delay runs out
    (``preferred_batch_size`` is only a preference), and the ONNX Runtime backend chooses cuDNN algorithms for
    each new shape on a GPU (1.19.2, the node's, once per shape; from 1.20 on every change of shape, which no
    warm-up avoids: stage ``onnx-b16`` keeps one). The cost, 16 runs of 136 images per instance for the lab's
    models, is paid while the model loads instead of during a measurement."""
    if not (max_batch := int(fields.get("max_batch_size", 0))):
        return {}
    inputs = {i["name"]: {"data_type": i["data_type"], "dims": i["dims"], "zero_data": True} for i in fields["input"]}
    return {"model_warmup": [{"name": f"batch {n}", "batch_size": n, "inputs": inputs}
                             for n in range(1, max_batch + 1)]}


def on_gpus(groups: list[dict[str, Any]], gpus: int) -> tuple[list[dict[str, Any]], str | None]:
    """``KIND_GPU`` groups on the ``gpus`` GPUs there are: a GPU that is not there gives its instances to GPU
    ``id % gpus``, and the note says so (the stages spread instances over the lab node's two P100s)."""
    moved, placed = [], []
    for group in groups:
        ids = [int(i) for i in group.get("gpus", [])]
        if group.get("kind", "KIND_GPU") != "KIND_GPU" or all(i < gpus for i in ids):
            placed.append(group)
            continue
        for i in ids:  # one group per GPU id, so the count per GPU stays as written
            placed.append({**group, "gpus": [i % gpus]})
        moved += [i for i in ids if i >= gpus]
    if not moved:
        return groups, None
    return placed, (f"written for 2 GPUs (the lab node's P100s); this machine has {gpus}, so the instances "
                    f"of GPU {', '.join(map(str, sorted(set(moved))))} run on GPU "
                    f"{', '.join(str(i % gpus) for i in sorted(set(moved)))}, as many in all")


def block_fields(block: str) -> dict[str, Any]:
    """The fields a block of config.pbtxt a student wrote sets; ``text_format.ParseError`` where unreadable."""
    return json_format.MessageToDict(text_format.Parse(block, model_config_pb2.ModelConfig()),
                                     preserving_proto_field_name=True)


def effective_config(stage: Stage, model: str, *, kind: Kind, onnxruntime: bool,
                     repository: Path, gpus: int = 0, changes: dict[str, Any] | None = None
                     ) -> model_config_pb2.ModelConfig:
    """The config ``model`` runs with in ``stage`` on a server of that kind with ``gpus`` GPUs (0: not known
    here, the ids stay as written); ``changes``: fields to set instead of the stage's (a student's block).
    A model for the onnxruntime backend becomes, on a server without it, the local stand-in (a Python-backend
    model running ONNX Runtime, labelled ``servelab_stand_in``)."""
    fields = json_format.MessageToDict(base_config(repository, model), preserving_proto_field_name=True)
    fields.update(stage.triton.changes.get(model, {}) if changes is None else changes)
    parameters = fields.setdefault("parameters", {})
    # A student's block is labelled "(yours, kind)": the server never reports it as the catalogue's stage.
    parameters["servelab_stage"] = {"string_value": f"{stage.name} ({'' if changes is None else 'yours, '}{kind})"}
    if fields.get("backend") == "onnxruntime":
        fields.update(onnx_warm_up(fields))
        parameters["cudnn_conv_algo_search"] = {
            "string_value": CUDNN_CONV_ALGO_SEARCH[get_settings().ort_cudnn_conv_algo_search]}
    if kind == "cpu" and fields.get("instance_group"):
        fields["instance_group"] = [{"count": instance_count(fields["instance_group"]), "kind": "KIND_CPU"}]
    if kind == "gpu" and gpus and fields.get("instance_group"):
        fields["instance_group"], note = on_gpus(fields["instance_group"], gpus)
        if note:
            parameters["servelab_gpu_placement"] = {"string_value": note}
    if fields.get("backend") == "onnxruntime" and not onnxruntime:
        fields["backend"] = "python"
        fields["default_model_filename"] = STAND_IN_FILE
        parameters["servelab_stand_in"] = {"string_value": STAND_IN_NOTE}
    return json_format.ParseDict(fields, model_config_pb2.ModelConfig())


def render(config: model_config_pb2.ModelConfig) -> str:
    return text_format.MessageToString(config, use_short_repeated_primitives=True)


def write_effective(stage: Stage, *, kind: Kind, onnxruntime: bool, repository: Path,
                    block: str | None = None) -> list[Path]:
    """Write ``<model>/configs/stage.pbtxt`` for every model of the stage; returns the paths. ``block``: config
    fields a student wrote for the stage's model, in place of the stage's own changes; one Triton's protobuf
    cannot read is written as it stands, for Triton to refuse with its own message when it loads."""
    written, gpus = [], placed_on(kind)
    for model in stage.triton.models:
        config = partial(effective_config, stage, model, kind=kind, onnxruntime=onnxruntime, repository=repository,
                         gpus=gpus)
        if block is None or model != stage.triton.model:
            text, source = render(config()), "servelab/core/catalogue.py"
        else:
            try:
                text = render(config(changes=block_fields(block)))
            except text_format.ParseError:
                text = render(config(changes={})) + block
            source = "the block you wrote"
        dest = Path(repository) / model / "configs" / f"{CONFIG_NAME}.pbtxt"
        header = (f"# GENERATED by `servelab triton stage {stage.name}` ({kind}) from ../config.pbtxt and {source}: "
                  "edit those, not this file.\n")
        write_atomic(dest, lambda tmp: tmp.write_text(header + text))  # a server (re)loading never reads half a file
        written.append(dest)
    return written


# --- what Triton runs: a config read back after a load, against the stage's ---------------------------------

def served(config: dict[str, Any] | model_config_pb2.ModelConfig) -> dict[str, Any]:
    """What decides how a model serves, from a config as Triton reports it (``GET /v2/models/<m>/config``) or as
    servelab renders it: max_batch_size, the scheduler with its settings (one pbtxt line; "none": each instance
    runs one request at a time), the instances, the warm-up batch sizes, the response cache.

    Both sides go through Triton's protobuf, so fields left at their defaults read alike. Triton's own completion
    at load (``NormalizeModelConfig``, which ``--disable-auto-complete-config`` leaves on) is applied to a
    rendered config as Triton applies it: a dynamic batcher with no preferred size prefers max_batch_size."""
    if isinstance(config, dict):
        config = json_format.ParseDict(config, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    which = config.WhichOneof("scheduling_choice")
    scheduler = which or "none"  # an ensemble's steps, a sequence batcher's settings: not what a lesson varies
    if which == "dynamic_batching":
        batcher = model_config_pb2.ModelDynamicBatching()
        batcher.CopyFrom(config.dynamic_batching)
        if not batcher.preferred_batch_size and config.max_batch_size:
            batcher.preferred_batch_size.append(config.max_batch_size)
        scheduler = f"dynamic_batching {{ {text_format.MessageToString(batcher, as_one_line=True, use_short_repeated_primitives=True)} }}"
    groups = [f"{g.count}x {model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)}"
              + (f" on GPU {','.join(map(str, g.gpus))}" if g.gpus else "") for g in config.instance_group]
    return {"max_batch_size": config.max_batch_size, "scheduler": scheduler, "instances": " + ".join(groups) or "none",
            "warmup_batch_sizes": [w.batch_size for w in config.model_warmup],
            "response_cache": config.response_cache.enable}


def served_line(view: dict[str, Any]) -> str:
    """``served`` in one line, as a student compares two."""
    sizes = view["warmup_batch_sizes"]
    warm = f"warm-up batches {min(sizes)}-{max(sizes)}" if sizes else "no warm-up"
    return (f"max_batch_size {view['max_batch_size']}; scheduler: {view['scheduler']}; instances: "
            f"{view['instances']}; {warm}; response cache {'on' if view['response_cache'] else 'off'}")


def differences(meant: dict[str, Any], running: dict[str, Any]) -> list[str]:
    """Each field of ``served`` where the running config is not the one meant, both values named."""
    return [f"{key}: the stage's config has {meant.get(key)!r}, Triton runs {running.get(key)!r}"
            for key in dict.fromkeys([*meant, *running]) if meant.get(key) != running.get(key)]


def meant(stage: Stage, *, kind: Kind, onnxruntime: bool, repository: Path,
          gpus: int | None = None) -> dict[str, dict[str, Any]]:
    """``served`` for each model of ``stage``, as the catalogue renders it for a server of ``kind`` with ``gpus``
    (None: this machine's, as ``write_effective`` renders it)."""
    gpus = placed_on(kind) if gpus is None else gpus
    return {model: served(effective_config(stage, model, kind=kind, onnxruntime=onnxruntime, repository=repository,
                                           gpus=gpus)) for model in stage.triton.models}
