"""Facts read from a vLLM server log, by patterns taken from real recorded logs (vLLM 0.31 and
0.32; tests/data/logs/ holds the recordings the patterns are tested on). Pure: text in, facts out.

What matters for diagnosis: the weight loaders' own progress bars ("Loading safetensors using Runai
Model Streamer:   0% Completed | 0/21") ending short of their total is the count of tensors the
server never received, visible even without the pre-flight audit; how long loading took; the KV
cache; warnings about dtype or quantization fallbacks; and for errors, the exception and the
innermost frames of its traceback.
"""

from __future__ import annotations

import re

from bench.core.records import Record


class LoaderProgress(Record):
    """The last state of one of vLLM's weight-loading progress bars."""

    loader: str  # "Runai Model Streamer", "checkpoint shards", ...
    done: int
    total: int
    seconds: float | None = None  # the bar's time: items over its rate (tqdm's elapsed is whole seconds)

    @property
    def short(self) -> bool:
        return self.done < self.total


class Traceback(Record):
    exception: str  # "UnicodeDecodeError: 'utf-8' codec can't decode byte ..."
    frames: list[str]  # innermost last: "torch/library.py:123 in _clear_torch_ops_cache"


class LogFacts(Record):
    loaders: list[LoaderProgress] = []
    weights_load_s: float | None = None  # "Loading weights took 0.01 seconds"
    kv_cache_tokens: int | None = None  # "KV cache size: 46,592 tokens"
    engine_init_s: float | None = None  # "init engine (profile, create kv cache, warmup model) took 2.86 s"
    warnings: list[str] = []  # dtype / quantization / fallback warnings, as logged
    errors: list[str] = []  # "SomeError: message" lines, first seen first
    tracebacks: list[Traceback] = []
    # Boot phases: seconds after the log's first timestamped line (vLLM logs whole seconds).
    phases: dict[str, float] = {}

    @property
    def short_loaders(self) -> list[LoaderProgress]:
        return [p for p in self.loaders if p.short]


# tqdm bars as vLLM prints them; a bar is redrawn, so the last state of each loader wins.
_PROGRESS = re.compile(
    r"Loading (?:safetensors using )?(?P<loader>[A-Za-z][\w .-]*?):\s+\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)"
    r"(?: \[(?P<mm>\d+):(?P<ss>\d\d)<[^,\]]*(?:, *(?P<rate>[\d.]+)it/s)?)?")
_WEIGHTS = re.compile(r"Loading weights took (?P<s>[\d.]+) seconds")
_KV = re.compile(r"KV cache size: (?P<n>[\d,]+) tokens")
_INIT = re.compile(r"init engine \(.*?\) took (?P<s>[\d.]+) s")
_WARNING = re.compile(r"WARNING.*\b(dtype|bfloat16|float16|float32|quantiz\w*|fall(?:ing)? ?back|not supported|casting)\b", re.I)
_STAMP = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)")
# The boot's milestones as vLLM 0.31 / 0.32 log them, first occurrence each.
PHASES = {
    "engine_start": re.compile(r"Initializing a V1 LLM engine"),
    "load_start": re.compile(r"Starting to load model"),
    "weights_loaded": _WEIGHTS,
    "kv_cache": _KV,
    "engine_ready": _INIT,
    "server_ready": re.compile(r"Starting vLLM server on"),
}
# Printed on every CPU start, about a backend the models here do not use.
_BENIGN_WARNING = re.compile(r"Reset SSM cache type")
_ERROR = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:ERROR [\d-]+ [\d:]+ \[[^\]]+\] )?\s*"
                    r"(?P<e>(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)): (?P<m>.*)$")
_RAISED = re.compile(r"^(?P<e>[A-Z]\w*(?:Error|Exception|Interrupt))(?::\s*(?P<m>.*))?$")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_TB_START = "Traceback (most recent call last)"
_PREFIX = re.compile(r"^\(\w+ pid=\d+\) (?:ERROR [\d-]+ [\d:]+ \[[^\]]+\] )?")


def _short_path(path: str) -> str:
    # site-packages/torch/library.py → torch/library.py: where it is, not whose machine it was on.
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else path.rsplit("/", 2)[-1] if "/" in path else path


def _tracebacks(lines: list[str]) -> list[Traceback]:
    out: list[Traceback] = []
    frames: list[str] | None = None
    for raw in lines:
        line = _PREFIX.sub("", raw)
        if _TB_START in line:
            frames = []
            continue
        if frames is None:
            continue
        m = _FRAME.search(line)
        if m:
            frames.append(f"{_short_path(m['file'])}:{m['line']} in {m['func']}")
            continue
        if _ERROR.match(line.strip()) or _RAISED.match(line.strip()):
            out.append(Traceback(exception=line.strip()[:300], frames=frames[-5:]))
            frames = None
    return out


def log_facts(text: str) -> LogFacts:
    loaders: dict[str, LoaderProgress] = {}
    weights = kv = init = None
    warnings: list[str] = []
    errors: list[str] = []
    # tqdm redraws with carriage returns: each state is a line of its own here.
    lines = text.replace("\r", "\n").splitlines()
    phases: dict[str, float] = {}
    first = previous = None
    days = 0
    for line in lines:
        if stamp := _STAMP.match(line):
            now = int(stamp["h"]) * 3600 + int(stamp["m"]) * 60 + int(stamp["s"])
            if previous is not None and now < previous:
                days += 1  # past midnight
            previous = now
            now += days * 86400
            first = now if first is None else first
            for name, pattern in PHASES.items():
                if name not in phases and pattern.search(line):
                    phases[name] = float(now - first)
        if m := _PROGRESS.search(line):
            loader, done = m["loader"].strip(), int(m["done"])
            seconds = None
            if m["rate"] and float(m["rate"]) > 0:
                seconds = done / float(m["rate"])
            elif m["mm"] is not None:
                seconds = float(int(m["mm"]) * 60 + int(m["ss"]))
            loaders[loader] = LoaderProgress(loader=loader, done=done, total=int(m["total"]), seconds=seconds)
        elif m := _WEIGHTS.search(line):
            weights = float(m["s"])
        elif m := _KV.search(line):
            kv = int(m["n"].replace(",", ""))
        elif m := _INIT.search(line):
            init = float(m["s"])
        elif _WARNING.search(line) and not _BENIGN_WARNING.search(line) and len(warnings) < 20:
            warnings.append(_PREFIX.sub("", line).strip()[:300])
        if (e := _ERROR.match(line.strip())) and len(errors) < 20:
            message = f"{e['e']}: {e['m']}"[:300]
            if message not in errors:
                errors.append(message)
    return LogFacts(loaders=list(loaders.values()), weights_load_s=weights, kv_cache_tokens=kv, engine_init_s=init,
                    warnings=warnings, errors=errors, tracebacks=_tracebacks(lines)[:10], phases=phases)
