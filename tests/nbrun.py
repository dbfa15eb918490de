"""Executing ``notebooks/audit.ipynb`` headlessly with this interpreter as its kernel.

A kernel spec written to a temporary JUPYTER_PATH points at ``sys.executable``, so the
notebook runs in the same virtual environment as the tests on any machine (a system-wide
``python3`` kernel could be another Python without opsynth).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "audit.ipynb"
KERNEL = "opsynth-test"


def execute(tmp: Path, env: dict[str, str], timeout: int = 300):
    """Run every cell with ``env`` set in the kernel; returns the executed notebook."""
    import nbformat
    from nbclient import NotebookClient

    spec = tmp / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": KERNEL, "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    saved = dict(os.environ)
    os.environ.update({**env, "JUPYTER_PATH": str(tmp / "jupyter"), "MPLBACKEND": "Agg"})
    try:
        client = NotebookClient(
            notebook,
            kernel_name=KERNEL,
            timeout=timeout,
            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
        )
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return notebook


def outputs(notebook) -> tuple[str, int]:
    """All printed text, and how many PNG images were displayed."""
    text, images = [], 0
    for cell in notebook.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", ""))
            images += "image/png" in out.get("data", {})
    return "".join(text), images
