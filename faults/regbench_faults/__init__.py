"""The hook that arms regbench's injected faults in a real vLLM server.

`install(spec)` (called by the folder's sitecustomize when REGBENCH_FAULT is set) reads the
comma-separated fault names, refuses an unknown one loudly (the interpreter exits with code 2
before vLLM starts, so a typo cannot pass for a healthy run), and puts one finder on
sys.meta_path that patches each target module right after its own code has run. Nothing of vLLM
is imported here: a fault arms in whichever process imports its module (the API server, the
engine core, or both), and says so on stderr: `regbench-fault: <name> armed in <process> ...`.

`flaky[:<fault>]` (default fault: nan_logits) fires in one fresh start out of three. The start's
first interpreter rolls and writes the outcome to REGBENCH_FAULT_FLAKY, which vLLM's processes
inherit, so one server start is one decision; set that variable to `fired` or `not fired` to
force it. The deciding process prints `regbench-fault: flaky <fault> fired` (or `not fired`).
"""

from __future__ import annotations

import importlib
import os
import sys

# The name each fault is switched on by: its module in this package.
FAULTS = (
    "scale_layer",
    "batch_corrupt",
    "prefix_cache_corrupt",
    "empty_detokenize",
    "stream_repeats_prompt",
    "early_eos",
    "nan_logits",
    "slow_decode",
    "seed_ignored",
    "stop_ignored",
    "min_tokens_off_by_one",
    "logit_bias_ignored",
    "schema_dropped",
    "tool_args_dropped_streaming",
    "stop_reports_length",
    "n_children_lose_stop",
    "stream_mangles_utf8",
    "temperature_ignored",
    "stop_before_min_tokens",
    "n_children_lose_allowed",
    "n_children_lose_bad_words",
    "tool_calls_at_length",
    "stream_usage_one_choice",
    "compiled_only",
    "text_held_back",
)
FLAKY = "flaky"
FLAKY_DEFAULT = "nan_logits"
FLAKY_DECISION = "REGBENCH_FAULT_FLAKY"
FLAKY_OUTCOMES = ("fired", "not fired")


def say(line: str) -> None:
    sys.stderr.write(f"regbench-fault: {line}\n")
    sys.stderr.flush()


def refuse(why: str) -> None:
    say(f"{why}; known faults: {', '.join(FAULTS)}, {FLAKY}[:<fault>]")
    # Not an exception: site.py would print it and carry on with a healthy server.
    os._exit(2)


def process_name() -> str:
    import multiprocessing

    return f"{multiprocessing.current_process().name} (pid {os.getpid()})"


def flaky_fires(inner: str) -> bool:
    decision = os.environ.get(FLAKY_DECISION)
    if decision is None:
        decision = FLAKY_OUTCOMES[0] if int.from_bytes(os.urandom(4), "big") % 3 == 0 else FLAKY_OUTCOMES[1]
        os.environ[FLAKY_DECISION] = decision  # the server's other processes inherit it
        say(f"{FLAKY} {inner} {decision}")
    elif decision not in FLAKY_OUTCOMES:
        refuse(f"{FLAKY_DECISION}={decision!r} is neither {' nor '.join(map(repr, FLAKY_OUTCOMES))}")
    return decision == FLAKY_OUTCOMES[0]


def parse(spec: str) -> list[str]:
    """The faults to arm now (flaky resolved), in the order named; refuses unknown names."""
    armed: list[str] = []
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        if name == FLAKY or name.startswith(f"{FLAKY}:"):
            inner = name.partition(":")[2] or FLAKY_DEFAULT
            if inner not in FAULTS:
                refuse(f"unknown fault {inner!r} in {name!r} (REGBENCH_FAULT)")
            if flaky_fires(inner):
                armed.append(inner)
        elif name in FAULTS:
            armed.append(name)
        else:
            refuse(f"unknown fault {name!r} in REGBENCH_FAULT")
    return list(dict.fromkeys(armed))


class _PatchingLoader:
    """The module's own loader, then the faults' patches on the fresh module."""

    def __init__(self, loader, patches):
        self._loader = loader
        self._patches = patches

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for fault, patch in self._patches:
            detail = patch(module)
            say(f"{fault} armed in {process_name()}: {module.__name__}{f' ({detail})' if detail else ''}")


class _Finder:
    def __init__(self, patches: dict[str, list]):
        self.patches = patches

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.patches:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.patches.pop(fullname))
        return spec


def install(spec: str) -> list[str]:
    faults = parse(spec)
    patches: dict[str, list] = {}
    for fault in faults:
        module = importlib.import_module(f"{__name__}.{fault}")
        for target, patch in module.PATCHES.items():
            if target in sys.modules:
                refuse(f"{target} was imported before the faults could patch it")
            patches.setdefault(target, []).append((fault, patch))
    if patches:
        sys.meta_path.insert(0, _Finder(patches))
    return faults
