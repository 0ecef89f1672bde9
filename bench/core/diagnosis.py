"""Diagnosis: from a failing cell to known causes, with the evidence for and against. Pure.

A *signature* is one known issue, written as data (bench/signatures/*.yaml, or a folder of the
user's own): what it is, its upstream references, the conditions it matches on, an explanation,
the fixes in the order to try them, and a command that confirms it. Conditions look at the
evidence gathered per failing cell (``CellEvidence``: its findings, the matrix contrast, facts
from its server logs, the pre-flight, its environment's fingerprint). Each condition holds, fails,
or cannot be told from the evidence at hand.

A signature matches a cell when every ``require`` condition holds or cannot be told, and at least
one of them holds. Matches are ranked by the ``support`` conditions that hold minus those that
fail; both lists are shown, so a reader sees what speaks against a match too. A failure that
matches nothing gets its evidence and "no known signature", never an invented cause.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bench.core.config import ConfigError
from bench.core.contrast import Contrast
from bench.core.logfacts import LogFacts
from bench.core.records import CellSummary, Fingerprint, PreflightRecord
from bench.core.verdicts import Finding, Reason, RepeatedToken, ServerExit, TwinsDiffer


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _version(text: str) -> tuple[int, ...]:
    """'0.16.0', '0.32.0+cpu', '2.13.0.dev1' → (0, 16, 0): enough to order releases."""
    parts = []
    for piece in re.split(r"[.+-]", text):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


PACKAGE = r"^(vllm|runai_model_streamer|torch|cuda|python)$"  # a Fingerprint field


class VersionRange(_Strict):
    package: str = Field(pattern=PACKAGE)
    at_least: str | None = None
    at_most: str | None = None


_RELEASES = re.compile(r"^\d+(?:\.\d+)*(?:-\d+(?:\.\d+)*)?$")


class Releases(_Strict):
    """A known issue's releases, as measured: those that lose data silently, those that fail
    loudly, and the first fixed one. The one place these ranges are written: the signature's
    explanation and fixes (``{releases}``, ``{fixed_in}``), its ``release`` conditions, and
    `inspect`'s and the pre-flight's wording (``stream_stop_releases``) are derived from it.
    A range is "A" or "A-B", both ends included."""

    package: str = Field(pattern=PACKAGE)
    silent: list[str] = Field(min_length=1)
    loud: list[str] = []
    fixed_in: str

    @model_validator(mode="after")
    def _ranges(self) -> Releases:
        bad = [r for r in (*self.silent, *self.loud, self.fixed_in) if not _RELEASES.match(r)]
        if bad:
            raise ValueError(f"not a release or a range A-B of releases: {bad}")
        return self

    @staticmethod
    def _within(version: tuple[int, ...], ranges: list[str]) -> bool:
        for r in ranges:
            lo, _, hi = r.partition("-")
            if _version(lo) <= version <= _version(hi or lo):
                return True
        return False

    def regime(self, version: str) -> str:
        """"silent", "loud", "fixed", or "unknown" (older than every measured range)."""
        v = _version(version)
        if self._within(v, self.silent):
            return "silent"
        if self._within(v, self.loud):
            return "loud"
        return "fixed" if v >= _version(self.fixed_in) else "unknown"

    @staticmethod
    def text_of(ranges: list[str]) -> str:
        shown = [r.replace("-", "–") for r in ranges]
        return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]

    def describe(self) -> str:
        """"silent in 0.13.3 and 0.15.0–0.16.0, loud in 0.13.0–0.13.2 and 0.13.4–0.14.0, fixed in 0.16.1"."""
        loud = f", loud in {self.text_of(self.loud)}" if self.loud else ""
        return f"silent in {self.text_of(self.silent)}{loud}, fixed in {self.fixed_in}"

    def silent_text(self) -> str:
        """"0.13.3 and 0.15.0–0.16.0"."""
        return self.text_of(self.silent)


class CellEvidence(_Strict):
    """Everything known about one failing cell, gathered by bench.store.evidence."""

    cell: CellSummary
    vllm_load_format: str
    env: dict[str, str] = {}  # the server's environment as configured (server, image, load format)
    contrast: Contrast | None = None
    # One per judged run. The logs are read without the normal-shutdown noise the judge ignores
    # (bench.store.evidence): that is no evidence, here or in `log` patterns.
    logs: list[LogFacts] = []
    log_text: str = ""  # the judged runs' server logs, as much as was read (for `log` patterns)
    # The logs of the run's passing cells, whole: a warning, error or exception a healthy server
    # prints too (vLLM's EngineDeadError at every SIGTERM) is no evidence of this cell's failure.
    healthy_logs: list[LogFacts] = []
    healthy_log_text: str = ""
    # Per judged run, the prefix-cache hits its server counted over the workload (None: not scraped).
    prefix_cache_hits: list[float | None] = []
    shutdown_timeout_s: float | None = None
    # The last lines each judged run's server printed after the stop request, by repeat.
    after_stop: dict[int, list[str]] = {}
    fingerprint: Fingerprint | None = None
    inspect: PreflightRecord | None = None
    audit: PreflightRecord | None = None
    short_finish_reasons: list[str] = []  # finish_reason of each request shorter than min_tokens
    findings: list[Finding] = []  # the judged runs' findings as the verdict found them, with their evidence
    # What a signature's confirm command is filled with: model, python, pythonpath, cell, config.
    command_vars: dict[str, str] = {}


class Condition(_Strict):
    """Exactly one of these keys."""

    # Findings as the taxonomy names them: a reason it does not have fails the signature's load,
    # naming its file and key, instead of a condition that never holds.
    reason: list[Reason] | None = None  # the cell shows any of these finding reasons
    without_reason: list[Reason] | None = None  # the cell shows none of these finding reasons
    knob: str | None = None  # the cell is this invariance knob's cell (`invariance`)
    # Its runs' answers of one repeated token id (`degenerate`) repeat this id.
    repeated_token: int | None = None
    # Some server of the cell counted prefix-cache hits over its workload (vLLM's
    # prefix_cache_hits counter): false when every one counted none, so nothing was served from
    # cached KV blocks.
    prefix_cache_hits: bool | None = None
    # Some run's server did not exit after SIGTERM within the shutdown timeout and was killed.
    killed: bool | None = None
    # Two requests of one run with the same content (`inconsistent_output`) got other token ids
    # (`tokens`), or the same ids told as other text (`text`).
    twins_differ: Literal["tokens", "text"] | None = None
    load_format: str | None = None  # vLLM's --load-format of the cell
    contrast_axis: str | None = None  # the contrast separates the cell on this axis
    loader_short: str | None = None  # a weight loader whose name contains this stopped short of its total
    version: VersionRange | None = None  # the environment's version of a package is in range
    # The environment's version of the signature's `releases` package is in this regime of them.
    release: Literal["silent", "loud", "fixed"] | None = None
    empty_shards: bool | None = None  # the pre-flight inspect found empty shards (stream-stop risk)
    audit_lost: bool | None = None  # the pre-flight audit lost tensors
    audit_problem: str | None = None  # a regex over the audit's problems
    log: str | None = None  # a regex over the server logs
    env: dict[str, str] | None = None  # the server's environment sets these
    short_finish_reason: str | None = None  # short outputs ended with this finish_reason
    any: list[Condition] | None = None  # holds when one of these holds (the same fact seen two ways)
    # Holds when every one holds: one fact made of several (one support, not one each, so that a
    # precondition raises no signature's score above another's).
    all: list[Condition] | None = None

    @model_validator(mode="after")
    def _one(self) -> Condition:
        if sum(v is not None for v in self.__dict__.values()) != 1:
            raise ValueError("a condition has exactly one key")
        return self

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> tuple[bool | None, str]:
        """(holds, what the evidence says); holds is None when the evidence cannot tell.
        `releases`: the signature's, for `release` conditions."""
        if self.all is not None:
            results = [c.check(ev, releases) for c in self.all]
            says = "; ".join(says for _, says in results)
            if any(r[0] is False for r in results):
                return False, says
            return (None if any(r[0] is None for r in results) else True), says
        if self.any is not None:
            results = [c.check(ev, releases) for c in self.any]
            hit = next((r for r in results if r[0]), None)
            if hit is not None:
                return hit
            unknown = [r for r in results if r[0] is None]
            return (None if unknown else False), "; ".join(says for _, says in results)
        if self.reason is not None:
            seen = sorted(set(self.reason) & set(ev.cell.reasons))
            return bool(seen), (f"findings: {', '.join(seen)}" if seen else f"none of the findings {', '.join(self.reason)}")
        if self.without_reason is not None:
            seen = sorted(set(self.without_reason) & set(ev.cell.reasons))
            return not seen, (f"findings: {', '.join(seen)}" if seen else f"none of {', '.join(self.without_reason)}")
        if self.knob is not None:
            knob = ev.cell.knob
            return knob == self.knob, f"the cell of knob {knob}" if knob else "not a knob's cell"
        if self.repeated_token is not None:
            ids = sorted({f.evidence.token_id for f in ev.findings if isinstance(f.evidence, RepeatedToken)})
            if not ids:  # the findings are all the runs': none is such an answer
                return False, "no answer of one repeated token"
            return self.repeated_token in ids, f"answers of one repeated token id: {', '.join(map(str, ids))}"
        if self.twins_differ is not None:
            twins = [f.evidence for f in ev.findings
                     if f.reason == Reason.INCONSISTENT_OUTPUT and isinstance(f.evidence, TwinsDiffer)]
            if not twins:
                return False, "no two requests of the same content differ"
            kinds = {"text" if t.this_text is not None else "tokens" for t in twins}
            return self.twins_differ in kinds, f"requests of the same content differ by {' and '.join(sorted(kinds))}: " \
                f"{twins[0].text()}"
        if self.load_format is not None:
            return ev.vllm_load_format == self.load_format, f"load format {ev.vllm_load_format}"
        if self.prefix_cache_hits is not None:
            counted = [h for h in ev.prefix_cache_hits if h is not None]
            if not counted:
                return None, "no prefix-cache counter scraped"
            hits = sum(counted)
            said = f"{hits:g} prefix-cache hits in the workloads of {len(counted)} server{'s' if len(counted) != 1 else ''}"
            if not hits:
                said += " (every prompt shorter than a KV block, or none repeated one: no request was served from the cache)"
            return (hits > 0) == self.prefix_cache_hits, said
        if self.killed is not None:
            killed = sum(1 for f in ev.findings if isinstance(f.evidence, ServerExit) and f.evidence.killed)
            if not killed:
                return not self.killed, "every server exited after the stop request"
            within = f" within {ev.shutdown_timeout_s:g} s" if ev.shutdown_timeout_s else ""
            return self.killed, (f"{killed} of {len(ev.logs) or killed} servers did not exit{within} after SIGTERM and "
                                 "were killed (SIGKILL)")
        if self.contrast_axis is not None:
            if ev.contrast is None or not ev.contrast.only_with:
                return None, "no contrast in this matrix"
            if self.contrast_axis not in ev.contrast.varying:
                return None, f"the matrix has one {self.contrast_axis} only"
            on = self.contrast_axis in ev.contrast.only_with
            return on, ev.contrast.describe() if on else f"the contrast does not involve {self.contrast_axis}"
        if self.loader_short is not None:
            bars = [p for log in ev.logs for p in log.loaders if self.loader_short.lower() in p.loader.lower()]
            if not bars:
                return None, f"no {self.loader_short} progress in the server logs"
            short = [p for p in bars if p.short]
            p = (short or bars)[-1]
            return bool(short), f"the server's {p.loader} loader {'stopped at' if short else 'completed'} {p.done}/{p.total}"
        if self.version is not None:
            r = self.version
            value = getattr(ev.fingerprint, r.package, None) if ev.fingerprint else None
            if value is None:
                return None, f"{r.package} version unknown"
            v = _version(str(value))
            ok = (r.at_least is None or v >= _version(r.at_least)) and (r.at_most is None or v <= _version(r.at_most))
            bounds = " and ".join(x for x in ((f"≥ {r.at_least}" if r.at_least else ""),
                                               (f"≤ {r.at_most}" if r.at_most else "")) if x)
            return ok, f"{r.package} {value} ({'within' if ok else 'outside'} {bounds})"
        if self.release is not None:
            if releases is None:
                return None, "the signature lists no releases"
            value = getattr(ev.fingerprint, releases.package, None) if ev.fingerprint else None
            if value is None:
                return None, f"{releases.package} version unknown"
            regime = releases.regime(str(value))
            said = {"silent": f"loses data silently in {releases.silent_text()}",
                    "loud": f"fails loudly in {releases.text_of(releases.loud)}" if releases.loud else "fails loudly",
                    "fixed": f"fixed in {releases.fixed_in} and later",
                    "unknown": "older than every release measured"}[regime]
            return (None if regime == "unknown" else regime == self.release), f"{releases.package} {value} ({said})"
        if self.empty_shards is not None:
            if ev.inspect is None or ev.inspect.skipped:
                return None, "no pre-flight inspect"
            risk = [n for n in (*ev.inspect.problems, *ev.inspect.notes) if "empty shard" in n]
            return bool(risk) == self.empty_shards, risk[0] if risk else "inspect found no empty shard"
        if self.audit_lost is not None:
            if ev.audit is None or ev.audit.skipped:
                return None, "no pre-flight audit in this environment"
            lost = ev.audit.lost > 0
            what = ev.audit.problems[0] if ev.audit.problems else f"{ev.audit.lost} tensor deliveries lost"
            return lost == self.audit_lost, f"audit: {what}" if lost else "audit: every tensor delivered"
        if self.audit_problem is not None:
            if ev.audit is None or ev.audit.skipped:
                return None, "no pre-flight audit in this environment"
            problem = next((p for p in ev.audit.problems if re.search(self.audit_problem, p)), None)
            return problem is not None, f"audit: {problem}" if problem else f"audit: no problem like /{self.audit_problem}/"
        if self.log is not None:
            if not ev.log_text:
                return None, "no server log"
            m = re.search(self.log, ev.log_text)
            line = ev.log_text[ev.log_text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0].strip()[:240] if m else ""
            if m and re.search(self.log, ev.healthy_log_text):
                return None, f"server log: {line} (a passing cell's log shows it too: no evidence)"
            return m is not None, f"server log: {line}" if m else f"server log has no /{self.log}/"
        if self.env is not None:
            diff = {k: ev.env.get(k) for k, v in self.env.items() if ev.env.get(k) != v}
            return not diff, ("environment sets " + ", ".join(f"{k}={v}" for k, v in self.env.items())) if not diff \
                else "environment: " + ", ".join(f"{k}={v}" for k, v in diff.items())
        assert self.short_finish_reason is not None
        if not ev.short_finish_reasons:
            return None, "no short output"
        n = sum(1 for r in ev.short_finish_reasons if r == self.short_finish_reason)
        return n > 0, f"{n} of {len(ev.short_finish_reasons)} short outputs ended with finish_reason {self.short_finish_reason!r}"


