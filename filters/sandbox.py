"""How a worker process is launched: inside bubblewrap, or (only when the user allows unsafe
execution) with rlimits alone.

bubblewrap gives each worker private namespaces (no network, its own PID space, no
capabilities) and a filesystem built from read-only binds of exactly what Python, torch and
the C++/CUDA toolchain need. Nothing else of the host is visible: not /etc/passwd, not home
directories, not the repository (only the ``filters`` and ``evaluator`` packages are bound, at
``/opsynth``). Writable are a size-capped private ``/tmp`` and ``/dev/shm`` (``/tmp`` also
holds each candidate's private compile caches, ``filters.compile_cache``) and the per-GPU lock
dir at ``/opsynth/locks``; the trusted compile-cache layer is bound read-only at
``/opsynth/cache``. Everything in the sandbox runs as an unprivileged uid under a seccomp
filter (``filters.privilege``), entered through ``filters.sandbox_entry``; bwrap reads its
options from a descriptor, so the sandbox's ``/proc/1/cmdline`` names no host path.

The rlimits launch is a new session plus the per-candidate rlimits and watchdog of
``filters.worker``: it contains runaway resource use but not file, network or process access,
so the pool refuses it unless ``filters.allow_unsafe`` is set. ``WorkerPool.stats["sandbox"]``
says which is in use.

The worker environment is built from an allow-list, so secrets in the orchestrator's
environment (API keys) never reach candidate code.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import opsynth
from opsynth.filters import compile_cache, privilege

BWRAP = "bwrap"
MOUNT_ROOT = "/opsynth"  # the filters package is bound read-only at MOUNT_ROOT/filters
# Shared dirs appear at fixed paths inside the sandbox, outside the /tmp a worker wipes.
SANDBOX_CACHE = f"{MOUNT_ROOT}/cache"
SANDBOX_LOCKS = f"{MOUNT_ROOT}/locks"
SANDBOX_TMP = "/tmp"
# The folder that holds the opsynth package: the checkout's root, or site-packages.
PACKAGE_ROOT = str(Path(opsynth.__file__).resolve().parent.parent)

COMPILERS = ("gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc", "ninja")
# Packages the worker imports (torch + standard library only): the filters' checks and the
# solution evaluator's harness. Nothing else of the project is visible in the sandbox.
SANDBOX_PACKAGES = ("opsynth.filters", "opsynth.evaluator")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Mount points bwrap makes itself (their parents need no --dir of ours).
SANDBOX_DIRS = ("/tmp", "/dev", "/proc", "/dev/shm")
BIND_OPTIONS = ("--bind", "--ro-bind", "--dev-bind", "--ro-bind-try", "--bind-try")
# Namespaces of a sandbox bwrap starts as root: all but the user namespace (see
# system_options); cgroup only where the kernel has it.
ROOT_NAMESPACES = (
    "--unshare-ipc",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-uts",
    "--unshare-cgroup-try",
)
# /etc files the dynamic loader and the C/C++ toolchain need; nothing with users or secrets.
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)
# Environment variables passed through to workers when set (toolchain and CUDA location).
PASSTHROUGH_ENV = (
    "LD_LIBRARY_PATH",
    "LIBRARY_PATH",
    "CPATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CC",
    "CXX",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
    "TORCH_CUDA_ARCH_LIST",
    "NVIDIA_DRIVER_CAPABILITIES",
    "LANG",
    "LC_ALL",
)


@dataclass(frozen=True)
class Paths:
    """Host paths a worker uses: the trusted compile-cache layer (read-only in the sandbox)
    and the per-GPU lock dir (both shared by all workers and runs), and this worker's private
    host dir (its log, and in the fallback its ``tmp`` subdir is TMPDIR)."""

    cache_dir: str
    lock_dir: str
    worker_dir: str

    @property
    def tmp_dir(self) -> str:
        return os.path.join(self.worker_dir, "tmp")


def visible_paths(paths: Paths, kind: str) -> tuple[str, str]:
    """(cache dir, lock dir) as the worker sees them."""
    if kind == "bwrap":
        return SANDBOX_CACHE, SANDBOX_LOCKS
    return paths.cache_dir, paths.lock_dir


def bwrap_available() -> bool:
    return shutil.which(BWRAP) is not None


def worker_env(
    *,
    paths: Paths,
    kind: str,
    threads: int,
    cuda_visible: str | None,
    packages: tuple[str, ...] = SANDBOX_PACKAGES,
) -> dict[str, str]:
    """The complete environment of a worker; nothing else from the orchestrator leaks in."""
    tmp = SANDBOX_TMP if kind == "bwrap" else paths.tmp_dir
    cache_dir, _ = visible_paths(paths, kind)
    env = {name: os.environ[name] for name in PASSTHROUGH_ENV if name in os.environ}
    env.update(
        # The interpreter's own bin dir first: torch extensions build with the ninja that pip
        # installed next to it.
        PATH=os.pathsep.join(
            [os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/local/bin:/usr/bin")]
        ),
        HOME=tmp,
        TMPDIR=tmp,
        USER="opsynth",
        LOGNAME="opsynth",
        PYTHONPATH=MOUNT_ROOT if kind == "bwrap" else _host_path(packages),
        PYTHONNOUSERSITE="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",
        **compile_cache.private_env(tmp),
        **{compile_cache.TRUSTED_ENV: cache_dir},
        TORCHINDUCTOR_COMPILE_THREADS="1",
        # Ask NVML, not the CUDA runtime, whether CUDA exists: the runtime query in the worker
        # parent would leave its forked children unable to initialise CUDA.
        PYTORCH_NVML_BASED_CUDA_CHECK="1",
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        CUDA_VISIBLE_DEVICES=cuda_visible if cuda_visible is not None else "",
    )
    env.setdefault("LANG", "C.UTF-8")
    return env


def worker_command(*, in_fd: int, out_fd: int, device: str, prestart: bool) -> list[str]:
    """The worker's own command line (inside the sandbox or not)."""
    flags = ["--prestart"] if prestart else []
    return [
        sys.executable,
        "-P",  # never put the working directory (the candidate's /tmp) on sys.path
        "-s",
        "-B",
        "-m",
        "opsynth.filters.worker",
        "--in",
        str(in_fd),
        "--out",
        str(out_fd),
        "--device",
        device,
        "--host-pidns",
        host_pidns(),
        *flags,
    ]


