"""An episode's working directory: the task, the agent's instructions and its commands.

The agent writes ``model_new.py`` and ``kernels/`` beside a copy of the task (``model.py``).
The files it is given are recorded by content hash when the directory is made, so the loop can
tell afterwards whether any was changed; the shell also mounts them read-only. Neither matters
for the reward, which is computed from the original task code, but a changed reference is a
sign of an attempted hack worth recording.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from opsynth.evaluator.solution import KERNELS, MODEL_NEW, Solution, SolutionError, load_solution
from opsynth.record import Task

MODEL = "model.py"
INSTRUCTIONS = "INSTRUCTIONS.md"
# One script per trainer.commands subcommand. -P keeps the workdir off sys.path, so a file the
# agent names like a package cannot replace the command.
COMMANDS = ("compile", "verify", "profile")
SCRIPT = (
    '#!/bin/sh\n# See INSTRUCTIONS.md.\nexec python -P -m opsynth.trainer.commands {name} "$@"\n'
)


@dataclass(frozen=True)
class Workdir:
    path: Path
    task_id: str
    protected: dict[str, str]  # relative path -> sha256 of its content at creation


def script_name(command: str) -> str:
    return f"{command}.sh"


def instructions() -> str:
    return resources.files("trainer").joinpath("instructions.md").read_text()


def materialise(task: Task, root: Path) -> Workdir:
    """Refuses a non-empty ``root``: files left there would be taken for the agent's work."""
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root} exists and is not an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    files = {MODEL: task.code, INSTRUCTIONS: instructions()}
    files.update({script_name(c): SCRIPT.format(name=c) for c in COMMANDS})
    for rel, text in files.items():
        (root / rel).write_text(text)
    for command in COMMANDS:
        os.chmod(root / script_name(command), 0o755)
    (root / KERNELS).mkdir()
    return Workdir(root, task.id, {rel: _sha256(text.encode()) for rel, text in files.items()})


def protected_changes(wd: Workdir) -> list[str]:
    """Protected files that are no longer regular files with their original content."""
    changed = []
    for rel, digest in sorted(wd.protected.items()):
        path = wd.path / rel
        if path.is_symlink() or not path.is_file() or _sha256(path.read_bytes()) != digest:
            changed.append(rel)
    return changed


def collect_solution(wd: Workdir) -> Solution | None:
    """None when there is no readable solution. Files reached through a link that leaves the
    workdir count as unreadable: this runs outside the sandbox, and the agent must not be able
    to have host files read (and shipped to the scorer) on its behalf."""
    if not _inside(wd, wd.path / MODEL_NEW) or not _inside(wd, wd.path / KERNELS):
        return None
    kernels = wd.path / KERNELS
    if kernels.is_dir() and not all(_inside(wd, p) for p in kernels.rglob("*")):
        return None
    try:
        return load_solution(wd.path)
    except (SolutionError, OSError):
        return None


def _inside(wd: Workdir, path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(wd.path.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
