"""Seed extraction and offline composition of fused-operator tasks.

``synth.seeds`` turns a library's operators into seed specs and standalone seed tasks;
``synth.compose`` chains seeds into KernelBench-format tasks whose shapes are solved by
propagating them on the ``meta`` device, so no generated code is ever executed here.
"""

__version__ = "0.1.0"