def _host_path(packages: tuple[str, ...]) -> str:
    """PYTHONPATH of an unsandboxed worker: the project and the folder of every other package."""
    roots = [PACKAGE_ROOT]
    for package in packages:
        parent = os.path.dirname(package_path(package))
        if parent not in roots:
            roots.append(parent)
    return os.pathsep.join(roots)


def host_pidns() -> str:
    return os.readlink("/proc/self/ns/pid")


def bwrap_options(
    *,
    paths: Paths,
    device: str,
    tmp_bytes: int,
    identity: privilege.Identity | None,
    packages: tuple[str, ...] = SANDBOX_PACKAGES,
    cache_writable: bool = False,
) -> list[str]:
    """bwrap options that build the worker's sandbox (the program name and command apart).
    The trusted compile-cache layer is read-only but to its own warm-up (``cache_writable``)."""
    args = system_options(tmp_bytes=tmp_bytes, gpu=device == "cuda", identity=identity)
    args += ["--bind" if cache_writable else "--ro-bind", paths.cache_dir, SANDBOX_CACHE]
    args += ["--bind", paths.lock_dir, SANDBOX_LOCKS]
    args += package_binds(packages)
    return with_parent_dirs(args) + ["--remount-ro", "/", "--chdir", SANDBOX_TMP]


