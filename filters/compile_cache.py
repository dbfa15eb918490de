"""Compile caches no candidate can pass on to another.

``torch.compile`` keeps what it builds on disk and later compiles load it back as code:
inductor's FX-graph and AOT-autograd entries (pickles), its generated modules, Triton's
compiled kernels and launchers, the C++ precompiled header. A cache one candidate can write is
therefore a way into every later candidate and into the evaluator's ``torch.compile``
reference. So caches come in two layers:

- **private**, one per candidate: ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` point
  under the worker's temp dir (``PRIVATE``), which is a size-capped tmpfs in the sandbox and
  emptied between candidates. Whatever a candidate compiles, or plants, goes with it, and its
  disk use counts against that cap.
- **trusted**, shared read-only: filled once per host, device and library versions by a
  warm-up that runs only this module's own compiles
  (``python -m opsynth.filters.compile_cache``), in a sandbox of its own before any
  candidate starts; then sealed (owned by the orchestrator, no write bits) and bound
  read-only into every sandbox. It holds what every compile pays for whatever it compiles:
  the C++ precompiled header, Triton's compiled driver, launchers and the warm-up's kernels.
  It also names the modules the warm-up's compiles imported (``IMPORTS``): a first
  ``torch.compile`` imports a few hundred of them (codegen, pattern tables, Triton's language),
  and the site-packages of a sandbox are read-only without bytecode, so a fresh candidate
  process would compile them from source each time. The worker imports them once, before it
  forks candidates (``preimport``). And it records which vector instruction sets its C++
  compiles found usable (``VEC_ISA``): inductor learns that by building and loading a probe
  library per instruction set, into the compile cache; a private cache is empty, so every
  candidate would build them again before its first CPU kernel. The worker takes the record
  instead, before it forks (``adopt_vec_isa``).

A compile reads the trusted layer and writes to its private one: Triton through links in the
private cache (one per trusted entry, made before each candidate), inductor's header step
through ``use_trusted_headers``. A miss in the trusted layer costs time, never a verdict: a
header the trusted layer lacks is not precompiled (compiling without one is cheaper than
building one per candidate, see benchmarks/RESULTS.md).

Standard library only at import; torch is imported by the warm-up alone. Runs inside the
sandbox (the worker, the warm-up) and on the host (the pool's ``ensure_layer``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import os
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import Callable

PRIVATE = ".compile-cache"  # under the worker's temp dir, emptied with it
TRUSTED_ENV = "OPSYNTH_TRUSTED_CACHE"  # the trusted layer as the sandbox sees it
HEADERS = "precompiled_headers"
TRITON = "triton"
COMPLETE = "COMPLETE"
LAYERS = "trusted-compile"  # under the configured cache dir, one folder per fingerprint
IMPORTS = "imports.txt"  # the modules the warm-up's compiles imported, one name per line
MAX_IMPORTS = 5000
VEC_ISA = "vec_isa.txt"  # the vector instruction sets the warm-up's probes built and loaded
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
WARMUP_VERSION = 4  # raised when ``warm`` compiles something else: layers are rebuilt


def private_env(tmp: str) -> dict[str, str]:
    """The cache variables of a worker whose temp dir is ``tmp``."""
    root = os.path.join(tmp, PRIVATE)
    return {
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(root, TRITON),
    }


def fingerprint(device: str) -> str:
    """What a trusted layer's entries depend on: the interpreter, the machine, torch and
    Triton, the device kind and what the warm-up compiles. Another combination gets a layer of
    its own."""
    parts = [sys.version, platform.machine(), device, f"warm-up {WARMUP_VERSION}"]
    for name in ("torch", "triton"):
        try:
            parts.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{name}=none")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def layer_dir(base: str, device: str) -> str:
    return os.path.join(base, LAYERS, f"{device}-{fingerprint(device)}")


def empty_dir(base: str) -> str:
    """What is bound in a layer's place when none could be built (nothing to read)."""
    path = os.path.join(base, LAYERS, "empty")
    os.makedirs(path, exist_ok=True)
    return path


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, COMPLETE))


# --------------------------------------------------------------------------- host side


