"""The GPU wheelhouse carried to a machine without network in calls of limited size (docs/gpu/README.md).

A call to the lent GPU machine carries at most 64 MiB, and it has no network: ``pack`` turns the wheelhouse into
numbered folders of at most a given size, each holding the same ``carry.json``, splitting files that do not fit
and leaving out the wheels the machine has (``preflight``'s list); there ``check`` proves a copied folder and
``join`` the whole. It runs there as a script, so it imports nothing but the standard library.
"""

import argparse
import hashlib
import importlib.metadata
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "carry.json"
SUMS = "SHA256SUMS"  # `sha256sum` format: whole files
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
CHUNK = 1 << 20
BLANK = "0" * 64  # a part's checksum before its bytes are written


class CarryError(Exception):
    """Bad input or a carry that does not check: the message says what and where."""


def parse_size(text: str) -> int:
    """``50M``, ``50MiB``, ``1K`` or a byte count; K, M and G are binary, as `split -b` reads them."""
    match = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not match or int(match[1]) == 0:
        raise CarryError(f"size {text!r}: give a positive number of bytes, or with K, M or G (binary), e.g. 50M")
    return int(match[1]) * UNITS[match[2].upper()]


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    with path.open("rb") as src:
        return hashlib.file_digest(src, "sha256").hexdigest()


def site_folders() -> list[str]:
    """This Python's own site folders: what .venv-gpu's gpu-python.pth names (the Makefile's $(GPU_STAMP))."""
    return [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]


def installed() -> dict[str, tuple[str, str]]:
    """{canonical name: (name, version)} in those folders; the first on the path wins, as for import and pip."""
    found: dict[str, tuple[str, str]] = {}
    for dist in importlib.metadata.distributions(path=site_folders()):
        if name := dist.metadata["Name"]:  # a dist-info without METADATA names nothing
            found.setdefault(canonical(name), (name, dist.version))
    return found


def preflight() -> str:
    lines = [f"# {sys.executable}: Python {sys.version.split()[0]}; site folders: {' '.join(site_folders())}"]
    lines += [f"{name}=={version}" for name, version in sorted(installed().values(), key=lambda nv: canonical(nv[0]))]
    return "\n".join(lines) + "\n"