def system_options(*, tmp_bytes: int, gpu: bool, identity: privilege.Identity | None) -> list[str]:
    """The part of the bwrap options every opsynth sandbox shares (also the trainer's bash
    tool): new namespaces, no capabilities, size-capped private /tmp and /dev/shm, and
    read-only binds of what Python, torch, the toolchain and (``gpu``) the driver need.

    Started unprivileged, bwrap gets a user namespace of its own. Started as root
    (``identity`` given) it gets none, so that the uid ``sandbox_entry`` drops to is a real
    unprivileged host uid; it keeps only CAP_SETUID/CAP_SETGID for that one step."""
    if identity is None:
        args = ["--unshare-all", "--cap-drop", "ALL"]
    else:
        args = [*ROOT_NAMESPACES, "--cap-drop", "ALL"]
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args += ["--die-with-parent", "--new-session"]
    shared_tmp = ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs"]
    args += [*shared_tmp, SANDBOX_TMP, "--proc", "/proc", "--dev", "/dev", *shared_tmp, "/dev/shm"]
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            args += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            args += ["--ro-bind", directory, directory]
    for path in ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in python_paths() + library_paths() + toolchain_paths():
        args += ["--ro-bind", path, path]
    if gpu:
        args += gpu_args()
    return args


def with_parent_dirs(options: list[str]) -> list[str]:
    """``options`` with every missing parent of a bind target created first, world-readable:
    bwrap started as root makes them 0700, which the unprivileged sandbox uid cannot cross."""
    targets = [
        options[i + 2]
        for i, option in enumerate(options)
        if option in BIND_OPTIONS and i + 2 < len(options)
    ]
    made = set(SANDBOX_DIRS)
    parents: list[str] = []
    for target in targets:
        parent = os.path.dirname(target.rstrip("/"))
        chain = []
        while parent not in ("", "/") and parent not in made:
            chain.append(parent)
            made.add(parent)
            parent = os.path.dirname(parent)
        parents += reversed(chain)
    bound = set(targets)
    creates: list[str] = []
    for parent in parents:
        if parent in bound or any(parent.startswith(t.rstrip("/") + "/") for t in bound):
            continue  # inside another bind: it exists there already
        creates += ["--perms", "0755", "--dir", parent]
    first = next((i for i, o in enumerate(options) if o in BIND_OPTIONS), len(options))
    return options[:first] + creates + options[first:]


def package_binds(packages: tuple[str, ...]) -> list[str]:
    """``packages``, read-only under ``MOUNT_ROOT`` (on the sandbox's PYTHONPATH) at their
    import paths: ``opsynth.filters`` at ``MOUNT_ROOT/opsynth/filters``. opsynth's own modules
    are bound one by one (its ``__init__.py`` alone when only subpackages are asked for), so
    that no mount point is ever made inside a bound host folder, and no stage that was not
    asked for comes along where a wheel holds the stages inside opsynth's folder."""
    wanted = {p.split(".", 1)[1] for p in packages if p.startswith("opsynth.")}
    args: list[str] = []
    if "opsynth" in packages or wanted:
        core = package_path("opsynth")
        entries = sorted(os.listdir(core)) if "opsynth" in packages else ["__init__.py"]
        for entry in entries:
            if entry == "__pycache__" or entry in wanted or entry in opsynth.STAGES:
                continue
            args += ["--ro-bind", os.path.join(core, entry), f"{MOUNT_ROOT}/opsynth/{entry}"]
    for package in packages:
        if package == "opsynth":
            continue
        path = package_path(package)
        name = package.replace(".", "/") if os.path.isdir(path) else os.path.basename(path)
        args += ["--ro-bind", path, f"{MOUNT_ROOT}/{name}"]
    return args


def package_path(package: str) -> str:
    """Where a top-level package (its folder) or module (its file) lives on the host: the
    project's own, or one a harness registered from elsewhere (``filters.harness``)."""
    local = os.path.join(PACKAGE_ROOT, package)
    if "." not in package and os.path.isdir(local):
        return local
    spec = importlib.util.find_spec(package)
    if spec is None or not (spec.submodule_search_locations or spec.origin):
        raise ValueError(f"sandbox package {package!r} is not importable here")
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return str(spec.origin)


