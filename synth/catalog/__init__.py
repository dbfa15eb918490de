"""The discovered seed catalogue: every operator a seed library exposes, probed and run.

This package finds operators by introspection (torch modules, functionals and aten functions,
transformers layers, any plugin library), derives their inputs, and keeps a seed only after it
has run: shapes on the ``meta`` device first, then a real CPU forward. Seeds that cannot run
are kept as ``Verdict`` rows with a reason code, never dropped silently.
"""
