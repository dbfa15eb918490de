"""Filters: the static pre-check and the sandboxed execution checks a task must pass.

Orchestrator side: ``static_check``, ``pool`` (``WorkerPool``, with its ``pool_*`` modules),
``audit``, ``smoke``. Worker side (torch and the standard library only): ``worker`` (with
``children``, ``child_main``, ``watchdog``), ``checks``, ``reasons``, ``calibrate``. Importing
this package imports nothing, so the worker side stays light.
"""
