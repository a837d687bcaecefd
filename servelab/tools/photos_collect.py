"""How ``servelab/data/photos/`` was made (maintainers only; nothing runs this at lab or test time).

Debian's desktop-background, jigsaw and children's-game packages ship real photographs under free licences, but
~650 MB of downloads for ~140 photos, so a downscaled copy is committed with each one's source, licence and
hashes in ``manifest.json``; each photo's four quadrants are four images (``servelab.core.photos`` keeps them on
one side of its split). GCompris packs its pictures into Qt resource files (``FILE.rcc:/member``, licensed by
the README stanza beside the member first); Enlightenment's backgrounds are Edje files with an embedded JPEG.

    apt-get download mate-backgrounds ...   # the packages named in SOURCES, into DEBS
    python -m servelab.tools.photos_collect DEBS
"""

import fnmatch
import hashlib
import io
import json
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

from PIL import Image

from servelab.core.photos import MANIFEST, PHOTO_DIR, Photo

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
    *[("enlightenment-data", f"usr/share/enlightenment/data/backgrounds/{name}.edj") for name in (
        "Bamboo", "Foggy-Trees", "God-Rays", "Green-Maple", "Lichen-Branches", "Mountain", "Peaks", "Red-Maple",
        "Sea-of-Lanterns", "Snow-Trees", "Spruce-Needles", "Sunset-Clouds", "White-Flower", "Yellow-Flower")],
    *[("tuxpaint-data", f"usr/share/tuxpaint/templates/{name}.jpg") for name in (
        "burnt_bark", "cliff", "corn_maze", "jellyfish", "lighthouse", "mossy_bark", "mossy_log", "mudstone",
        "ocean_splash", "ocean_waves", "redwoods_above", "rocks", "sheep", "spiders_web", "sun_behind_clouds",
        "sun_behind_leaves", "trees_above", "trees_at_dusk", "wool_mill_machine")],
    *[("gcompris-qt-data", f"usr/share/gcompris-qt/rcc/erase.rcc:/gcompris/src/activities/erase/resource/{name}.webp")
      for name in (
        "alpaca", "bee", "butterfly", "calf", "camels", "caterpillar", "chamaeleon", "cheetah", "crab", "dolphin",
        "flying_fox", "gibbon", "giraffe", "goat", "gorilla", "gosling", "heron", "horse", "kingfisher", "kitten",
        "long_nosed_monkey", "macaque", "meerkats", "northern_harrier", "nubian_ibex", "penguin", "pika",
        "red_panda", "rhinoceros", "spoonbills", "squirrel", "swans", "toucan")],
    *[("gcompris-qt-data", (f"usr/share/gcompris-qt/rcc/explore_{game}.rcc:"
                            f"/gcompris/src/activities/explore_{game}/resource/animals/{name}.webp"))
      for game, names in (
        ("farm_animals", ("cat", "chicken", "cow", "dog", "duck", "horse", "owl", "pig", "sheep")),
        ("world_animals", ("bison", "chameleon", "crocodile", "dragon", "giraffe", "hedgehog", "jaguar", "kangaroo",
                           "koala", "lemur", "moose", "narwhal", "panda", "polar_bear", "scarlet_macaw")),
    ) for name in names],
]
# Licences that allow redistributing modified copies; anything else in SOURCES is an error.
FREE_LICENCES = ("CC0", "CC-BY-", "CC-BY-SA-", "GPL-", "LGPL-", "BSD-", "public-domain")
SHORTER_SIDE = 256  # the lab's resize: preprocessing then only center-crops, and the copies stay small
JPEG_QUALITY = 80  # 88 made ~140 photographs 14 MB; 80 keeps them near 10 MB


def _stanzas(text: str):
    """The ``Key: value`` stanzas of a debian/copyright (or of GCompris's README, whose ``Files:``
    list follows on unindented lines): a line that is indented or has no colon continues the key."""
    for stanza in text.split("\n\n"):
        fields, key = {}, None
        for line in stanza.splitlines():
            if key and (line[:1] in (" ", "\t") or ":" not in line):
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        yield fields


def licence_of(copyright_file: Path, path: str) -> tuple[str, str]:
    """(licence, copyright holder) that a machine-readable debian/copyright gives ``path``: the last
    ``Files:`` stanza whose pattern matches wins. Patterns name upstream source paths, which a
    package may install elsewhere: a pattern matches the installed path's tail, or its file name."""
    found = ("", "")
    for fields in _stanzas(copyright_file.read_text()):
        if "License" in fields and any(_names(p, path) for p in fields.get("Files", "").split()):
            found = (fields["License"].split()[0], fields.get("Copyright", ""))
    return found


def _names(pattern: str, path: str) -> bool:
    return fnmatch.fnmatch("/" + path, "*/" + pattern) or Path(pattern).name == Path(path).name


def readme_licence(readme: str, name: str) -> tuple[str, str]:
    """(licence, copyright holder) a GCompris README gives ``name`` (relative to its folder); ("", "") if none."""
    for fields in _stanzas(readme):
        if name in fields.get("Files", "").split() and "License" in fields:
            # "CC-BY-SA 4.0" and "Public Domain" as debian/copyright spells them.
            licence = fields["License"].strip()
            licence = "public-domain" if licence.lower() == "public domain" else licence.replace(" ", "-")
            return licence, fields.get("Copyright", "")
    return "", ""


