"""Model files: the default model, GGUF checks and fingerprints."""

from .default import DEFAULT_MODEL, ModelSpec, default_model_path, fetch_default_model, workbench_home
from .files import check_model_file, fingerprint

__all__ = [
    "DEFAULT_MODEL", "ModelSpec", "check_model_file", "default_model_path", "fetch_default_model",
    "fingerprint", "workbench_home",
]