@dataclass
class Command:
    """A bwrap invocation: ``argv`` and the descriptors it must inherit (``pass_fds``): its
    option list and its seccomp program, each read once by bwrap. The options travel through
    a descriptor so that the sandbox's ``/proc/1/cmdline`` shows no host path."""

    argv: list[str]
    fds: tuple[int, ...]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def bwrap_command(
    options: list[str],
    command: list[str],
    *,
    identity: privilege.Identity | None,
    keep_fds: tuple[int, ...] = (),
    cwd: str = "-",
) -> Command:
    """Run ``command`` in the sandbox ``options`` describe, under the seccomp filter, entered
    through ``filters.sandbox_entry`` (which drops to ``identity`` and closes every inherited
    descriptor but ``keep_fds``, then enters ``cwd``). Raises
    ``privilege.SeccompUnavailable`` without libseccomp."""
    seccomp = privilege.seccomp_fd()
    listing = os.memfd_create("opsynth-bwrap-args", os.MFD_CLOEXEC)
    try:
        data = "\0".join([*options, "--seccomp", str(seccomp)]) + "\0"
        os.write(listing, data.encode())
        os.lseek(listing, 0, os.SEEK_SET)
    except OSError:
        os.close(listing)
        os.close(seccomp)
        raise
    ids = [str(identity.uid), str(identity.gid)] if identity else ["-", "-"]
    entry = [sys.executable, "-P", "-s", "-B", "-m", "opsynth.filters.sandbox_entry", *ids]
    entry += [",".join(str(fd) for fd in keep_fds), cwd, "--"]
    argv = [BWRAP, "--args", str(listing), "--", *entry, *command]
    return Command(argv, (listing, seccomp))


def launch_command(
    *,
    kind: str,
    paths: Paths,
    device: str,
    tmp_bytes: int,
    in_fd: int,
    out_fd: int,
    prestart: bool,
    identity: privilege.Identity | None = None,
    packages: tuple[str, ...] = SANDBOX_PACKAGES,
) -> Command:
    """How to start one worker: in the sandbox, or (``kind`` "rlimits", unsafe) directly."""
    command = worker_command(in_fd=in_fd, out_fd=out_fd, device=device, prestart=prestart)
    if kind != "bwrap":
        return Command(command, ())
    options = bwrap_options(
        paths=paths, device=device, tmp_bytes=tmp_bytes, identity=identity, packages=packages
    )
    return bwrap_command(options, command, identity=identity, keep_fds=(in_fd, out_fd))


