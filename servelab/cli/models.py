"""``servelab models build | variants``: the model artifacts and their variants, timed side by side."""

from pathlib import Path

from servelab.core.artifacts import ModelSource, build_artifacts, load_manifest
from servelab.core.settings import get_settings
from servelab.core.variants.build import VARIANTS, build_variants, variant_path
from servelab.core.variants.timings import table


def register(subparsers) -> None:
    models = subparsers.add_parser("models", help="build the model artifacts")
    sub = models.add_subparsers(dest="models_command", required=True)
    build = sub.add_parser("build", help="build the state_dict, manifest, ONNX model and its variants (skipped when unchanged)")
    build.add_argument("--source", default="offline", help="offline (packaged zero-shot stand-in, default), lab (the "
                       "lab's real weights, downloaded and hash-verified), an http(s) URL, or a local .pth path")
    build.add_argument("--sha1", help="expected git blob SHA-1 of a URL or local source")
    build.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    variants = sub.add_parser("variants", help="the model's variants side by side: size, agreement with fp32, "
                                               "in-process ms/image at batch 1 and 16 on this machine")
    variants.add_argument("--rounds", type=int, default=5, help="timing rounds, all variants in each (default 5)")
    variants.add_argument("--food11", type=Path, help="a Food-11 evaluation folder: also report each variant's accuracy")
    for command, func, folder in ((build, _cli_build, "output folder"), (variants, _cli_variants, "model folder")):
        command.add_argument("--model-dir", type=Path, help=f"{folder} (default: MODEL_DIR)")
        command.set_defaults(func=func)


def _cli_build(args) -> None:
    settings = get_settings()
    source = ModelSource.parse(args.source, args.sha1)
    model_dir = args.model_dir or settings.model_dir
    manifest = build_artifacts(source, model_dir, settings.triton_model_repository, force=args.force)
    build_variants(model_dir, manifest, settings.triton_model_repository, force=args.force)
    if manifest.stand_in:
        print(f"models: NOTE this is a {manifest.description}")


def _cli_variants(args) -> int:
    model_dir = Path(args.model_dir or get_settings().model_dir)
    if missing := [name for name in VARIANTS if not variant_path(model_dir, name).exists()]:
        print(f"models: {', '.join(missing)} missing in {model_dir}: run `servelab models build` first")
        return 1
    print(table(model_dir, load_manifest(model_dir / "food11.json"), args.rounds, args.food11))
    return 0
