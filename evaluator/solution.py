"""A solution on disk: ``model_new.py`` (``ModelNew``) plus optional ``kernels/`` sources.

The layout is CUDA Agent's workdir: ``model_new.py`` beside ``kernels/*.cu`` and the C++
bindings (``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``), which the harness builds as the torch
extension ``solution_ext``; or a single file whose CUDA lives in ``load_inline`` strings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

MODEL_NEW = "model_new.py"
KERNELS = "kernels"
KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp")
MAX_FILE_BYTES = 1 << 20


class SolutionError(ValueError):
    """A solution path that cannot be read as a solution; the message is one line."""


@dataclass(frozen=True)
class Solution:
    name: str
    model_new: str
    kernels: dict[str, str] = field(default_factory=dict)  # path under kernels/ -> source

    @property
    def digest(self) -> str:
        blob = json.dumps([self.model_new, sorted(self.kernels.items())]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def files(self) -> dict[str, str]:
        """What the harness's directory receives beside the task."""
        return {MODEL_NEW: self.model_new, **{f"{KERNELS}/{k}": v for k, v in self.kernels.items()}}


def load_solution(path: Path) -> Solution:
    path = Path(path)
    if path.is_file():
        return Solution(path.stem, _read(path))
    if not path.is_dir():
        raise SolutionError(f"{path} is neither a model_new.py file nor a solution directory")
    if not (path / MODEL_NEW).is_file():
        raise SolutionError(f"{path} has no {MODEL_NEW}")
    kernels = {}
    root = path / KERNELS
    if root.is_dir():
        for source in sorted(root.rglob("*")):
            if source.is_file() and source.suffix in KERNEL_SUFFIXES:
                kernels[source.relative_to(root).as_posix()] = _read(source)
    return Solution(path.name, _read(path / MODEL_NEW), kernels)


def _read(path: Path) -> str:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise SolutionError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SolutionError(f"{path} cannot be read as text: {exc}") from exc
