"""Diagnosis: from a failing cell to known causes, with the evidence for and against. Pure.

A *signature* is one known issue, written as data (bench/signatures/*.yaml, or a folder of the
user's own): what it is, its upstream references, the conditions it matches on, an explanation,
the fixes in the order to try them, and a command that confirms it. Conditions (one class per
key, bench.core.conditions) look at the evidence gathered per failing cell (``CellEvidence``: its
findings, the matrix contrast, facts from its server logs, the pre-flight, its environment's
fingerprint). Each condition holds, fails, or cannot be told from the evidence at hand.

A signature matches a cell when every ``require`` condition holds or cannot be told, and at least
one of them holds. Matches are ranked by the ``support`` conditions that hold minus those that
fail; both lists are shown, so a reader sees what speaks against a match too. A failure that
matches nothing gets its evidence and "no known signature", never an invented cause.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bench.core.conditions import CellEvidence, Conditions, ReleaseCondition, Releases
from bench.core.config import ConfigError
from bench.core.logfacts import LogFacts


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Signature(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    title: str
    references: list[str] = []
    symptom_only: bool = False  # accompanies failures without causing them: says so when shown
    require: Conditions = Field(min_length=1)
    support: Conditions = []
    explanation: str
    fixes: list[str] = Field(min_length=1)
    confirm: str | None = None  # a command; {model}, {python}, {pythonpath}, {cell}, {config} filled in
    # The releases measured, if the issue is a package's: {releases} and {fixed_in} in the
    # explanation and the fixes are filled from it.
    releases: Releases | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill_releases(cls, data: object) -> object:
        if not isinstance(data, dict) or not isinstance(data.get("releases"), dict):
            return data
        try:
            releases = Releases.model_validate(data["releases"])
        except ValidationError:
            return data  # reported where the field itself is validated
        values = {"releases": releases.describe(), "fixed_in": releases.fixed_in}
        out = dict(data)
        if isinstance(out.get("explanation"), str):
            out["explanation"] = _fill(out["explanation"], values)
        if isinstance(out.get("fixes"), list):
            out["fixes"] = [_fill(f, values) if isinstance(f, str) else f for f in out["fixes"]]
        return out

    @model_validator(mode="after")
    def _releases_named(self) -> Signature:
        written = (inner for c in (*self.require, *self.support) for inner in c.walk())
        if self.releases is None and any(isinstance(c, ReleaseCondition) for c in written):
            raise ValueError("a `release` condition needs the signature's `releases`")
        return self


class Evidence(_Strict):
    condition: str  # the condition, as written
    holds: bool | None
    says: str


class Match(_Strict):
    signature: str
    title: str
    score: int
    symptom_only: bool
    supports: list[Evidence]
    contradicts: list[Evidence]
    unknown: list[Evidence]
    explanation: str
    fixes: list[str]
    references: list[str]
    confirm: str | None = None


class CellDiagnosis(_Strict):
    cell_id: str
    verdict: str
    reasons: list[str]
    contrast: str
    log_evidence: list[str]
    # Facts of its server logs that the passing cells' logs show too (the KV cache, the load time):
    # what every healthy server says, context for a reader, never a reason.
    log_context: list[str] = []
    preflight: list[str]
    fingerprint: str | None
    matches: list[Match]  # best first; [] = no known signature

    @property
    def known(self) -> bool:
        return bool(self.matches)


class Diagnosis(_Strict):
    cells: list[CellDiagnosis]


_FIGURE = re.compile(r"\d+(?:[.,]\d+)*")


def _shape(line: str) -> str:
    """A line with its figures taken out: lines of one shape say the same thing."""
    return _FIGURE.sub("#", line)


def _facts(log: LogFacts) -> tuple[list[str], list[str]]:
    """(what the log says of loading, its warnings, errors and exceptions), as evidence lines."""
    loading = [f"weights loader '{p.loader}' stopped at {p.done}/{p.total}: {p.total - p.done} never reached the server"
               for p in log.short_loaders]
    if log.weights_load_s is not None:
        loading.append(f"weights loaded in {log.weights_load_s:g} s")
    if log.kv_cache_tokens is not None:
        loading.append(f"KV cache {log.kv_cache_tokens:,} tokens")
    alarms = [f"warning: {w}" for w in log.warnings[:3]]
    alarms += [f"error: {e}" for e in log.errors[:3]]
    alarms += [f"{tb.exception} (innermost: {' ← '.join(reversed(tb.frames[-3:]))})" for tb in log.tracebacks[:2]]
    return loading, alarms


def _one_line_of_a_shape(lines: list[str]) -> str:
    """Lines of one shape as one, each figure that differs as its range: "loaded in 0.01–0.02 s"."""
    if len(lines) == 1:
        return lines[0]
    columns = list(zip(*(_FIGURE.findall(line) for line in lines)))
    parts = _FIGURE.split(lines[0])
    out = parts[0]
    for figures, rest in zip(columns, parts[1:]):
        values = sorted(set(figures), key=lambda f: float(f.replace(",", "")))
        out += values[0] if len(values) == 1 else f"{values[0]}–{values[-1]}"
        out += rest
    return out


def _log_lines(ev: CellEvidence) -> tuple[list[str], list[str]]:
    """(evidence, context): the log facts of the cell's runs; a fact seen in some runs only says
    in which. What the passing cells' logs say too is no reason for this cell's failure: such a
    warning, error or exception is left out, and such a fact of loading (the load time, the KV
    cache: every healthy server prints them) is context, shown apart. Lines that differ only in
    their figures are one line, with the figures' ranges."""
    healthy_loading: set[str] = set()
    healthy_alarms: set[str] = set()
    for log in ev.healthy_logs:
        loading, alarms = _facts(log)
        healthy_loading.update(map(_shape, loading))
        healthy_alarms.update(map(_shape, alarms))
    runs_of: dict[str, list[int]] = {}
    variants: dict[str, list[str]] = {}
    for i, log in enumerate(ev.logs, 1):
        loading, alarms = _facts(log)
        for line in dict.fromkeys([*loading, *(a for a in alarms if _shape(a) not in healthy_alarms)]):
            shape = _shape(line)
            if i not in runs_of.setdefault(shape, []):
                runs_of[shape].append(i)
            if line not in variants.setdefault(shape, []):
                variants[shape].append(line)
    evidence: list[str] = []
    context: list[str] = []
    for shape, runs in runs_of.items():
        line = _one_line_of_a_shape(variants[shape])
        if len(runs) != len(ev.logs) and len(ev.logs) > 1:
            line = f"run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))} of {len(ev.logs)}: {line}"
        (context if shape in healthy_loading else evidence).append(line)
    for repeat, lines in sorted(ev.after_stop.items()):
        if lines:
            evidence.append(f"run {repeat}, last lines after the stop request: " + " ⏎ ".join(lines))
    return evidence[:20], context[:20]