def run_once(
    launch: Command, *, env: dict[str, str], cwd: str | None, timeout_s: float, what: str
) -> tuple[subprocess.CompletedProcess[bytes] | None, str]:
    """Run ``launch`` to its end with its output captured, then close its descriptors: (the
    finished process, "") or (None, why ``what`` could not run)."""
    try:
        proc = subprocess.run(
            launch.argv,
            env=env,
            cwd=cwd,
            pass_fds=launch.fds,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{what} failed: {exc}"
    finally:
        launch.close()
    return proc, ""


def probe_bwrap(
    *,
    paths: Paths,
    device: str,
    tmp_bytes: int,
    identity: privilege.Identity | None = None,
    timeout_s: float = 60.0,
) -> str:
    """Start Python in the sandbox as the sandbox uid and import the worker; "" if that
    works, else why not (bwrap missing or refused, libseccomp missing, ...)."""
    if not bwrap_available():
        return "bwrap is not installed"
    why = privilege.seccomp_problem()
    if why:
        return why
    env = worker_env(paths=paths, kind="bwrap", threads=1, cuda_visible=None)
    check = "import os, opsynth.filters.worker, opsynth.filters.reasons; print(os.getuid())"
    options = bwrap_options(paths=paths, device=device, tmp_bytes=tmp_bytes, identity=identity)
    launch = bwrap_command(options, [sys.executable, "-P", "-s", "-c", check], identity=identity)
    proc, why = run_once(launch, env=env, cwd="/", timeout_s=timeout_s, what="bwrap probe")
    if proc is None:
        return why
    if proc.returncode != 0:
        return (
            f"bwrap probe exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-500:]}"
        )
    uid = proc.stdout.decode(errors="replace").strip()
    if identity is not None and uid != str(identity.uid):
        return f"bwrap probe ran as uid {uid!r}, not {identity.uid}"
    if uid == "0":
        return "bwrap probe ran as uid 0"
    return ""


def run_warmup(
    *,
    kind: str,
    paths: Paths,
    device: str,
    tmp_bytes: int,
    identity: privilege.Identity | None,
    cuda_visible: str | None,
    timeout_s: float,
) -> str:
    """Fill the trusted compile-cache layer at ``paths.cache_dir`` with the warm-up of
    ``filters.compile_cache`` (opsynth's own compiles, no candidate code), in a sandbox like
    a worker's but with the layer writable. "" when it worked, else why not."""
    env = worker_env(paths=paths, kind=kind, threads=1, cuda_visible=cuda_visible)
    command = [
        sys.executable,
        "-P",
        "-s",
        "-B",
        "-m",
        "opsynth.filters.compile_cache",
        "--device",
        device,
    ]
    launch = Command(command, ())
    if kind == "bwrap":
        options = bwrap_options(
            paths=paths, device=device, tmp_bytes=tmp_bytes, identity=identity, cache_writable=True
        )
        launch = bwrap_command(options, command, identity=identity)
    else:
        os.makedirs(paths.tmp_dir, exist_ok=True)
    cwd = paths.worker_dir if kind != "bwrap" else "/"
    proc, why = run_once(
        launch, env=env, cwd=cwd, timeout_s=timeout_s, what="compile-cache warm-up"
    )
    if proc is None:
        return why
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"compile-cache warm-up exited {proc.returncode}: {tail[0][-300:]}"
    return ""


def python_paths() -> list[str]:
    """The interpreter, its standard library and the site-packages torch lives in."""
    candidates = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    candidates.update(site.getsitepackages())
    candidates.add(str(Path(sys.executable).resolve().parent.parent))
    try:
        import torch

        candidates.add(str(Path(torch.__file__).resolve().parent.parent))
    except ImportError:
        pass
    return _minimal(candidates)


def library_paths() -> list[str]:
    """Directories named by LD_LIBRARY_PATH / CUDA_HOME, so CUDA found outside /usr loads."""
    found = set()
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry:
            found.add(entry)
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(name):
            found.add(os.environ[name])
    return _minimal(found)


def toolchain_paths() -> list[str]:
    """Where the C/C++ compilers torch.compile runs live when outside /usr (e.g. /opt/gcc):
    inductor builds C++ on CPU and Triton builds a C launcher on CUDA. Only the compiler's
    bin dir and its prefix's lib/libexec/include are bound, never a whole prefix such as a
    home directory."""
    names = list(COMPILERS)
    for var in ("CC", "CXX"):
        if os.environ.get(var):
            names.append(os.environ[var].split()[0])
    found = set()
    for name in names:
        exe = shutil.which(name)
        if not exe:
            continue
        for form in (exe, os.path.realpath(exe)):
            bindir = os.path.dirname(form)
            prefix = os.path.dirname(bindir)
            found.add(bindir)
            found.update(
                os.path.join(prefix, sub) for sub in ("lib", "lib64", "libexec", "include")
            )
    return _minimal(found)


def _minimal(paths: set[str]) -> list[str]:
    """Existing absolute paths, resolved, without ones already covered by another or by a
    system dir (binding both would shadow one with the other)."""
    resolved = set()
    for path in paths:
        for form in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.isdir(form) and form != "/":
                resolved.add(form)
    covered = list(SYSTEM_DIRS)
    result: list[str] = []
    for path in sorted(resolved, key=len):
        if any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered + result):
            continue
        result.append(path)
    return result


def gpu_args() -> list[str]:
    """NVIDIA device nodes (all of them; CUDA_VISIBLE_DEVICES pins the GPU) and /sys, which
    the driver reads for topology."""
    args: list[str] = []
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia"):
            path = f"/dev/{name}"
            args += ["--dev-bind", path, path]
    if os.path.isdir("/dev/dri"):
        args += ["--dev-bind", "/dev/dri", "/dev/dri"]
    args += ["--ro-bind", "/sys", "/sys"]
    return args