def read_have(path: Path) -> dict[str, str]:
    """{canonical name: version} from a preflight list (``name==version`` lines, ``#`` comments)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CarryError(f"HAVE list {path}: {exc.strerror}") from None
    have = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise CarryError(f"{path} line {number}: {line!r} is not name==version (as `preflight` writes)")
        have[canonical(name.strip())] = version.strip()
    return have


@dataclass
class Piece:
    """One file of a folder: a whole wheelhouse file or a part of one (``length`` bytes from ``offset``)."""

    source: Path
    name: str
    offset: int
    length: int
    folder: str = ""


def read_sums(house: Path) -> dict[str, str]:
    sums_file = house / SUMS
    if not sums_file.is_file():
        raise CarryError(f"{house}: no {SUMS}; make the wheelhouse with `make gpu-wheelhouse`")
    sums = {}
    for number, line in enumerate(sums_file.read_text().splitlines(), 1):
        if not (match := re.fullmatch(r"([0-9a-f]{64}) [ *](.+)", line)):  # `sha256sum`'s text or binary mark
            raise CarryError(f"{sums_file} line {number}: {line!r} is not `sha256  name`")
        sums[match[2]] = match[1]
    return sums


def sums_problems(folder: Path, sums: dict[str, str]) -> list[str]:
    """The files of ``sums`` (a SHA256SUMS) missing from ``folder``, or there with other bytes."""
    return [f"missing: {name}" if not (folder / name).is_file() else f"corrupt: {name}: sha256 differs from {SUMS}"
            for name in sorted(sums) if not (folder / name).is_file() or sha256_file(folder / name) != sums[name]]


def first_fit_decreasing(pieces: list[Piece], capacity: int) -> list[list[Piece]]:
    """Folders of at most ``capacity`` bytes, largest piece first, each into the first folder it fits."""
    folders: list[list[Piece]] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda p: (-p.length, p.name)):
        slot = next((i for i, free in enumerate(room) if piece.length <= free), len(folders))
        if slot == len(folders):
            folders.append([])
            room.append(capacity)
        folders[slot].append(piece)
        room[slot] -= piece.length
    return folders


def cut(house: Path, name: str, capacity: int) -> list[Piece]:
    """The whole file where it fits a folder, else parts of ``capacity`` bytes (the last one shorter)."""
    if (size := (house / name).stat().st_size) <= capacity:
        return [Piece(house / name, name, 0, size)]
    count = -(-size // capacity)
    width = max(2, len(str(count - 1)))
    return [Piece(house / name, f"{name}.part-{i:0{width}d}", i * capacity, min(capacity, size - i * capacity))
            for i in range(count)]


def plan(house: Path, sums: dict[str, str], carried: list[str], left_out: dict[str, str], kept: dict[str, str],
         limit: int) -> tuple[list[list[Piece]], dict]:
    """The folders and their manifest (part checksums still blank: ``write_folders`` fills them in). Every folder
    holds the manifest too, so the pieces get what it leaves: packed again with less room until the manifest fits
    in what was set aside for it (a checksum is always 64 characters, so filling them in changes no size)."""

    def layout(capacity: int) -> tuple[list[list[Piece]], dict]:
        pieces = {name: cut(house, name, capacity) for name in carried}
        folders = first_fit_decreasing([p for ps in pieces.values() for p in ps], capacity)
        width = max(2, len(str(len(folders) - 1)))
        for number, folder in enumerate(folders):
            for piece in folder:
                piece.folder = f"{number:0{width}d}"
        return folders, {
            "folder_limit": limit,
            "folders": [f"{n:0{width}d}" for n in range(len(folders))],
            "files": [{"name": name, "size": (house / name).stat().st_size, "sha256": sums[name],
                       **({"kept": kept[name]} if name in kept else {}),
                       "parts": [{"name": p.name, "folder": p.folder, "size": p.length, "sha256": BLANK}
                                 for p in pieces[name]]}
                      for name in carried],
            "left_out": [{"name": name, "size": (house / name).stat().st_size, "sha256": sums[name],
                          "reason": reason} for name, reason in sorted(left_out.items())],
        }

    # The smallest manifest, every file whole; a limit near it would cut the files into countless parts.
    reserve = len(render(layout(max([(house / n).stat().st_size for n in carried], default=1))[1]))
    if limit < 2 * reserve:
        raise CarryError(f"a folder limit of {limit} bytes is too small: every folder holds the manifest, "
                         f"and it takes {reserve} bytes or more")
    while True:
        folders, manifest = layout(limit - reserve)
        if (needed := len(render(manifest))) <= reserve:
            return folders, manifest
        reserve = needed


def render(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def choose(sums: dict[str, str], have: dict[str, str], keep: list[str], have_path: str) -> tuple[list, dict, dict]:
    """(carried, {left out: why}, {kept although the machine has it: why})."""
    keep_specs = [(canonical(s.partition("==")[0]), s.partition("==")[2]) for s in keep]
    carried, left_out, kept = [], {}, {}
    for name in sorted(sums):
        fields = name.removesuffix(".whl").split("-") if name.endswith(".whl") else []  # not a .deb
        wheel = (canonical(fields[0]), fields[1]) if len(fields) in (5, 6) else None
        if wheel is None or have.get(wheel[0]) != wheel[1]:
            carried.append(name)
            continue
        has = f"the GPU machine has {wheel[0]}=={wheel[1]} ({have_path})"
        if any(k == wheel[0] and v in ("", wheel[1]) for k, v in keep_specs):
            carried.append(name)
            kept[name] = f"{has}, but the file itself is needed (--keep)"
        else:
            left_out[name] = f"{has}: pip takes it as installed"
    return carried, left_out, kept


def write_folders(out: Path, folders: list[list[Piece]], manifest: dict) -> None:
    """The folders under ``out``, replacing what was there; written beside it and renamed, never half-written."""
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    digests = {}
    for number, folder in zip(manifest["folders"], folders):
        (staging / number).mkdir(parents=True)
        for piece in folder:
            digests[piece.name] = copy_range(piece.source, piece.offset, piece.length, staging / number / piece.name)
    for entry in manifest["files"]:
        for part in entry["parts"]:
            part["sha256"] = digests[part["name"]]
    for number in manifest["folders"]:
        (staging / number / MANIFEST).write_bytes(render(manifest))
    replace_folder(staging, out)


def copy_range(source: Path, offset: int, length: int, target: Path) -> str:
    """``length`` bytes of ``source`` from ``offset`` into ``target``; their sha256."""
    digest = hashlib.sha256()
    with source.open("rb") as src, target.open("wb") as dst:
        src.seek(offset)
        while length > 0:
            chunk = src.read(min(CHUNK, length))
            digest.update(chunk)
            dst.write(chunk)
            length -= len(chunk)
    return digest.hexdigest()


def replace_folder(staging: Path, target: Path) -> None:
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def pack(house: Path, out: Path, limit: int, have_path: Path | None = None, keep: tuple[str, ...] = ()) -> dict:
    sums = read_sums(house)  # every file checked against it, and none beside it
    present = {p.name for p in house.iterdir() if p.is_file() and p.name != SUMS}
    problems = sums_problems(house, sums)
    problems += [f"{name}: in the folder, not in {SUMS} (a part of an older split?)" for name in sorted(present - sums.keys())]
    if problems:
        raise CarryError(f"{house} does not check; run `make gpu-wheelhouse` again:\n  " + "\n  ".join(problems))
    have = read_have(have_path) if have_path else {}
    carried, left_out, kept = choose(sums, have, list(keep), str(have_path))
    if not carried:
        raise CarryError(f"{house}: nothing to carry (no files, or every one left out)")
    folders, manifest = plan(house, sums, carried, left_out, kept, limit)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_folders(out, folders, manifest)
    return manifest


def summary(out: Path, manifest: dict) -> str:
    mib = 1 << 20
    sizes = [sum(f.stat().st_size for f in (out / n).iterdir()) for n in manifest["folders"]]
    carried = sum(f["size"] for f in manifest["files"])
    lines = [f"{out}: {len(sizes)} folders of at most {manifest['folder_limit'] / mib:.1f} MiB "
             f"(largest {max(sizes, default=0) / mib:.1f} MiB; {carried / mib:.1f} MiB of {len(manifest['files'])} files, "
             f"at least {-(-carried // manifest['folder_limit'])} folders)"]
    lines += [f"  {n}: {s / mib:5.1f} MiB" for n, s in zip(manifest["folders"], sizes)]
    lines += [f"  left out {e['name']}: {e['reason']}" for e in manifest["left_out"]]
    lines += [f"  kept {f['name']}: {f['kept']}" for f in manifest["files"] if "kept" in f]
    return "\n".join(lines)


def load_manifest(folder: Path) -> dict:
    try:
        manifest = json.loads((folder / MANIFEST).read_bytes())
    except (OSError, ValueError) as exc:
        raise CarryError(f"{folder / MANIFEST}: not readable as a carry manifest ({exc})") from None
    if not isinstance(manifest, dict) or not {"folders", "files", "left_out"} <= manifest.keys():
        raise CarryError(f"{folder / MANIFEST}: not a carry manifest (no folders, files and left_out)")
    return manifest


def part_problems(root: Path, manifest: dict, folders: set[str]) -> list[str]:
    """What is missing or corrupt among the parts that ``folders`` (under ``root``) should hold."""
    problems = []
    for entry in manifest["files"]:
        for part in entry["parts"]:
            if part["folder"] not in folders:
                continue
            path = root / part["folder"] / part["name"]
            where = f"{part['folder']}/{part['name']} (part of {entry['name']})"
            if not path.is_file():
                problems.append(f"missing: {where}")
            elif path.stat().st_size != part["size"]:
                problems.append(f"corrupt: {where}: {path.stat().st_size} bytes, the manifest says {part['size']}")
            elif sha256_file(path) != part["sha256"]:
                problems.append(f"corrupt: {where}: sha256 differs from the manifest's")
    return problems


def check_folder(folder: Path) -> str:
    """A copied carry folder's parts, or a joined wheelhouse's whole files (its SHA256SUMS)."""
    if (folder / SUMS).is_file():
        sums = read_sums(folder)
        if problems := sums_problems(folder, sums):
            raise CarryError(f"{folder}:\n  " + "\n  ".join(problems))
        return f"{folder}: {len(sums)} files match {SUMS}"
    if not (folder / MANIFEST).is_file():
        raise CarryError(f"{folder}: neither a wheelhouse (no {SUMS}) nor a carry folder (no {MANIFEST})")
    manifest = load_manifest(folder)
    if folder.name not in manifest["folders"]:
        raise CarryError(f"{folder}: its name is none of the manifest's folders {manifest['folders']}")
    if problems := part_problems(folder.parent, manifest, {folder.name}):
        raise CarryError(f"{folder}:\n  " + "\n  ".join(problems))
    count = sum(p["folder"] == folder.name for f in manifest["files"] for p in f["parts"])
    return f"{folder}: its {count} pieces check (folder {folder.name} of {len(manifest['folders'])})"


def join(root: Path, house: Path) -> str:
    """The whole files of the carry folders under ``root`` in ``house``, with a SHA256SUMS of them and the
    manifest; every part checked first, and nothing written unless all of them check."""
    found = sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []
    if not found:
        raise CarryError(f"{root}: no carry folders (NN/{MANIFEST}); copy the folders of `make gpu-carry` there")
    versions: dict[bytes, list[str]] = {}
    for path in found:
        versions.setdefault(path.read_bytes(), []).append(path.parent.name)
    if len(versions) > 1:
        groups = "; ".join(", ".join(names) for names in versions.values())
        raise CarryError(f"{root}: folders of different `make gpu-carry` runs ({groups}): copy those of one run")
    manifest = load_manifest(found[0].parent)
    present = {p.parent.name for p in found}
    problems = [f"missing: folder {n} (not copied to {root})" for n in manifest["folders"] if n not in present]
    problems += part_problems(root, manifest, present)
    if problems:
        raise CarryError(f"{root}: nothing joined:\n  " + "\n  ".join(problems))
    staging = house.with_name(f".{house.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for entry in manifest["files"]:
        with (staging / entry["name"]).open("wb") as out:
            for part in entry["parts"]:
                with (root / part["folder"] / part["name"]).open("rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
        if sha256_file(staging / entry["name"]) != entry["sha256"]:
            shutil.rmtree(staging)
            raise CarryError(f"corrupt: {entry['name']}: joined, its sha256 differs from the manifest's")
    (staging / SUMS).write_text("".join(f"{e['sha256']}  {e['name']}\n" for e in manifest["files"]))
    (staging / MANIFEST).write_bytes(found[0].read_bytes())
    replace_folder(staging, house)
    left = "".join(f"\n  left out {e['name']}: {e['reason']}" for e in manifest["left_out"])
    return f"{house}: {len(manifest['files'])} files joined from {len(present)} folders, each checked{left}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_carry", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("preflight", help="this Python's distributions, name==version (run it with GPU_PYTHON)")
    sub.add_parser("sites", help="this Python's site folders, one a line (.venv-gpu's gpu-python.pth)")
    p = sub.add_parser("pack", help="the wheelhouse as numbered folders of at most --size each")
    p.add_argument("wheelhouse", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--size", default="50M", help="the most one folder may hold (default 50M = 50 MiB)")
    p.add_argument("--have", type=Path, help="a preflight list: wheels of exactly those versions are left out")
    p.add_argument("--keep", nargs="*", default=[], help="name or name==version: carried even where the machine has it")
    p = sub.add_parser("check", help="a copied carry folder's parts, or a wheelhouse's SHA256SUMS")
    p.add_argument("folders", type=Path, nargs="+")
    p = sub.add_parser("join", help="the carry folders under ROOT joined into WHEELHOUSE, every part and file checked")
    p.add_argument("root", type=Path)
    p.add_argument("wheelhouse", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "preflight":
            print(preflight(), end="")
        elif args.command == "sites":
            print(*site_folders(), sep="\n")
        elif args.command == "pack":
            print(summary(args.out, pack(args.wheelhouse, args.out, parse_size(args.size), args.have, args.keep)))
        elif args.command == "check":
            for folder in args.folders:
                print(check_folder(folder))
        else:
            print(join(args.root, args.wheelhouse))
    except CarryError as exc:
        print(f"gpu_carry {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
