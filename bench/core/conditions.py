"""A signature's conditions: one class per key, each with its own check. Pure.

A condition is written as one key and its value (``reason: [empty_text]``, ``load_format:
runai_streamer``; bench/signatures/*.yaml). Each key is a class here with that key as its one
field, registered by ``@condition``; ``parse_condition`` reads the written form into the class
its key names, so a key no class has, or two keys in one condition, fail the signature's load
naming its file and key. A check looks at the evidence gathered for one failing cell
(``CellEvidence``) and says whether the condition holds, fails, or cannot be told from the
evidence at hand, and in what words.

A new condition: a class with one field (its key and value) and a ``check``, decorated with
``@condition``; the fact it needs on ``CellEvidence`` (gathered in bench/store/evidence.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from bench.core.contrast import Contrast
from bench.core.evidence import RepeatedToken, ServerExit, TwinsDiffer
from bench.core.logfacts import LogFacts
from bench.core.records import CellSummary, Fingerprint, PreflightRecord
from bench.core.verdicts import Finding, Reason


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def version_of(text: str) -> tuple[int, ...]:
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
            if version_of(lo) <= version <= version_of(hi or lo):
                return True
        return False

    def regime(self, version: str) -> str:
        """"silent", "loud", "fixed", or "unknown" (older than every measured range)."""
        v = version_of(version)
        if self._within(v, self.silent):
            return "silent"
        if self._within(v, self.loud):
            return "loud"
        return "fixed" if v >= version_of(self.fixed_in) else "unknown"

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
    # prints too is no evidence of this cell's failure.
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
    # Each prompt whose requests the cell streamed: the prompts of the same request it sent whole.
    stream_twins: dict[str, list[str]] = {}
    findings: list[Finding] = []  # the judged runs' findings as the verdict found them, with their evidence
    # What a signature's confirm command is filled with: model, python, pythonpath, cell, config.
    command_vars: dict[str, str] = {}


Check = tuple[bool | None, str]  # (holds, what the evidence says); holds is None when the evidence cannot tell


class Condition(_Strict):
    """One fact a signature asks of a failing cell, written as one key; a subclass's one field is
    that key. `releases` in ``check``: the signature's, for `release` conditions."""

    key: ClassVar[str]
    # Holding, it says the knob's setting is what breaks the cell (bench.core.diagnosis ranks a
    # signature that requires such a condition before the ones that only say how the cell failed).
    names_the_knob: ClassVar[bool] = False

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        raise NotImplementedError

    def written(self) -> object:
        """The value as written (JSON's types): what the diagnosis shows beside the key."""
        return self.model_dump(mode="json", exclude_none=True)[self.key]

    def text(self) -> str:
        return f"{self.key}: {self.written()}"

    def walk(self) -> Iterator[Condition]:
        """This condition and those inside it (`any`, `all`)."""
        yield self


CONDITIONS: dict[str, type[Condition]] = {}


C = TypeVar("C", bound=Condition)


def condition(cls: type[C]) -> type[C]:
    """Registers a condition class by its key, the name of its one field."""
    (key,) = cls.model_fields
    assert key not in CONDITIONS, f"two conditions with the key {key!r}"
    cls.key = key
    CONDITIONS[key] = cls
    return cls


def parse_condition(data: object) -> Condition:
    """A condition as written, `{key: value}`, as the class its key names. Errors of the value
    are located under the key (``require.0.reason.0``), as pydantic locates a field's."""
    if isinstance(data, Condition):
        return data
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError("a condition has exactly one key")
    (key,) = data
    cls = CONDITIONS.get(key)
    if cls is None:  # located at the key itself, as pydantic's own "extra inputs" error is
        raise ValidationError.from_exception_data("Condition", [InitErrorDetails(
            type=PydanticCustomError("unknown_condition", "no condition {key}; the conditions: {known}",
                                     {"key": repr(key), "known": ", ".join(sorted(CONDITIONS))}),
            loc=(str(key),), input=data[key])])
    return cls.model_validate(data)


