"""Fault injection into a real vLLM server (regbench's test suite; never shipped in the bench).

Put this folder on the served interpreter's PYTHONPATH (an image's `pythonpath` in a matrix) and
name faults in REGBENCH_FAULT (comma-separated; see regbench_faults.FAULTS and docs/faults.md).
Python imports `sitecustomize` at start-up in every interpreter, so vLLM's engine core and its model worker,
which CPU vLLM starts with multiprocessing's spawn, arm their faults too: they inherit the variables.
Without REGBENCH_FAULT this module imports nothing and changes nothing.
"""

import os
import sys

if os.environ.get("REGBENCH_FAULT", "").strip():
    import regbench_faults

    regbench_faults.install(os.environ["REGBENCH_FAULT"])


def _run_the_shadowed_sitecustomize() -> None:
    # This file shadows any sitecustomize further down the path (a distribution's, a container
    # image's): run that one too, so that the faults are all that changes.
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if not any(os.path.isfile(os.path.join(p, "sitecustomize.py")) for p in rest):
        return
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_run_the_shadowed_sitecustomize()
