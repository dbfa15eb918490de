"""Score candidate solutions (``ModelNew`` + optional CUDA/C++ kernels) against tasks.

``guards`` (static checks of the solution source) and ``reward`` are pure; ``harness`` runs
inside the filters' sandboxed workers (torch + standard library only); ``score`` ties them
together with a worker pool. This package's ``__init__`` imports nothing, so the sandbox can
import ``evaluator.harness`` without the rest of the project.
"""