# Read by the key's class, written back as `{key: value}` (a condition inside `any` or `all` too).
Conditions = list[Annotated[Condition, PlainValidator(parse_condition), PlainSerializer(lambda c: {c.key: c.written()})]]


# ---- findings ----------------------------------------------------------------------------------


def _seen(reasons: list[Reason], ev: CellEvidence) -> list[Reason]:
    return sorted(set(reasons) & set(ev.cell.reasons))


@condition
class ReasonCondition(Condition):
    """The cell shows any of these finding reasons. Named as the taxonomy names them: a reason it
    does not have fails the signature's load, naming its file and key."""

    reason: list[Reason]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        seen = _seen(self.reason, ev)
        return bool(seen), (f"findings: {', '.join(seen)}" if seen else f"none of the findings {', '.join(self.reason)}")


@condition
class WithoutReasonCondition(Condition):
    """The cell shows none of these finding reasons."""

    without_reason: list[Reason]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        seen = _seen(self.without_reason, ev)
        return not seen, (f"findings: {', '.join(seen)}" if seen else f"none of {', '.join(self.without_reason)}")


@condition
class KnobCondition(Condition):
    """The cell is this invariance knob's cell (`invariance`)."""

    knob: str
    names_the_knob: ClassVar[bool] = True

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        knob = ev.cell.knob
        return knob == self.knob, f"the cell of knob {knob}" if knob else "not a knob's cell"


@condition
class RepeatedTokenCondition(Condition):
    """Its runs' answers of one repeated token id (`degenerate`) repeat this id."""

    repeated_token: int

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        ids = sorted({f.evidence.token_id for f in ev.findings if isinstance(f.evidence, RepeatedToken)})
        if not ids:  # the findings are all the runs': none is such an answer
            return False, "no answer of one repeated token"
        return self.repeated_token in ids, f"answers of one repeated token id: {', '.join(map(str, ids))}"


@condition
class TwinsDifferCondition(Condition):
    """Two requests of one run with the same content (`inconsistent_output`) got other token ids
    (`tokens`), the same ids told as other text (`text`), or, where the request gave tools, told
    otherwise by the tool parser (`parsed`: other text, calls or finish_reason)."""

    twins_differ: Literal["tokens", "text", "parsed"]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        twins = [f.evidence for f in ev.findings
                 if f.reason == Reason.INCONSISTENT_OUTPUT and isinstance(f.evidence, TwinsDiffer)]
        if not twins:
            return False, "no two requests of the same content differ"
        kinds = {"tokens" if t.this_text is None else "parsed" if t.parsed else "text" for t in twins}
        return self.twins_differ in kinds, f"requests of the same content differ by {' and '.join(sorted(kinds))}: " \
            f"{twins[0].text()}"


@condition
class LaterChoicesCondition(Condition):
    """Of an n > 1 answer, only choices after the first broke a promise: each (reason, prompt) found
    on a later choice is not found on the first (vllm#17975's family: the first choice keeps the
    request's stops and bans, later ones lose them)."""

    later_choices: bool

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        later = {(f.reason, f.prompt_id) for f in ev.findings if f.choice}
        first = {(f.reason, f.prompt_id) for f in ev.findings if not f.choice}
        only_later = sorted(later - first)
        if not only_later:
            return not self.later_choices, "no finding only on choices after the first"
        reason, prompt = only_later[0]
        return self.later_choices, f"{reason} on a later choice of {prompt}, not on its first"


@condition
class KilledCondition(Condition):
    """Some run's server did not exit after SIGTERM within the shutdown timeout and was killed."""

    killed: bool

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        killed = sum(1 for f in ev.findings if isinstance(f.evidence, ServerExit) and f.evidence.killed)
        if not killed:
            return not self.killed, "every server exited after the stop request"
        within = f" within {ev.shutdown_timeout_s:g} s" if ev.shutdown_timeout_s else ""
        return self.killed, (f"{killed} of {len(ev.logs) or killed} servers did not exit{within} after SIGTERM and "
                             "were killed (SIGKILL)")


