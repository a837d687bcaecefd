"""Download a file and verify it against a pinned git blob SHA-1 (what ``git ls-tree`` shows of a file of a
commit-pinned GitHub URL), all or nothing: nothing is written under its name until every byte has matched."""

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path


class FetchError(RuntimeError):
    """The download failed or did not match its pinned hash; nothing was left behind."""


def git_blob_sha1(data: bytes) -> str:
    """The SHA-1 git gives a file's content: sha1(b"blob <size>\\0" + data)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def holds(files: dict[Path, str]) -> bool:
    """Whether each file is there with the sha256 given (a build's outputs, a staged copy)."""
    return all(path.exists() and sha256_file(path) == sha for path, sha in files.items())


def write_atomic(dest: Path, write) -> None:
    """Write through a temporary file in the same folder, so readers never see half a file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; containers run as other users
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def copy_atomic(src: Path, dest: Path) -> None:
    """Copy ``src`` to ``dest`` the way ``write_atomic`` writes."""
    write_atomic(dest, lambda tmp: shutil.copyfile(src, tmp))


def fetch(url: str, dest: Path, expected_git_sha1: str, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` unless ``dest`` already holds the expected content."""
    dest = Path(dest)
    if dest.exists():
        if git_blob_sha1(dest.read_bytes()) == expected_git_sha1:
            return dest
        dest.unlink()  # a stale or corrupted cache entry: fetch again
    what = f"{url} (expected git blob SHA-1 {expected_git_sha1})"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()  # raises IncompleteRead when the body is shorter than announced
    except urllib.error.HTTPError as exc:
        raise FetchError(f"download of {what} failed: HTTP {exc.code} {exc.reason}") from None
    except Exception as exc:
        raise FetchError(f"download of {what} failed: {type(exc).__name__}: {exc}") from None
    if (actual := git_blob_sha1(data)) != expected_git_sha1:
        raise FetchError(f"download of {what} got {len(data)} bytes with git blob SHA-1 {actual}; refusing it")
    write_atomic(dest, lambda tmp: tmp.write_bytes(data))
    return dest
