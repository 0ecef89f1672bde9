"""Version maps and bisect: one trial per version, across the ordered versions of one axis. Pure,
no I/O.

A trial is either the weight audit (seconds per version) or one cell of a matrix (a server boot
per repeat); `bench.versions` runs them. This module turns their results into outcomes, groups
adjacent versions with the same outcome into regimes, names the change points, and decides
which version a bisect tries next.

Outcome kinds, the one taxonomy of this module:

    passes              the trial found nothing wrong in any of its runs
    loses_weights       the loader delivered fewer tensors than the files hold, and said nothing
    alters_weights      tensors arrived with other bytes, dtype or shape, twice, or unknown
    fails_at_load       the loader raised while streaming (loud: a user sees it)
    boot_fails          the server did not come up
    empty_completions   the server answered, most answers of a run with empty text (or one token)
    wrong_outputs       another failing verdict of the judge (the reasons are in the detail)
    unsupported         the audit's reader cannot drive this version (no loader API it knows): unknown
    not_installed       the version could not be installed or imported: unknown

The first is good, the last two unknown, the rest bad. Bad is settled by one failing run: the
judge's findings are not noise (a healthy server does not return empty text). Good is only as
sure as its runs: a trial repeats fresh runs until one fails or `repeats_needed(rate,
confidence)` have passed (the planner's numbers, bench.core.stats), so "passes" means "a failure
rate of `rate` or more would have shown with probability `confidence`".

Bisect assumes one change between its two ends. It cannot see several (a version range that goes
bad, good and bad again shows only one of its changes, or none); the map tries every version and
shows them all. Run the map when trials are cheap (the audit) or the ends are far apart in kind;
bisect when a trial costs minutes.
"""

from __future__ import annotations

from enum import StrEnum
from itertools import pairwise

from pydantic import AliasChoices, Field

from bench.core.records import CellSummary, Record
from bench.core.stats import detection_probability, repeats_needed
from bench.core.verdicts import Reason


class Kind(StrEnum):
    PASSES = "passes"
    LOSES_WEIGHTS = "loses_weights"
    ALTERS_WEIGHTS = "alters_weights"
    FAILS_AT_LOAD = "fails_at_load"
    BOOT_FAILS = "boot_fails"
    EMPTY_COMPLETIONS = "empty_completions"
    WRONG_OUTPUTS = "wrong_outputs"
    UNSUPPORTED = "unsupported"
    NOT_INSTALLED = "not_installed"

    @property
    def good(self) -> bool | None:
        """True: passes; False: a failure was seen; None: the trial could not tell."""
        if self is Kind.PASSES:
            return True
        if self in (Kind.UNSUPPORTED, Kind.NOT_INSTALLED):
            return None
        return False

    @property
    def words(self) -> str:
        return WORDS[self]


WORDS = {
    Kind.PASSES: "passes",
    Kind.LOSES_WEIGHTS: "loses weights silently",
    Kind.ALTERS_WEIGHTS: "alters weights",
    Kind.FAILS_AT_LOAD: "fails loudly at load",
    Kind.BOOT_FAILS: "boot fails",
    Kind.EMPTY_COMPLETIONS: "empty completions",
    Kind.WRONG_OUTPUTS: "wrong outputs",
    Kind.UNSUPPORTED: "the reader cannot drive this loader version",
    Kind.NOT_INSTALLED: "cannot be installed",
}

BOOT = {Reason.BOOT_FAILED, Reason.BOOT_TIMEOUT, Reason.PORT_TAKEN, Reason.SERVER_DIED}
EMPTY = {Reason.EMPTY_TEXT, Reason.ONE_TOKEN}


def cell_kind(reasons: set[Reason], mostly_empty: bool = True) -> Kind:
    """A failing run's kind from the judge's reasons, the most telling first: a server that never
    came up, then empty text where most of a run's answers were empty (`mostly_empty`; a few
    empty answers among right ones are wrong outputs), then weights the pre-flight audit saw lost,
    then anything else."""
    if reasons & BOOT:
        return Kind.BOOT_FAILS
    if reasons & EMPTY and mostly_empty:
        return Kind.EMPTY_COMPLETIONS
    if Reason.WEIGHTS_LOST in reasons:
        return Kind.LOSES_WEIGHTS
    return Kind.WRONG_OUTPUTS if reasons else Kind.PASSES


def mostly_empty(cell: CellSummary, prompts: int) -> bool:
    """Whether some run of the cell answered more than half of its `prompts` with empty text or
    one token: what a server that lost its weights does (#38991), not one prompt's defect."""
    return any(2 * len({f.prompt_id for f in run.findings if f.reason in EMPTY}) > prompts
               for run in cell.run_results)


class Outcome(Record):
    """One version's trial: its kind, over how many runs, and where its results are."""

    version: str
    kind: Kind
    detail: str = ""  # the first failing run's finding, or why the trial could not tell
    runs: int = 0
    failures: int = 0
    folder: str = ""  # relative to the map's folder

    @property
    def good(self) -> bool | None:
        return self.kind.good

    def sureness(self, rate: float) -> str:
        """How sure the outcome is, in words a reader can check against the runs."""
        if self.good is None:
            return "cannot tell"
        if self.good is False:
            return f"failed {self.failures} of {self.runs} run(s): settled"
        p = detection_probability(rate, self.runs) if self.runs else 0.0
        return (f"passed {self.runs} run(s): a failure rate ≥ {rate:.0%} would have shown "
                f"with probability {p:.0%}")


class Plan(Record):
    """How many fresh runs settle a passing version (see the module docstring)."""

    rate: float
    confidence: float

    @property
    def repeats(self) -> int:
        return repeats_needed(self.rate, self.confidence)


