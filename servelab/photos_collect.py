"""How ``servelab/data/photos/`` was made (maintainers only; nothing runs this at lab or test time).

Debian's desktop-background and jigsaw packages ship real photographs under free licences, but
installing them costs ~200 MB of downloads for ~50 photos, so a small, downscaled copy is committed
instead, with each picture's package, version, path, licence and hashes in ``manifest.json``. Each
photo gives four pictures, its quadrants, so ~50 photographs make ~200 distinct images; the
calibration/evaluation split (``servelab.photos``) keeps all quadrants of one photo on one side.

    apt-get download mate-backgrounds ...   # the packages named in SOURCES, into DEBS
    python -m servelab.photos_collect DEBS
"""

import fnmatch
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from servelab.photos import MANIFEST, PHOTO_DIR, Photo

# (package, installed path): every real photograph found in these packages (drawings, renders and
# textures left out by eye).
SOURCES = [
    *[("lomiri-wallpapers-16.04", f"usr/share/backgrounds/{name}.jpg") for name in (
        "Bridge_by_Sander_Klootwijk", "Dragonfly_by_Bolly", "Picture_0B_by_freespace", "Picture_1A_by_freespace",
        "Wine_by_Jakkub_Mede", "aitzgorri_by_Aitzol_Berasategi", "free_by_Peter_Nerlich",
        "friends_by_Aitzol_Berasategi", "life_by_Aitzol_Berasategi", "picosdeeuropa_by_Aitzol_Berasategi",
        "seeding_by_Clements_Engelhardt", "sunset_by_Aitzol_Berasategi")],
    ("lomiri-wallpapers-20.04", "usr/share/backgrounds/Kleiber_by_Lukas_Baubkus.jpg"),
    *[("mate-backgrounds", f"usr/share/backgrounds/mate/nature/{name}.jpg") for name in (
        "Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird", "RainDrops", "Storm",
        "TwoWings", "Wood", "YellowFlower")],
    *[("lxqt-themes", f"usr/share/lxqt/wallpapers/{name}") for name in (
        "Butterfly-Kenneth-Wimer.jpg", "Valendas.png", "after-the-rain.jpg", "appleflower.png", "beam.png",
        "butterfly.png", "cloud.png", "drop.png", "flowers.png", "fog.jpg", "this-is-not-windows.jpg")],
    *[("palapeli-data", f"usr/share/palapeli/collection/{name}.jpg") for name in (
        "castle-maintenon", "cincinnati-bridge", "citrus-fruits", "european-honey-bee", "panther-chameleon-female")],
    *[("plasma-workspace-wallpapers", f"usr/share/wallpapers/{name}/contents/images/1920x1080.jpg") for name in (
        "BytheWater", "ColdRipple", "EveningGlow", "FallenLeaf", "Grey", "OneStandsOut", "Path", "summer_1am")],
]
SHORTER_SIDE = 256  # the lab's resize: preprocessing then only center-crops, and the copies stay small
JPEG_QUALITY = 88


def licence_of(copyright_file: Path, path: str) -> tuple[str, str]:
    """(licence, copyright holder) that a machine-readable debian/copyright gives ``path``: the last
    ``Files:`` stanza whose pattern matches wins. Patterns name upstream source paths, which a
    package may install elsewhere: a pattern matches the installed path's tail, or its file name."""
    found = ("", "")
    for stanza in copyright_file.read_text().split("\n\n"):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        patterns = fields.get("Files", "").split()
        if "License" in fields and any(fnmatch.fnmatch("/" + path, "*/" + p) or Path(p).name == Path(path).name
                                       for p in patterns):
            found = (fields["License"].split()[0], fields.get("Copyright", ""))
    return found


def _slug(path: str) -> str:
    # Plasma names its wallpapers by folder; every file is called by its resolution.
    parts = Path(path).parts
    return parts[-4] if parts[-2:-1] == ("images",) else Path(path).stem


def quadrants(im: Image.Image) -> list[Image.Image]:
    w, h = im.size
    return [im.crop((x, y, x + w // 2, y + h // 2)) for y in (0, h // 2) for x in (0, w // 2)]


def collect(debs: Path, dest: Path = PHOTO_DIR) -> list[Photo]:
    photos = []
    with tempfile.TemporaryDirectory() as tmp:
        for package in sorted({p for p, _ in SOURCES}):
            deb = next(debs.glob(f"{package}_*.deb"))
            subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/{package}"], check=True)
            version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True,
                                     capture_output=True, text=True).stdout.strip()
            root = Path(tmp, package)
            for _, path in (s for s in SOURCES if s[0] == package):
                source = root / path
                licence, holder = licence_of(root / f"usr/share/doc/{package}/copyright", path)
                if not licence:
                    raise ValueError(f"{package}: no licence for {path}")
                im = Image.open(source).convert("RGB")
                for q, part in enumerate(quadrants(im)):
                    scale = SHORTER_SIDE / min(part.size)
                    part = part.resize((round(part.width * scale), round(part.height * scale)), Image.LANCZOS)
                    name = f"{package}-{_slug(path)}-q{q}.jpg"
                    part.save(dest / name, "JPEG", quality=JPEG_QUALITY)
                    photos.append(Photo(
                        file=name, sha256=hashlib.sha256((dest / name).read_bytes()).hexdigest(),
                        package=package, package_version=version, path="/" + path, quadrant=q,
                        source_sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
                        licence=licence, copyright=holder))
    (dest / MANIFEST).write_text(json.dumps([p.model_dump() for p in photos], indent=1) + "\n")
    return photos


if __name__ == "__main__":
    print(f"{len(collect(Path(sys.argv[1])))} pictures written to {PHOTO_DIR}")
