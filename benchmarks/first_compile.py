"""A candidate process's first ``torch.compile`` call, with what it may find ready before it
(filters/compile_cache.py).

    python -m benchmarks.first_compile --device cpu --runs 3

Builds a trusted layer in a temporary folder (the warm-up, ``python -m
opsynth.filters.compile_cache``, here unsandboxed), then times one first compile of a small
model in fresh interpreters, each with an empty inductor cache of its own, as a candidate's is:

- ``bare``: nothing from the layer;
- ``headers``: the layer's precompiled header (``use_trusted_headers``);
- ``headers+vec_isa``: that and the layer's record of the usable vector instruction sets
  (``adopt_vec_isa``), as a worker sets both up before it forks a candidate.

torch.compile's modules are imported before the clock starts in all three (a worker preimports
them). Prints the warm-up's seconds, then each setup's runs and median; writes
``first_compile.json`` to ``--out``. A GPU layer records no vector sets (its compiles never
ask), so there the last two setups match.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opsynth.filters import compile_cache

CHILD = """
import sys, time
import torch, torch._dynamo, torch._inductor.compile_fx, torch._inductor.codecache
from opsynth.filters import compile_cache
layer, setup, device = sys.argv[1:4]
if setup != "bare":
    compile_cache.use_trusted_headers(layer, sys.argv[4])
if setup == "headers+vec_isa":
    compile_cache.adopt_vec_isa(layer)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(256, 256)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2.0 + x

model = Model().to(device)
x = torch.randn(64, 256, device=device)
start = time.perf_counter()
torch.compile(model)(x)
if device == "cuda":
    torch.cuda.synchronize()
print(time.perf_counter() - start)
"""
SETUPS = ("bare", "headers", "headers+vec_isa")


def build_layer(root: Path, device: str) -> Path:
    layer = root / "layer"
    layer.mkdir()
    env = {
        **os.environ,
        compile_cache.TRUSTED_ENV: str(layer),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "warm-up-inductor"),
        "TMPDIR": str(root),
    }
    cmd = [sys.executable, "-m", "opsynth.filters.compile_cache", "--device", device]
    subprocess.run(cmd, env=env, check=True)
    return layer


def first_compile(root: Path, layer: Path, setup: str, device: str, run: int) -> float:
    private = root / f"{setup}-{run}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(private / "inductor")}
    env["TRITON_CACHE_DIR"] = str(private / "triton")
    locks = str(private / "header-locks")
    cmd = [sys.executable, "-c", CHILD, str(layer), setup, device, locks]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("first-compile-bench"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="first-compile-") as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        layer = build_layer(root, args.device)
        warm_up_s = time.perf_counter() - began
        record = layer / compile_cache.VEC_ISA
        usable = record.read_text().split("\n") if record.is_file() else []
        runs = {setup: [] for setup in SETUPS}
        for run in range(args.runs):  # interleaved, so a slow spell of the host hits all three
            for setup in SETUPS:
                runs[setup].append(round(first_compile(root, layer, setup, args.device, run), 2))
    result = {
        "device": args.device,
        "warm_up_s": round(warm_up_s, 1),
        "vec_isa_record": [line for line in usable if line],
        "runs": runs,
        "median_s": {setup: statistics.median(times) for setup, times in runs.items()},
    }
    recorded = result["vec_isa_record"]
    print(f"trusted layer's warm-up: {result['warm_up_s']} s; vector sets recorded: {recorded}")
    for setup in SETUPS:
        print(f"{setup:>16}: median {result['median_s'][setup]:.2f} s  runs {runs[setup]}")
    (args.out / "first_compile.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
