"""Seed extraction and offline composition of fused-operator tasks.

``synth.catalog`` discovers each seed library's operators and keeps the ones that run as seed
tasks; ``synth.compose`` chains catalogue seeds into KernelBench-format tasks whose shapes are
solved by propagating them on the ``meta`` device, so no generated code is ever executed here.
"""

__version__ = "0.3.0"