@condition
class ShortFinishReasonCondition(Condition):
    """Short outputs (shorter than min_tokens) ended with this finish_reason."""

    short_finish_reason: str

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        if not ev.short_finish_reasons:
            return None, "no short output"
        n = sum(1 for r in ev.short_finish_reasons if r == self.short_finish_reason)
        return n > 0, f"{n} of {len(ev.short_finish_reasons)} short outputs ended with finish_reason " \
            f"{self.short_finish_reason!r}"


# ---- the cell, its matrix and its servers ----------------------------------------------------------


@condition
class LoadFormatCondition(Condition):
    """vLLM's --load-format of the cell."""

    load_format: str

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        return ev.vllm_load_format == self.load_format, f"load format {ev.vllm_load_format}"


@condition
class ContrastAxisCondition(Condition):
    """The matrix's contrast separates the cell on this axis."""

    contrast_axis: str

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        if ev.contrast is None or not ev.contrast.only_with:
            return None, "no contrast in this matrix"
        if self.contrast_axis not in ev.contrast.varying:
            return None, f"the matrix has one {self.contrast_axis} only"
        on = self.contrast_axis in ev.contrast.only_with
        return on, ev.contrast.describe() if on else f"the contrast does not involve {self.contrast_axis}"


@condition
class PrefixCacheHitsCondition(Condition):
    """Some server of the cell counted prefix-cache hits over its workload (vLLM's
    prefix_cache_hits counter): false when every one counted none, so nothing was served from
    cached KV blocks."""

    prefix_cache_hits: bool

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        counted = [h for h in ev.prefix_cache_hits if h is not None]
        if not counted:
            return None, "no prefix-cache counter scraped"
        hits = sum(counted)
        said = f"{hits:g} prefix-cache hits in the workloads of {len(counted)} server{'s' if len(counted) != 1 else ''}"
        if not hits:
            said += " (every prompt shorter than a KV block, or none repeated one: no request was served from the cache)"
        return (hits > 0) == self.prefix_cache_hits, said


@condition
class EnvCondition(Condition):
    """The server's environment sets these variables to these values."""

    env: dict[str, str]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        diff = {k: ev.env.get(k) for k, v in self.env.items() if ev.env.get(k) != v}
        if diff:
            return False, "environment: " + ", ".join(f"{k}={v}" for k, v in diff.items())
        return True, "environment sets " + ", ".join(f"{k}={v}" for k, v in self.env.items())


# ---- server logs ---------------------------------------------------------------------------------


@condition
class LoaderShortCondition(Condition):
    """A weight loader whose name contains this stopped short of its total."""

    loader_short: str

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        bars = [p for log in ev.logs for p in log.loaders if self.loader_short.lower() in p.loader.lower()]
        if not bars:
            return None, f"no {self.loader_short} progress in the server logs"
        short = [p for p in bars if p.short]
        p = (short or bars)[-1]
        return bool(short), f"the server's {p.loader} loader {'stopped at' if short else 'completed'} {p.done}/{p.total}"


@condition
class LogCondition(Condition):
    """A regex over the server logs; a line a passing cell's log shows too is no evidence."""

    log: str

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        if not ev.log_text:
            return None, "no server log"
        m = re.search(self.log, ev.log_text)
        if m is None:
            return False, f"server log has no /{self.log}/"
        line = ev.log_text[ev.log_text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0].strip()[:240]
        if re.search(self.log, ev.healthy_log_text):
            return None, f"server log: {line} (a passing cell's log shows it too: no evidence)"
        return True, f"server log: {line}"


# ---- the environment's versions --------------------------------------------------------------------


def _package_version(ev: CellEvidence, package: str) -> str | None:
    value = getattr(ev.fingerprint, package, None) if ev.fingerprint else None
    return None if value is None else str(value)


@condition
class VersionCondition(Condition):
    """The environment's version of a package is in this range."""

    version: VersionRange

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        r = self.version
        value = _package_version(ev, r.package)
        if value is None:
            return None, f"{r.package} version unknown"
        v = version_of(value)
        ok = (r.at_least is None or v >= version_of(r.at_least)) and (r.at_most is None or v <= version_of(r.at_most))
        bounds = " and ".join(x for x in ((f"≥ {r.at_least}" if r.at_least else ""),
                                           (f"≤ {r.at_most}" if r.at_most else "")) if x)
        return ok, f"{r.package} {value} ({'within' if ok else 'outside'} {bounds})"


