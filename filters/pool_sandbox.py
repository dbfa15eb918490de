"""Which sandbox a worker pool's workers run in, and the host dirs they share (a
``WorkerPool`` mixin, ``filters.pool``).

bwrap when it works here; rlimits (no isolation of files, network or processes) only when the
user asked for it or allowed it: untrusted code is never run unsandboxed by default. The dirs
every worker of a kind shares are made for the uid that sandbox runs as: the per-GPU timing
locks and the trusted compile-cache layer (``filters.compile_cache``), built by a sandboxed
warm-up before any candidate runs.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from typing import Any

from opsynth.config import FiltersConfig
from opsynth.filters import compile_cache, privilege, sandbox
from opsynth.filters.pool_setup import (
    LOCK_DIR,
    UNSAFE_HINT,
    check_settings,
    default_cache_dir,
    isolation_problem,
)
from opsynth.filters.pool_types import PoolError

# Logged under the pool's name: the module its users know (``filters.pool``).
log = logging.getLogger("opsynth.filters.pool")

# The trusted compile-cache warm-up: a cold precompiled header plus a few compiles.
WARMUP_TIMEOUT_S = 300.0


class SandboxChoice:
    """Choose the workers' sandbox, fall back to rlimits where allowed, and make the dirs the
    workers share. Uses the pool's start-up (``_start_all``, ``_kill_all``)."""

    cfg: FiltersConfig
    device: str
    stats: dict[str, Any]
    _root: str | None
    _kind: str
    _gpus: list[str]
    _threads: int
    _settings: dict[str, Any]
    _paths_cache: str
    _lock_dir: str
    _identity: privilege.Identity | None
    _dirs_for: str

    def _start_with_fallback(self) -> None:
        try:
            self._start_all()
        except PoolError as exc:
            if not (self._kind == "bwrap" and self.cfg.sandbox == "auto"):
                raise
            if not self.cfg.allow_unsafe:
                raise PoolError(f"workers do not start under bwrap: {exc}; {UNSAFE_HINT}") from exc
            log.warning("workers do not start under bwrap (%s); falling back to rlimits", exc)
            self.stats["sandbox_fallback_reason"] = str(exc)
            self._kill_all()
            self._kind = "rlimits"
            self.stats["sandbox"] = "rlimits"
            self._shared_dirs("rlimits")
            self._configure()
            self._start_all()

    def _choose_sandbox(self) -> str:
        """bwrap when it works here; rlimits (no isolation of files, network or processes)
        only when the user asked for it or allowed it: untrusted code is never run unsandboxed
        by default."""
        if self.cfg.sandbox == "rlimits":
            refused = isolation_problem(self.cfg)
            if refused:
                raise PoolError(refused)
            kind = "rlimits"
        else:
            self._shared_dirs("bwrap")  # the probe runs with the dirs the workers will have
            why = sandbox.probe_bwrap(
                paths=self._paths(self._root or "/"),
                device=self.device,
                tmp_bytes=self._tmp_bytes(),
                identity=self._identity,
            )
            if why and (self.cfg.sandbox == "bwrap" or not self.cfg.allow_unsafe):
                raise PoolError(f"the bwrap sandbox is unusable here: {why}; {UNSAFE_HINT}")
            if why:
                log.warning("bwrap unusable (%s); workers run with rlimits only", why)
                self.stats["sandbox_fallback_reason"] = why
            kind = "rlimits" if why else "bwrap"
        self.stats["sandbox"] = kind
        return kind

    def _shared_dirs(self, kind: str) -> None:
        """The GPU lock dir the workers of ``kind`` share, owned by the uid the sandbox runs
        as, and (until ``_trusted_layer``) an empty compile-cache layer for the probe.
        Made once per kind: the probe already made the ones its workers use."""
        if self._dirs_for == kind:
            return
        self._dirs_for = kind
        self._identity = (
            privilege.sandbox_identity(self.cfg.sandbox_uid) if kind == "bwrap" else None
        )
        locks = LOCK_DIR
        if self._identity is not None:
            locks = os.path.join(tempfile.gettempdir(), f"opsynth-gpu-locks-{self._identity.uid}")
        privilege.owned_dir(locks, self._identity)
        self._lock_dir = locks
        if not self._paths_cache:  # the probe reads no cache; the layer comes after it
            self._paths_cache = compile_cache.empty_dir(self._cache_base)

    @property
    def _cache_base(self) -> str:
        return self.cfg.cache_dir or default_cache_dir()

    def _trusted_layer(self) -> None:
        """Build the trusted compile-cache layer for this device and library versions if the
        host has none yet (``filters.compile_cache``): a sandboxed warm-up of opsynth's own
        compiles, before any candidate runs. Without it candidates still compile, slower."""
        began = time.monotonic()
        assert self._root is not None
        workdir = os.path.join(self._root, "warm-up")
        os.makedirs(workdir, exist_ok=True)

        def warm(staging: str) -> str:
            return sandbox.run_warmup(
                kind=self._kind,
                paths=sandbox.Paths(cache_dir=staging, lock_dir=self._lock_dir, worker_dir=workdir),
                device=self.device,
                tmp_bytes=self._tmp_bytes(),
                identity=self._identity,
                cuda_visible=self._gpus[0] if self._gpus else None,
                timeout_s=WARMUP_TIMEOUT_S,
            )

        def prepare(staging: str) -> None:
            privilege.owned_dir(staging, self._identity)

        self._paths_cache, problem = compile_cache.ensure_layer(
            self._cache_base, self.device, warm, prepare
        )
        if problem:
            log.warning("no trusted compile cache (%s); candidates compile without one", problem)
        self.stats["compile_cache"] = f"empty: {problem}" if problem else "trusted"
        self.stats["compile_cache_s"] = round(time.monotonic() - began, 3)

    def _configure(self) -> None:
        _, lock_dir = sandbox.visible_paths(self._paths(""), self._kind)
        self._settings = check_settings(
            self.cfg, self.device, threads=self._threads, lock_dir=lock_dir
        )

    def _paths(self, directory: str) -> sandbox.Paths:
        return sandbox.Paths(
            cache_dir=self._paths_cache, lock_dir=self._lock_dir, worker_dir=directory
        )

    def _tmp_bytes(self) -> int:
        return self.cfg.tmp_size_mb << 20