class Signature(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    title: str
    references: list[str] = []
    symptom_only: bool = False  # accompanies failures without causing them: says so when shown
    require: list[Condition] = Field(min_length=1)
    support: list[Condition] = []
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
        def uses(cs: list[Condition]) -> bool:
            return any(c.release is not None or (c.any is not None and uses(c.any)) for c in cs)

        if self.releases is None and uses([*self.require, *self.support]):
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
    preflight: list[str]
    fingerprint: str | None
    matches: list[Match]  # best first; [] = no known signature

    @property
    def known(self) -> bool:
        return bool(self.matches)


class Diagnosis(_Strict):
    cells: list[CellDiagnosis]


def _condition_text(c: Condition) -> str:
    key, value = next((k, v) for k, v in c.model_dump(mode="json", exclude_none=True).items())
    return f"{key}: {value}"


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


def _log_lines(ev: CellEvidence) -> list[str]:
    """The log facts of the cell's runs; a fact seen in some runs only says in which. A warning,
    error or exception a passing cell's log shows too is left out; lines that differ only in
    their figures are one line, with the figures' ranges."""
    healthy = {_shape(line) for log in ev.healthy_logs for line in _facts(log)[1]}
    runs_of: dict[str, list[int]] = {}
    variants: dict[str, list[str]] = {}
    for i, log in enumerate(ev.logs, 1):
        loading, alarms = _facts(log)
        for line in dict.fromkeys([*loading, *(a for a in alarms if _shape(a) not in healthy)]):
            shape = _shape(line)
            if i not in runs_of.setdefault(shape, []):
                runs_of[shape].append(i)
            if line not in variants.setdefault(shape, []):
                variants[shape].append(line)
    out = []
    for shape, runs in runs_of.items():
        line = _one_line_of_a_shape(variants[shape])
        if len(runs) == len(ev.logs) or len(ev.logs) == 1:
            out.append(line)
        else:
            out.append(f"run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))} of {len(ev.logs)}: {line}")
    for repeat, lines in sorted(ev.after_stop.items()):
        if lines:
            out.append(f"run {repeat}, last lines after the stop request: " + " ⏎ ".join(lines))
    return out[:20]


def _fill(template: str, values: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], m[0]), template)


