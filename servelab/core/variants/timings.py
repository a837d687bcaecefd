"""``servelab models variants``: the variants side by side, with their ms/image here and (given a Food-11
folder) their accuracy. Timings interleave the variants round by round, so a neighbour's load on a shared machine
falls on all of them alike; each figure is the median over the rounds."""

import re
import statistics
import time
from pathlib import Path

import numpy as np

from servelab.core.photos import evaluation_set, pixels
from servelab.core.preprocess import crop_pixels
from servelab.core.tables import markdown
from servelab.core.variants.build import VARIANTS, load_variants, machine, run_batches, session, variant_path


def time_variants(model_dir: Path, manifest, rounds: int = 5) -> dict[str, dict[int, float]]:
    """name -> {batch: median ms per image}."""
    images = pixels(evaluation_set()[:16], manifest.resize, manifest.crop)
    sessions = {name: session(variant_path(model_dir, name)) for name in VARIANTS}
    times: dict[str, dict[int, list[float]]] = {name: {1: [], 16: []} for name in VARIANTS}
    for _ in range(rounds):
        for name, sess in sessions.items():
            for batch, repeats in ((1, 20), (16, 2)):
                run = lambda: run_batches(sess, images[:batch], name == "fp32", manifest, batch)  # noqa: E731
                run()  # warm-up: the first run of a shape allocates
                started = time.perf_counter()
                for _ in range(repeats):
                    run()
                times[name][batch].append((time.perf_counter() - started) * 1e3 / (repeats * batch))
    return {name: {b: statistics.median(t) for b, t in by_batch.items()} for name, by_batch in times.items()}


def food11_labels(folder: Path) -> tuple[list[Path], np.ndarray]:
    """Photos and class indices of a Food-11 split: ``class_NN/*.jpg`` folders (the lab's layout) or
    ``N_M.jpg`` names (the dataset's original one)."""
    files, labels = [], []
    for path in sorted(Path(folder).rglob("*")):
        if path.suffix.lower() not in (".jpg", ".jpeg", ".png"):
            continue
        if match := re.fullmatch(r"class_(\d+)", path.parent.name) or re.match(r"(\d+)_", path.name):
            files.append(path)
            labels.append(int(match.group(1)))
    return files, np.array(labels)


def food11_accuracy(model_dir: Path, manifest, folder: Path) -> dict[str, float]:
    files, labels = food11_labels(folder)
    if not files:
        raise ValueError(f"{folder} holds no Food-11 photos (class_NN/ folders or N_M.jpg names)")
    crops = np.stack([crop_pixels(f.read_bytes(), **manifest.crop_kwargs()) for f in files])
    return {name: float((run_batches(session(variant_path(model_dir, name)), crops, name == "fp32", manifest)
                         .argmax(axis=1) == labels).mean()) for name in VARIANTS}


def table(model_dir: Path, manifest, rounds: int, food11: Path | None) -> str:
    record = load_variants(model_dir)
    times = time_variants(model_dir, manifest, rounds)
    accuracy = food11_accuracy(model_dir, manifest, food11) if food11 else {}
    lines = [f"machine: {machine()}",
             f"agreement: top-1 equal to fp32 on {record.evaluation.count} evaluation photos "
             f"({record.evaluation.sources} photographs); prob change: |change| of fp32's top-class probability",
             "",
             markdown(("variant", "file", "size MB", "precision", "agreement %", "max prob change", "mean prob change",
                       "ms/img b1", "ms/img b16", *(["Food-11 accuracy %"] if accuracy else [])),
                      [(v.name, v.file, f"{v.size_bytes / 1e6:.1f}", v.precision, f"{v.agreement.top1 * 100:.1f}",
                        f"{v.agreement.max_prob_change:.4f}", f"{v.agreement.mean_prob_change:.4f}",
                        f"{times[v.name][1]:.2f}", f"{times[v.name][16]:.2f}",
                        *([f"{accuracy[v.name] * 100:.1f}"] if accuracy else [])) for v in record.variants],
                      "llrlrrrrrr")]
    if food11:
        lines.append(f"\nFood-11 accuracy on {len(food11_labels(food11)[0])} photos from {food11}"
                     + (" (the offline stand-in: read it as a check, not the lab's figure)" if manifest.stand_in else ""))
    else:
        lines.append("\nFood-11 accuracy: not measured (no evaluation folder given: --food11 PATH)")
    return "\n".join(lines)