@condition
class ReleaseCondition(Condition):
    """The environment's version of the signature's `releases` package is in this regime of them."""

    release: Literal["silent", "loud", "fixed"]

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        if releases is None:
            return None, "the signature lists no releases"
        value = _package_version(ev, releases.package)
        if value is None:
            return None, f"{releases.package} version unknown"
        regime = releases.regime(value)
        said = {"silent": f"loses data silently in {releases.silent_text()}",
                "loud": f"fails loudly in {releases.text_of(releases.loud)}" if releases.loud else "fails loudly",
                "fixed": f"fixed in {releases.fixed_in} and later",
                "unknown": "older than every release measured"}[regime]
        return (None if regime == "unknown" else regime == self.release), f"{releases.package} {value} ({said})"


# ---- the pre-flight ------------------------------------------------------------------------------


@condition
class EmptyShardsCondition(Condition):
    """The pre-flight inspect found empty shards where runai-model-streamer's stream stops (#157)."""

    empty_shards: bool

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        if ev.inspect is None or ev.inspect.skipped:
            return None, "no pre-flight inspect"
        shards = ev.inspect.stream_stop_shards
        if shards is None:  # a record older than the field: its notes are prose, not read
            return None, "the pre-flight inspect recorded no stream-stop shards (made by an older regbench)"
        if not shards:
            return not self.empty_shards, "inspect found no empty shard"
        names = ", ".join(s.removesuffix(".safetensors") for s in shards)
        return self.empty_shards, f"inspect: the stream stops at empty shard{'s' if len(shards) > 1 else ''} {names}"


def _audited(ev: CellEvidence) -> PreflightRecord | None:
    return None if ev.audit is None or ev.audit.skipped else ev.audit


@condition
class AuditLostCondition(Condition):
    """The pre-flight audit lost tensors."""

    audit_lost: bool

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        audit = _audited(ev)
        if audit is None:
            return None, "no pre-flight audit in this environment"
        lost = audit.lost > 0
        what = audit.problems[0] if audit.problems else f"{audit.lost} tensor deliveries lost"
        return lost == self.audit_lost, f"audit: {what}" if lost else "audit: every tensor delivered"


@condition
class AuditProblemCondition(Condition):
    """A regex over the pre-flight audit's problems."""

    audit_problem: str

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        audit = _audited(ev)
        if audit is None:
            return None, "no pre-flight audit in this environment"
        problem = next((p for p in audit.problems if re.search(self.audit_problem, p)), None)
        return problem is not None, f"audit: {problem}" if problem else f"audit: no problem like /{self.audit_problem}/"


# ---- conditions of conditions ----------------------------------------------------------------------


@condition
class AnyCondition(Condition):
    """Holds when one of these holds (the same fact seen two ways)."""

    any: Conditions

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        results = [c.check(ev, releases) for c in self.any]
        hit = next((r for r in results if r[0]), None)
        if hit is not None:
            return hit
        unknown = [r for r in results if r[0] is None]
        return (None if unknown else False), "; ".join(says for _, says in results)

    def walk(self) -> Iterator[Condition]:
        yield self
        for c in self.any:
            yield from c.walk()


@condition
class AllCondition(Condition):
    """Holds when every one holds: one fact made of several (one support, not one each, so that
    a precondition raises no signature's score above another's)."""

    all: Conditions

    def check(self, ev: CellEvidence, releases: Releases | None = None) -> Check:
        results = [c.check(ev, releases) for c in self.all]
        says = "; ".join(says for _, says in results)
        if any(r[0] is False for r in results):
            return False, says
        return (None if any(r[0] is None for r in results) else True), says

    def walk(self) -> Iterator[Condition]:
        yield self
        for c in self.all:
            yield from c.walk()


# The conditions of that module register themselves with these (it imports this one).
from bench.core import answer_conditions as _answer_conditions  # noqa: E402, F401