def rcc_members(data: bytes) -> dict[str, bytes]:
    """{path: bytes} of a Qt resource file (format versions 1-3; zlib-compressed members inflated)."""
    if data[:4] != b"qres":
        raise ValueError("not a Qt resource file")
    version, tree, payload, names = struct.unpack(">iiii", data[4:20])
    node_size = 22 if version >= 2 else 14
    members = {}

    def name(offset: int) -> str:
        length = struct.unpack(">H", data[names + offset:names + offset + 2])[0]
        return data[names + offset + 6:names + offset + 6 + 2 * length].decode("utf-16-be")

    def walk(index: int, prefix: str) -> None:
        node = tree + index * node_size
        name_offset, flags = struct.unpack(">iH", data[node:node + 6])
        path = f"{prefix}/{name(name_offset)}" if index else ""
        if flags & 2:  # a directory
            count, first = struct.unpack(">ii", data[node + 6:node + 14])
            for child in range(first, first + count):
                walk(child, path)
            return
        offset = payload + struct.unpack(">i", data[node + 10:node + 14])[0]
        blob = data[offset + 4:offset + 4 + struct.unpack(">I", data[offset:offset + 4])[0]]
        members[path] = zlib.decompress(blob[4:]) if flags & 1 else blob

    walk(0, "")
    return members


def largest_jpeg(data: bytes) -> bytes:
    """The largest JPEG embedded in ``data`` (an Edje file's background image), as its bytes."""
    best, best_area = b"", 0
    for start in (m.start() for m in re.finditer(b"\xff\xd8\xff", data)):
        try:
            with Image.open(io.BytesIO(data[start:])) as im:
                area = im.width * im.height
        except OSError:
            continue
        if area > best_area:
            best, best_area = data[start:_jpeg_end(data, start)], area
    return best


def _jpeg_end(data: bytes, start: int) -> int:
    """Index just past the EOI marker of the JPEG at ``start``, walking its segments."""
    i = start + 2
    while i < len(data):
        if (marker := data[i + 1]) == 0xD9:
            return i + 2
        if marker == 0xDA:  # start of scan: entropy-coded data until the next non-RST marker
            i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
            while not (data[i] == 0xFF and data[i + 1] not in (0x00, *range(0xD0, 0xD8))):
                i += 1
            continue
        i += 2 + (struct.unpack(">H", data[i + 2:i + 4])[0] if marker not in (0x01, *range(0xD0, 0xD8)) else 0)
    return len(data)


def source_of(root: Path, package: str, path: str) -> tuple[bytes, str, str]:
    """(the photograph's bytes, licence, copyright holder) of one SOURCES entry."""
    container, _, member = path.partition(":")
    data = (root / container).read_bytes()
    licence, holder = "", ""
    if member:
        members = rcc_members(data)
        data = members[member]
        folder = member.rsplit("/", 1)[0]
        while folder and not licence:  # the nearest README naming the member
            if f"{folder}/README" in members:
                licence, holder = readme_licence(members[f"{folder}/README"].decode(), member[len(folder) + 1:])
            folder = folder.rsplit("/", 1)[0]
        if not licence:
            upstream = member.replace("/gcompris/", "", 1)
            copyright_file = root / f"usr/share/doc/{package}/copyright"
            licence, holder = licence_of(copyright_file, upstream)
            if not any(_names(p, upstream) for fields in _stanzas(copyright_file.read_text()) if "License" in fields
                       for p in fields.get("Files", "").split() if p != "*"):
                licence = ""  # "Files: *" alone says nothing about a picture taken from elsewhere
    else:
        if container.endswith(".edj"):
            data = largest_jpeg(data)
        licence, holder = licence_of(root / f"usr/share/doc/{package}/copyright", container)
    if not licence.startswith(FREE_LICENCES):
        raise ValueError(f"{package}: no free licence for {path} ({licence or 'none found'})")
    return data, licence, holder


def _slug(path: str) -> str:
    # Plasma names its wallpapers by folder; every file is called by its resolution. A resource file's
    # member is named by the file and the member (two GCompris activities both have a giraffe).
    container, _, member = path.partition(":")
    if member:
        return f"{Path(container).stem}-{Path(member).stem}"
    parts = Path(path).parts
    return parts[-4] if parts[-2:-1] == ("images",) else Path(path).stem


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
                data, licence, holder = source_of(root, package, path)
                im = Image.open(io.BytesIO(data)).convert("RGB")
                w, h = (side // 2 for side in im.size)  # its four quadrants
                for q, part in enumerate(im.crop((x, y, x + w, y + h)) for y in (0, h) for x in (0, w)):
                    scale = SHORTER_SIDE / min(part.size)
                    part = part.resize((round(part.width * scale), round(part.height * scale)), Image.LANCZOS)
                    name = f"{package}-{_slug(path)}-q{q}.jpg"
                    part.save(dest / name, "JPEG", quality=JPEG_QUALITY)
                    photos.append(Photo(
                        file=name, sha256=hashlib.sha256((dest / name).read_bytes()).hexdigest(),
                        package=package, package_version=version, path="/" + path, quadrant=q,
                        source_sha256=hashlib.sha256(data).hexdigest(), licence=licence, copyright=holder))
    (dest / MANIFEST).write_text(json.dumps([p.model_dump() for p in photos], indent=1) + "\n")
    return photos


if __name__ == "__main__":
    print(f"{len(collect(Path(sys.argv[1])))} pictures written to {PHOTO_DIR}")