def _fill(template: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], m[0]), template)


def diagnose_cell(ev: CellEvidence, signatures: list[Signature]) -> CellDiagnosis:
    matches = []
    knob_causes: set[str] = set()  # signatures whose requirement names the knob as what breaks the cell
    for sig in signatures:
        required = [(c, *c.check(ev, sig.releases)) for c in sig.require]
        if any(holds is False for _, holds, _ in required) or not any(holds for _, holds, _ in required):
            continue
        checked = required + [(c, *c.check(ev, sig.releases)) for c in sig.support]
        ev_of = [Evidence(condition=c.text(), holds=h, says=s) for c, h, s in checked]
        supports = [e for e in ev_of if e.holds]
        if any(inner.names_the_knob and inner.check(ev, sig.releases)[0]
               for c in (*sig.require, *sig.support) for inner in c.walk()):
            knob_causes.add(sig.id)
        contradicts = [e for e in ev_of if e.holds is False]
        matches.append(Match(
            signature=sig.id, title=sig.title, score=len(supports) - len(contradicts), symptom_only=sig.symptom_only,
            supports=supports, contradicts=contradicts, unknown=[e for e in ev_of if e.holds is None],
            explanation=sig.explanation.strip(), fixes=sig.fixes, references=sig.references,
            confirm=_fill(sig.confirm, ev.command_vars) if sig.confirm else None,
        ))
    # Causes before symptoms; in a knob's cell, the knob's setting before how the cell failed
    # (a model compiled wrong breaks every promise a wrong model does); then by score.
    matches.sort(key=lambda m: (m.symptom_only, m.signature not in knob_causes, -m.score))
    preflight = []
    for p in (ev.inspect, ev.audit):
        if p is not None:
            state = "skipped" if p.skipped else "ok" if p.ok else f"FAILED ({p.lost} lost)"
            preflight.append(f"{p.kind}: {state}" + (f": {p.problems[0]}" if p.problems else ""))
    fp = ev.fingerprint
    log_evidence, log_context = _log_lines(ev)
    return CellDiagnosis(
        cell_id=ev.cell.cell_id, verdict=str(ev.cell.verdict), reasons=sorted(ev.cell.reasons),
        contrast=ev.contrast.describe() if ev.contrast else "no contrast",
        log_evidence=log_evidence, log_context=log_context, preflight=preflight,
        fingerprint=(f"vLLM {fp.vllm}, runai-model-streamer {fp.runai_model_streamer}, torch {fp.torch}"
                     + (f", CUDA {fp.cuda}" if fp.cuda else "") + (f", {fp.gpu}" if fp.gpu else "")) if fp else None,
        matches=matches,
    )


def diagnose(evidence: list[CellEvidence], signatures: list[Signature]) -> Diagnosis:
    return Diagnosis(cells=[diagnose_cell(ev, signatures) for ev in evidence])


SHIPPED_SIGNATURES = Path(__file__).resolve().parent.parent / "signatures"


STREAM_STOP = "runai-empty-shard-stream-stop"


@functools.cache
def shipped_releases(signature_id: str = STREAM_STOP) -> Releases:
    """A shipped signature's measured releases: what `inspect` and the pre-flight say of #157."""
    releases = next(s.releases for s in load_signatures() if s.id == signature_id)
    assert releases is not None, f"{signature_id} lists no releases"
    return releases


def stream_stop_releases() -> str:
    """runai-model-streamer #157's releases, worded once for every text that names them."""
    return f"runai-model-streamer #157: {shipped_releases().describe()}"


def load_signatures(*folders: Path) -> list[Signature]:
    """The shipped library, then each folder's *.yaml (a user's id replaces a shipped one)."""
    by_id: dict[str, Signature] = {}
    for folder in (SHIPPED_SIGNATURES, *folders):
        for path in sorted(folder.glob("*.yaml")):
            try:
                sig = Signature.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
            except (OSError, yaml.YAMLError, ValidationError) as exc:
                raise ConfigError(f"{path}: not a valid signature: {exc}") from None
            by_id[sig.id] = sig
    return list(by_id.values())