def ensure_layer(
    base: str, device: str, warm: Callable[[str], str], prepare: Callable[[str], None]
) -> tuple[str, str]:
    """The trusted layer for ``device`` under ``base``, built first if missing: ``prepare``
    hands an empty staging folder to whoever the warm-up runs as, ``warm`` fills it ("" on
    success, else why not). The folder is sealed and renamed into place, so a layer is either
    complete or absent; pools starting together wait for one warm-up (a file lock). Returns
    (the folder to bind read-only, "" or why the layer is missing)."""
    final = layer_dir(base, device)
    if is_complete(final):
        return final, ""
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    import fcntl  # host side only

    with open(os.path.join(parent, ".warming.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(final):
            return final, ""
        staging = tempfile.mkdtemp(prefix=".warming-", dir=parent)
        try:
            prepare(staging)
            problem = warm(staging)
            if not problem:
                seal(staging)
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(final)  # an incomplete leftover: never bound
                os.rename(staging, final)
                return final, ""
        except OSError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return empty_dir(base), problem


def seal(path: str) -> None:
    """Hand every entry to the orchestrator's uid (the warm-up ran as the sandbox uid) and clear
    the write bits of files: written once, only read afterwards."""
    uid, gid = os.getuid(), os.getgid()
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            entry = os.path.join(root, name)
            os.lchown(entry, uid, gid)
            if os.path.islink(entry):
                continue
            os.chmod(entry, 0o755 if name in dirs else os.lstat(entry).st_mode & 0o555)
    os.chown(path, uid, gid)
    os.chmod(path, 0o755)
    with open(os.path.join(path, COMPLETE), "w") as fh:
        fh.write(f"python {sys.version.split()[0]} on {platform.machine()}\n")
    os.chmod(os.path.join(path, COMPLETE), 0o444)


# ----------------------------------------------------------------------- sandbox side


def link_trusted(trusted: str, private_triton: str) -> int:
    """Make the private Triton cache read every trusted entry: one link per entry (a folder
    per kernel or launcher key). A compile that finds its key there reads it; a new key is
    written beside the links, in the private layer. Returns the number of links."""
    source = os.path.join(trusted, TRITON)
    os.makedirs(private_triton, exist_ok=True)
    made = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(source):
            with contextlib.suppress(FileExistsError):
                os.symlink(entry.path, os.path.join(private_triton, entry.name))
                made += 1
    return made


def use_trusted_headers(trusted: str, lock_dir: str) -> bool:
    """Point inductor's precompiled headers at the trusted layer, read-only: a header found
    there is used, one missing is not built (the compile goes on without it). Call after
    ``torch._inductor.codecache`` is imported; False when this torch has no such step."""
    codecache = sys.modules.get("torch._inductor.codecache")
    original = getattr(codecache, "_precompile_header", None)
    if codecache is None or original is None:
        return False
    codecache._HEADER_DIR = os.path.join(trusted, HEADERS)
    codecache._HEADER_LOCK_DIR = lock_dir
    if getattr(original, "trusted_only", False):
        return True

    def precompile_header(*args: object, **kwargs: object) -> str | None:
        try:
            return original(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the read-only layer refused a new header
            return None

    precompile_header.trusted_only = True  # type: ignore[attr-defined]
    codecache._precompile_header = precompile_header
    return True


def preimport(trusted: str) -> int:
    """Import the modules the trusted layer's warm-up imported while compiling (``IMPORTS``),
    so that processes forked from this one find them loaded. A name that fails to import is
    skipped: it costs its compile time later, never a verdict. Returns how many were named."""
    if not trusted:
        return 0
    try:
        with open(os.path.join(trusted, IMPORTS), encoding="utf-8") as fh:
            names = fh.read().split()[:MAX_IMPORTS]
    except (OSError, ValueError):
        return 0
    import importlib

    for name in names:
        if _MODULE_NAME.fullmatch(name):
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    return len(names)


def adopt_vec_isa(trusted: str) -> int:
    """Settle inductor's list of usable vector instruction sets in this process from the
    trusted layer's record (``VEC_ISA``) instead of its probes: each probe builds a library
    with a C++ compiler and loads it in a fresh interpreter, seconds per instruction set, paid
    again by every process whose compile cache starts empty. The list is cached per process,
    so children forked afterwards inherit it. The CPU's own flags are still read here; the
    record stands only for the probe builds. Returns how many sets the list holds; -1 (the
    probes run as before, when first needed) without a record or with a torch that probes
    otherwise."""
    if not trusted:
        return -1
    try:
        with open(os.path.join(trusted, VEC_ISA), encoding="utf-8") as fh:
            usable = {line.strip() for line in fh.read().splitlines()[:64] if line.strip()}
    except (OSError, ValueError):
        return -1
    try:
        from torch._inductor import cpu_vec_isa

        probe = cpu_vec_isa.VecISA.check_build
        settle = cpu_vec_isa.valid_vec_isa_list
    except (ImportError, AttributeError):
        return -1
    cpu_vec_isa.VecISA.check_build = lambda isa, code: str(isa) in usable  # type: ignore[method-assign]
    try:
        return len(settle())
    except Exception:  # noqa: BLE001 - left to the probes, which run when first needed
        return -1
    finally:
        cpu_vec_isa.VecISA.check_build = probe  # type: ignore[method-assign]


def probed_vec_isa() -> list[str] | None:
    """The vector instruction sets inductor's probes found usable here (probing them now if no
    compile has yet); None with a torch that has no such probes."""
    try:
        from torch._inductor import cpu_vec_isa

        return [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
    except (ImportError, AttributeError):
        return None


def imported_since(before: set[str], *, outside: tuple[str, ...]) -> list[str]:
    """Modules loaded since ``before`` from a source file that lies outside ``outside`` (the
    caches, whose generated modules cannot be imported by name), in the order they were
    first imported."""
    roots = tuple(os.path.realpath(path) + os.sep for path in outside if path)
    names = []
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        if name in before or not isinstance(origin, str) or not os.path.isfile(origin):
            continue
        if _MODULE_NAME.fullmatch(name) and not os.path.realpath(origin).startswith(roots):
            names.append(name)
    return names


def warm(device: str, layer: str) -> None:
    """Fill ``layer`` by compiling a few small functions of opsynth's own on ``device``: enough
    to build the precompiled header (CPU) and Triton's driver and common launchers (CUDA), the
    state audit's tiny model that every reusable process compiles, the samples' fused sums
    (``filters.fused_sums``, CUDA), and a convolution and matmul (extern kernels, whose lowering
    imports more); then name the modules those compiles imported (``IMPORTS``) and, on CPU, the
    vector instruction sets they found usable (``VEC_ISA``)."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(layer, TRITON)
    import torch
    import torch._inductor.codecache as codecache

    before = set(sys.modules)

    codecache._HEADER_DIR = os.path.join(layer, HEADERS)
    codecache._HEADER_LOCK_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"), "header-locks")

    def pointwise_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0).sum(-1)

    def normalise(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1) * torch.sigmoid(x).mean()

    def integer(x: torch.Tensor) -> torch.Tensor:
        return (x * 3 + 1) % 7

    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(64, 256, generator=generator) for _ in range(2)]
    inputs.append(torch.randint(0, 9, (64, 256), generator=generator))
    dtypes = [torch.float32, torch.float16] if device == "cuda" else [torch.float32]
    for dtype in dtypes:
        for fn, x in zip((pointwise_sum, normalise, integer), inputs, strict=True):
            x = x.to(device, dtype if x.is_floating_point() else x.dtype)
            torch._dynamo.reset()
            torch.compile(fn)(x)

    def conv_matmul(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.conv2d(x, w).flatten(1) @ v
        return torch.nn.functional.layer_norm(y, y.shape[-1:])

    image, weights, matrix = (
        torch.randn(shape, generator=generator) for shape in ((2, 4, 8, 8), (8, 4, 3, 3), (288, 16))
    )
    torch._dynamo.reset()
    torch.compile(conv_matmul)(image.to(device), weights.to(device), matrix.to(device))
    from opsynth.filters import state_audit

    state_audit.prepare(device)  # every reusable process compiles this model first
    from opsynth.filters import fused_sums

    fused_sums.warm(device)  # every sample on a CUDA device runs this kernel
    if device == "cuda":
        torch.cuda.synchronize()
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        inductor_cache = cache_dir()
    except ImportError:
        inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    caches = (layer, inductor_cache, os.environ.get("TRITON_CACHE_DIR", ""))
    with open(os.path.join(layer, IMPORTS), "w", encoding="utf-8") as fh:
        fh.writelines(f"{name}\n" for name in imported_since(before, outside=caches))
    # Only a CPU layer's compiles settle the list (a GPU layer's never ask, and probing costs
    # the warm-up about a minute on a GPU host); without a record, workers probe when asked.
    usable = probed_vec_isa() if device == "cpu" else None
    if usable is not None:  # an empty record is one too: nothing to probe
        with open(os.path.join(layer, VEC_ISA), "w", encoding="utf-8") as fh:
            fh.writelines(f"{isa}\n" for isa in usable)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fill the trusted compile-cache layer")
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    args = parser.parse_args(argv)
    layer = os.environ.get(TRUSTED_ENV, "")
    if not layer or not os.path.isdir(layer):
        print(f"{TRUSTED_ENV} names no folder", file=sys.stderr)
        return 2
    warm(args.device, layer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