def diagnose_cell(ev: CellEvidence, signatures: list[Signature]) -> CellDiagnosis:
    matches = []
    for sig in signatures:
        required = [(c, *c.check(ev, sig.releases)) for c in sig.require]
        if any(holds is False for _, holds, _ in required) or not any(holds for _, holds, _ in required):
            continue
        checked = required + [(c, *c.check(ev, sig.releases)) for c in sig.support]
        ev_of = [Evidence(condition=_condition_text(c), holds=h, says=s) for c, h, s in checked]
        supports = [e for e in ev_of if e.holds]
        contradicts = [e for e in ev_of if e.holds is False]
        matches.append(Match(
            signature=sig.id, title=sig.title, score=len(supports) - len(contradicts), symptom_only=sig.symptom_only,
            supports=supports, contradicts=contradicts, unknown=[e for e in ev_of if e.holds is None],
            explanation=sig.explanation.strip(), fixes=sig.fixes, references=sig.references,
            confirm=_fill(sig.confirm, ev.command_vars) if sig.confirm else None,
        ))
    # Causes before symptoms, then by score.
    matches.sort(key=lambda m: (m.symptom_only, -m.score))
    preflight = []
    for p in (ev.inspect, ev.audit):
        if p is not None:
            state = "skipped" if p.skipped else "ok" if p.ok else f"FAILED ({p.lost} lost)"
            preflight.append(f"{p.kind}: {state}" + (f": {p.problems[0]}" if p.problems else ""))
    fp = ev.fingerprint
    return CellDiagnosis(
        cell_id=ev.cell.cell_id, verdict=str(ev.cell.verdict), reasons=sorted(ev.cell.reasons),
        contrast=ev.contrast.describe() if ev.contrast else "no contrast",
        log_evidence=_log_lines(ev), preflight=preflight,
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
