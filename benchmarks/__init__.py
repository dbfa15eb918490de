"""Benchmark scripts, each run from the repository root as ``python -m benchmarks.<name>``;
their measured results, dated, with the machine and the command, are in RESULTS.md."""