def settled(failures: int, runs: int, plan: Plan) -> bool:
    return failures > 0 or runs >= plan.repeats


class Regime(Record):
    kind: Kind
    versions: list[str]

    @property
    def span(self) -> str:
        return self.versions[0] if len(self.versions) == 1 else f"{self.versions[0]} – {self.versions[-1]}"


class ChangePoint(Record):
    """Between `before` (the last version of one regime) and `after` (the first of the next)."""

    before: str
    after: str
    from_kind: Kind
    to_kind: Kind
    untested: list[str] = []  # versions between the two that could not be told (bisect only)

    def describe(self) -> str:
        gap = f" ({', '.join(self.untested)} untested between them)" if self.untested else ""
        return f"{self.before} → {self.after}: {self.from_kind.words} → {self.to_kind.words}{gap}"


def regimes(outcomes: list[Outcome]) -> list[Regime]:
    """Adjacent versions with the same kind, in the order given."""
    out: list[Regime] = []
    for o in outcomes:
        if out and out[-1].kind == o.kind:
            out[-1].versions.append(o.version)
        else:
            out.append(Regime(kind=o.kind, versions=[o.version]))
    return out


def change_points(outcomes: list[Outcome]) -> list[ChangePoint]:
    rs = regimes(outcomes)
    return [ChangePoint(before=a.versions[-1], after=b.versions[0], from_kind=a.kind, to_kind=b.kind)
            for a, b in pairwise(rs)]


# --- bisect ---------------------------------------------------------------------------------------


class BisectError(ValueError):
    """Ends that are not in the version list, or the same version twice."""


class BisectState(Record):
    """Where a bisect stands after the trials it has: the next version to try, or its answer."""

    next: str | None  # None: finished
    interval: tuple[str, str] | None = None  # the last good and first bad version known so far
    remaining: int = 0  # versions strictly inside the interval still to tell
    change: ChangePoint | None = None  # when finished with a change found
    verdict: str = ""  # the finished answer in words, or where it stands


def _span(versions: list[str], good: str, bad: str) -> list[str]:
    """The versions from the good end to the bad end, in that direction (a fix is searched for
    with the bad end first)."""
    for end in (good, bad):
        if end not in versions:
            raise BisectError(f"{end} is not one of the versions: {', '.join(versions)}")
    if good == bad:
        raise BisectError("the good and the bad end are the same version")
    i, j = versions.index(good), versions.index(bad)
    return versions[i:j + 1] if i < j else versions[j:i + 1][::-1]


def bisect_state(versions: list[str], good: str, bad: str, outcomes: dict[str, Outcome]) -> BisectState:
    """Both ends first (a version is good only once its trial says so), then the untold version
    nearest the middle of the interval between the last good and the first bad; versions the
    trial cannot tell are stepped over and named in the answer."""
    span = _span(versions, good, bad)
    for end in (span[0], span[-1]):
        if end not in outcomes:
            return BisectState(next=end, verdict=f"trying the end {end}")
    first, last = outcomes[span[0]], outcomes[span[-1]]
    if first.good is not True:
        return BisectState(next=None, verdict=f"the good end {span[0]} does not pass ({first.kind.words}): "
                           "nothing to bisect; run the map to see where it changes")
    if last.good is not False:
        what = "passes too" if last.good else f"cannot be told ({last.kind.words})"
        return BisectState(next=None, verdict=f"no change between {span[0]} and {span[-1]}: the bad end {what}")
    lo = 0
    hi = len(span) - 1
    for k in range(1, len(span) - 1):
        o = outcomes.get(span[k])
        if o is None or o.good is None:
            continue
        if o.good is False:
            hi = k
            break
        lo = k
    untold = [k for k in range(lo + 1, hi) if span[k] not in outcomes]
    interval = (span[lo], span[hi])
    if untold:
        middle = (lo + hi) / 2
        pick = min(untold, key=lambda k: (abs(k - middle), k))
        return BisectState(next=span[pick], interval=interval, remaining=len(untold),
                           verdict=f"the change lies between {span[lo]} and {span[hi]}")
    a, b = span[lo], span[hi]
    between = span[lo + 1:hi]
    if versions.index(a) > versions.index(b):  # named in version order: a fix reads "bad → passes"
        a, b, between = b, a, between[::-1]
    change = ChangePoint(before=a, after=b, from_kind=outcomes[a].kind, to_kind=outcomes[b].kind, untested=between)
    return BisectState(next=None, interval=interval, change=change, verdict=f"change point {change.describe()}")


class VersionMap(Record):
    """What `regbench versions` and `regbench bisect` write (versions.json), and report from."""

    mode: str  # "map" or "bisect"
    axis: str  # "runai-model-streamer" or "image"
    # What was run per version, in words; a map written before trials had that name says "probe".
    trial: str = Field(validation_alias=AliasChoices("trial", "probe"))
    versions: list[str]  # the ordered list the trials ran over (bisect: the whole range)
    plan: Plan
    outcomes: list[Outcome]  # map: in version order; bisect: in the order they were tried
    good: str | None = None
    bad: str | None = None
    bisect: BisectState | None = None
    interrupted: bool = False

    def in_order(self) -> list[Outcome]:
        order = {v: i for i, v in enumerate(self.versions)}
        return sorted(self.outcomes, key=lambda o: order.get(o.version, len(order)))

    @property
    def regimes(self) -> list[Regime]:
        return regimes(self.in_order())

    @property
    def change_points(self) -> list[ChangePoint]:
        return change_points(self.in_order())
