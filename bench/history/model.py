"""The run history in memory (`regbench history`). Pure: stored rows in, series, breaks and slowdowns out.

A run enters it as rows (bench.history.rows: its cells' verdicts as the run's judge gave them),
read back here per cell; nothing here judges again.

Across runs a cell is read in the order the runs started. A *regression* is the first run where
the cell's verdict is fail or flaky after a run where it passed; the run before it that passed is
its *last good* run. Flaky counts as broken: a cell that fails one run in five after passing
twenty is the nightly a release manager wants named. Runs where the cell did not run (not in the
matrix, NOT RUN) neither break nor mend it. A cell that never passed before failing has no last
good run, and says so; one that passes again names the run that fixed it. Where the fingerprints
of the last good run and the first bad one differ, the break names the `regbench bisect` that
narrows it, when the matrix can replay it as it stands.

A *slowdown across runs* is `regbench compare`'s rule (bench.core.perf.slowdown) applied to one run
of a cell against a window of its earlier good runs: per metric, the per-run values (one per fresh
server) of the last `window` runs that passed and measured it, pooled, as side A; the run's own
per-run values as side B. A run flagged slower on a metric does not enter that metric's later
windows, so a slowdown stays flagged until the cell is fast again, as a break stays named until it
is fixed; it still enters the other metrics' windows and, if it passed, the verdict's.

A release manager who runs one image per release asks another question: which release broke the
cell. Those are different cells (the image is part of the id), so `by="image"` and `by="vllm"`
read a *series* instead: the cell without its image (`m__lf__plat__*`, a knob's `+knob` kept: a
knob's cell is compared with its own original, so it is a series of its own), its points every
(run, image) of it, ordered by the image's version (its reference's tag, else its name) or by the
fingerprint's vLLM then streamer version, then by start time. Breaks and slowdowns are the same
rules along that order; since a run holds several points of a series, a point is then named by its
run and its image.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from collections.abc import Iterable

from packaging.version import InvalidVersion, Version
from pydantic import Field, computed_field

from bench.core.matrix import KNOB_SEP, matrix_image
from bench.core.perf import METRICS, MIN_RUNS, SlowdownCheck, slowdown
from bench.core.records import Record
from bench.core.stats import percent_range, wilson_interval
from bench.core.verdicts import Verdict
from bench.history.rows import StoredCell, StoredFingerprint, StoredPerf, StoredRun, StoredRunValue


class CellPoint(Record):
    """One cell in one run, as `regbench history` shows it."""

    run_id: str
    started_at: float
    image: str
    vllm: str | None
    runai_model_streamer: str | None
    torch: str | None
    image_digest: str | None
    verdict: Verdict
    failures: int
    runs: int
    interval: tuple[float, float] | None
    reasons: dict[str, int]
    signature: str | None
    perf: dict[str, float]  # metric -> median over the cell's runs
    # metric -> one value per fresh server, by repeat; empty for runs ingested before schema version 2
    values: dict[str, list[float]] = Field(default_factory=dict)
    source: str = ""  # the results folder the run was ingested from
    image_ref: str | None = None  # a container image's reference; None: a local image (a venv)
    cell_id: str = ""  # which cell of a series (--by image|vllm) the point is; not in time order's JSON

    @property
    def good(self) -> bool:
        return self.verdict == Verdict.PASS

    @property
    def broken(self) -> bool:
        return self.verdict.failing

    def rate(self) -> str:
        interval = f" ({percent_range(*self.interval)})" if self.interval else ""
        return f"{self.failures}/{self.runs}{interval}"


class BisectHint(Record):
    """The command that narrows one change of a break to one version."""

    change: str  # "runai_model_streamer 0.17.0 → 0.16.0"
    command: str  # as it runs, or with the upper-case words of `needs` to fill in
    needs: str | None = None  # what the command's placeholders stand for; None: it runs as printed

    def text(self) -> str:
        return f"{self.change}: {self.command}" + (f" ({self.needs})" if self.needs else "")


class Regression(Record):
    """Where a cell broke: the first run failing or flaky, and the last run before it that passed
    (None: it never passed before), and the first run after it that passed again, if any."""

    first_bad: str
    verdict: Verdict  # at first_bad
    last_good: str | None
    fixed_in: str | None = None
    changed: dict[str, tuple[str | None, str | None]] = Field(default_factory=dict)  # fingerprint field -> (last good, first bad)
    bisect: list[BisectHint] = Field(default_factory=list)  # how to narrow each change (bisect_hints)
    # Out of time order a run holds a point per image of the series: the run id alone does not
    # say which point broke. None in time order (and left out of its JSON).
    first_bad_image: str | None = None
    last_good_image: str | None = None
    fixed_in_image: str | None = None
    # How text() names each point ("first_bad", "last_good", "fixed_in"), where not by its run id.
    names: dict[str, str] = Field(default_factory=dict, exclude=True)
    # Flaky-aware: one passing run of a cell that fails one start in five proves little. The fresh
    # starts of the passing stretch before the break (runs back to the previous break), those of
    # the broken stretch (first bad up to the fix) with their failures, and of the passing stretch
    # from the fix on; see `evidence`.
    good_starts: int = 0
    bad_failures: int = 0
    bad_starts: int = 0
    fixed_starts: int = 0

    @property
    def broken_rate(self) -> tuple[float, float]:
        """The Wilson 95 % interval of the failure rate over the broken stretch."""
        return wilson_interval(self.bad_failures, self.bad_starts)

    def rules_out(self, starts: int) -> bool:
        """Whether `starts` fresh starts without a failure rule out the broken stretch's rate: the
        highest rate they allow lies below the lowest the broken stretch allows."""
        return starts > 0 and wilson_interval(0, starts)[1] < self.broken_rate[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def good_rules_out(self) -> bool | None:
        """None: no passing run before the break."""
        return self.rules_out(self.good_starts) if self.last_good is not None else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fix_rules_out(self) -> bool | None:
        """None: not passing since."""
        return self.rules_out(self.fixed_starts) if self.fixed_in is not None else None

    def evidence(self) -> str:
        low, high = self.broken_rate
        rate = f"{self.bad_failures}/{self.bad_starts} fresh starts failed ({percent_range(low, high)})"

        def passes(what: str, starts: int, holds: bool | None) -> str:
            allows = percent_range(*wilson_interval(0, starts))
            verdict = "rule that rate out" if holds else "too few to rule it out"
            return f"{what}: {starts} passing fresh start(s) ({allows}), {verdict}"

        parts = [f"broken: {rate}"]
        if self.last_good is not None:
            parts.append(passes("before", self.good_starts, self.good_rules_out))
        if self.fixed_in is not None:
            parts.append(passes("since the fix", self.fixed_starts, self.fix_rules_out))
        return "; ".join(parts)

    def text(self) -> str:
        def name(key: str, run_id: str) -> str:
            return self.names.get(key, run_id)

        before = (f"last good {name('last_good', self.last_good)}" if self.last_good is not None
                  else "no good run before it in the history")
        changes = "; changed: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in self.changed.items()) if self.changed else ""
        fixed = f"; passes again from {name('fixed_in', self.fixed_in)}" if self.fixed_in else "; not passing since"
        return (f"first {self.verdict.value.upper()} in {name('first_bad', self.first_bad)}, {before}{changes}{fixed}"
                + (f" ({self.evidence()})" if self.bad_starts else ""))


def _version_range(a: str, b: str) -> str:
    """bisect's --streamer A..B wants the older release first, whichever end broke."""
    try:
        older, newer = sorted((a, b), key=Version)
    except InvalidVersion:
        return f"{a},{b}"  # not a release number the index could order: the two ends only
    return f"{older}..{newer}"


def bisect_hints(cell_id: str, good: CellPoint, bad: CellPoint,
                 changed: dict[str, tuple[str | None, str | None]], *, by: str = "time",
                 between: Iterable[str] = (), held: Iterable[str] | None = None) -> list[BisectHint]:
    """How to narrow a break to one version, per axis that changed between the last good run and
    the first bad one. A streamer release is an overlay on a local image, so its bisect runs as
    printed, on the bad run's own matrix (its results folder keeps it, paths resolved). A vLLM
    release or an image digest is an image of the matrix: the command names what a matrix of one
    image per release between the two must hold, never images the history cannot know.

    Out of time order (`by` image or vllm) a break between two images of a series is exactly what
    `bisect --images` narrows: the hint names the two images as its ends, with `between` (the
    images of the series between them in that order) inside. It runs as printed where the first
    bad run's matrix holds every one of them (`held`: that run's images; None: not known)."""
    if KNOB_SEP in cell_id:
        return []  # a knob's cell is judged against another cell: bisect tries one cell alone
    out = []
    streamer = changed.get("runai_model_streamer")
    local = good.image_ref is None and bad.image_ref is None
    if streamer is not None and None not in streamer and local and bad.source:
        a, b = str(streamer[0]), str(streamer[1])
        out.append(BisectHint(change=f"runai_model_streamer {a} → {b}", command=shlex.join([
            "regbench", "bisect", "--config", f"{bad.source}/config.yaml", "--cell", cell_id,
            "--streamer", _version_range(a, b), "--good", a, "--bad", b])))
    # In a container the streamer comes with the image: only another image changes it.
    image_axis = [k for k in ("vllm", "runai_model_streamer", "image_digest")
                  if k in changed and (k != "runai_model_streamer" or not local)]
    old, new = matrix_image(good.image), matrix_image(bad.image)
    if by != "time" and old != new:
        out.append(_images_hint(cell_id, good, bad, [f"{k} {changed[k][0]} → {changed[k][1]}" for k in image_axis],
                                between, held))
    elif image_axis:
        def shown(p: CellPoint) -> str:
            return p.image_digest or p.image_ref or p.image

        out.append(BisectHint(
            change=", ".join(f"{k} {changed[k][0]} → {changed[k][1]}" for k in image_axis),
            command="regbench bisect --config MATRIX --cell CELL --images OLD,…,NEW --good OLD --bad NEW",
            needs=(f"MATRIX: a matrix with one image per release from the last good run's ({shown(good)}) to the "
                   f"first bad run's ({shown(bad)}), OLD to NEW; CELL: its cell {cell_id.rsplit('__', 1)[0]}__ "
                   "with any of them")))
    return out


def _images_hint(cell_id: str, good: CellPoint, bad: CellPoint, changes: list[str], between: Iterable[str],
                 held: Iterable[str] | None) -> BisectHint:
    old, new = matrix_image(good.image), matrix_image(bad.image)
    change = ", ".join([f"image {old} → {new}", *changes])
    inside = list(dict.fromkeys(i for i in between if i not in (old, new)))
    have = set(held) if held is not None else set()
    if bad.source and {old, new} <= have:
        # The images between the two that this matrix lacks cannot be tried with it: left out.
        images = [old, *(i for i in inside if i in have), new]
        return BisectHint(change=change, command=shlex.join([
            "regbench", "bisect", "--config", f"{bad.source}/config.yaml", "--cell", cell_id,
            "--images", ",".join(images), "--good", old, "--bad", new]))
    a, b = shlex.quote(old), shlex.quote(new)
    return BisectHint(
        change=change,
        command=f"regbench bisect --config MATRIX --cell CELL --images {a},…,{b} --good {a} --bad {b}",
        needs=(f"MATRIX: a matrix with the images {old} and {new} and one image per release between them "
               f"({'the history has ' + ', '.join(inside) if inside else 'the history has none'}); …: those, "
               f"in order; CELL: {series_of(cell_id)} with any of its images for *"))


class Slowdown(Record):
    """A run slower than its cell's window of good runs on one metric, by compare's rule."""

    run_id: str
    window: list[str]  # the good runs it was compared with, oldest first
    check: SlowdownCheck
    # Out of time order: the point's image, and the window's images beside `window`'s run ids.
    image: str | None = None
    window_images: list[str] | None = None
    # How text() names the point ("point") and the window's ends ("first", "last"), where not by run id.
    names: dict[str, str] = Field(default_factory=dict, exclude=True)

    def text(self) -> str:
        first = self.names.get("first", self.window[0])
        last = self.names.get("last", self.window[-1])
        runs = first if first == last else f"{first} … {last}"
        point = self.names.get("point", self.run_id)
        return f"{point}: {self.check.text()}, against {len(self.window)} good run(s) ({runs})"


class CellHistory(Record):
    cell_id: str  # out of time order, the series: the cell id with `*` for its image
    points: list[CellPoint]  # in the order `by` says: the runs' start times by default
    regressions: list[Regression]
    slowdowns: list[Slowdown] = Field(default_factory=list)  # in the points' order
    # Runs that measured performance with fewer fresh servers than the rule needs (MIN_RUNS): they
    # cannot be flagged slower, whatever their figures.
    too_few_runs: list[str] = Field(default_factory=list)
    too_few_images: list[str] | None = None  # out of time order: their images, beside too_few_runs
    by: str = Field(default="time", exclude=True)  # the order of the points (ORDERS)

    def name(self, p: CellPoint) -> str:
        return point_name(p, self.by)

    def as_json(self) -> dict:
        """As `regbench history --format json` prints it: in time order exactly the keys it always had,
        the fields that name a point's image only where the order needs them."""
        if self.by != "time":
            return self.model_dump(mode="json")
        return self.model_dump(mode="json", exclude={
            "too_few_images": True,
            "points": {"__all__": {"cell_id"}},
            "regressions": {"__all__": {"first_bad_image", "last_good_image", "fixed_in_image"}},
            "slowdowns": {"__all__": {"image", "window_images"}},
        })


DEFAULT_WINDOW = 5
# How a cell's points are ordered: by the runs' start times; or, one series per cell without its
# image, by the image's version, or by the fingerprint's vLLM (then streamer) version.
ORDERS = ("time", "image", "vllm")
ORDER_TEXT = {
    "time": "by start time",
    "image": "by image version (its reference's tag, else its name), then start time",
    "vllm": "by vLLM version, then runai-model-streamer version, then start time",
}
SERIES_IMAGE = "*"


def series_of(cell_id: str) -> str:
    """The series a cell belongs to out of time order: its id with `*` for the image, a knob kept
    (`m__lf__plat__img+serial` -> `m__lf__plat__*+serial`): a knob's cell is checked against its
    own original, a question of its own whatever the release."""
    head, sep, image = cell_id.rpartition("__")
    if not sep:
        return cell_id
    _, knob_sep, knob = image.partition(KNOB_SEP)
    return f"{head}__{SERIES_IMAGE}{knob_sep}{knob}"


# A release number inside an image's name or tag: `vllm-0.31.0`, `v0.10.0`, `nightly-0.10.1rc1`. A
# dot is required: a bare number (`nightly-20260601`) is left to the natural order, which sorts it
# as well.
_RELEASE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)+(?:[-.]?(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?)")


def _release(text: str) -> Version | None:
    """The first release number in a name or tag that PEP 440 reads."""
    for m in _RELEASE.finditer(text):
        try:
            return Version(m.group(1))
        except InvalidVersion:
            continue
    return None


def _natural(text: str) -> list[str | int]:
    """`img-9` before `img-10`: digit runs compared as numbers. re.split with a group alternates
    text and digits, text first, so two keys compare like with like."""
    return [int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text))]


def _tag(ref: str | None) -> str | None:
    """The tag of a container reference (`vllm/vllm-openai:v0.10.0@sha256:…` -> `v0.10.0`); a
    registry's port (`host:5000/repo`) is not one."""
    if not ref:
        return None
    name = ref.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.partition(":")[2] or None


def image_key(p: CellPoint) -> tuple:
    """An image's place among releases: the release number of its tag, else of its name (a tag
    like `latest` tells nothing, the name may); names without one after every release, in natural
    order."""
    name = matrix_image(p.image)
    tag = _tag(p.image_ref)
    for text in (tag, name):
        if text and (v := _release(text)) is not None:
            return (0, v, _natural(name))
    return (1, _natural(tag or name))


def version_key(text: str | None) -> tuple:
    """PEP 440 order; a version it cannot read after every one it can, an unknown one last."""
    if text is None:
        return (2,)
    try:
        return (0, Version(text))
    except InvalidVersion:
        return (1, _natural(text))


def order_key(by: str):
    """The sort key of a series' points for an order of ORDERS; start time, run id and image
    break the ties, so the order never depends on how the database returned the rows."""
    def tail(p: CellPoint) -> tuple:
        return (p.started_at, p.run_id, _natural(p.image))

    if by == "image":
        return lambda p: (image_key(p), *tail(p))
    if by == "vllm":
        return lambda p: (version_key(p.vllm), version_key(p.runai_model_streamer), *tail(p))
    return lambda p: tail(p)


def point_name(p: CellPoint, by: str) -> str:
    """How the views name a point: its run in time order; out of it its image first (what the
    order is about), and the vLLM version when that is the order."""
    if by == "time":
        return p.run_id
    if by == "vllm":
        return f"vLLM {p.vllm or '?'} (image {p.image}, run {p.run_id})"
    return f"{p.image} (run {p.run_id})"


def ordered(runs: list[StoredRun]) -> list[StoredRun]:
    """By start time; run ids break ties (they begin with the start time, to the second)."""
    return sorted(runs, key=lambda r: (r.started_at, r.run_id))


def regressions(points: list[CellPoint], cell_id: str = "", by: str = "time",
                held: dict[str, set[str]] | None = None) -> list[Regression]:
    """Each time the cell went from passing (or from the start of the history) to failing or flaky,
    in the points' order (`by`: see ORDERS). Out of time order each point is also named by its
    image, and a break's bisect is for the first bad point's own cell; `held`: per run, the
    images its matrix held (what makes an images bisect runnable as printed)."""
    out: list[Regression] = []
    last_good: int | None = None  # index in points
    open_: Regression | None = None
    series = by != "time"
    for i, p in enumerate(points):
        if p.good:
            if open_ is not None:
                open_.fixed_in = p.run_id
                if series:
                    open_.fixed_in_image = p.image
                    open_.names["fixed_in"] = point_name(p, by)
                open_ = None
            last_good = i
        elif p.broken and open_ is None:
            good = points[last_good] if last_good is not None else None
            changed = {}
            if good is not None:
                for field in ("vllm", "runai_model_streamer", "torch", "image_digest"):
                    a, b = getattr(good, field), getattr(p, field)
                    if a != b:
                        changed[field] = (a, b)
            hint_cell = p.cell_id if series and p.cell_id else cell_id
            hints = []
            if good is not None and hint_cell:
                between = [matrix_image(q.image) for q in points[last_good + 1:i]] if last_good is not None else []
                hints = bisect_hints(hint_cell, good, p, changed, by=by, between=between,
                                     held=held.get(p.run_id) if held is not None else None)
            open_ = Regression(first_bad=p.run_id, verdict=p.verdict,
                               last_good=good.run_id if good else None, changed=changed, bisect=hints)
            if series:
                open_.first_bad_image, open_.last_good_image = p.image, good.image if good else None
                open_.names.update({"first_bad": point_name(p, by),
                                    **({"last_good": point_name(good, by)} if good else {})})
            out.append(open_)
    _count_starts(points, out)
    return out


def _count_starts(points: list[CellPoint], breaks: list[Regression]) -> None:
    """Each break's fresh starts, by stretch (Regression.good_starts and after). A stretch ends at
    a point of the other kind; a point that did not run belongs to none."""
    bounds: list[list] = []  # [index of the first bad point, index of the fix or None], as regressions() walks
    for i, p in enumerate(points):
        is_open = bool(bounds) and bounds[-1][1] is None
        if p.good and is_open:
            bounds[-1][1] = i
        elif p.broken and not is_open:
            bounds.append([i, None])
    for r, (start, fix) in zip(breaks, bounds, strict=True):
        k = start - 1
        while k >= 0 and not points[k].broken:
            r.good_starts += points[k].runs if points[k].good else 0
            k -= 1
        end = fix if fix is not None else len(points)
        for q in points[start:end]:
            if q.broken:
                r.bad_failures += q.failures
                r.bad_starts += q.runs
        if fix is not None:
            k = fix
            while k < len(points) and not points[k].broken:
                r.fixed_starts += points[k].runs if points[k].good else 0
                k += 1


def _cannot_be_slower(metric: str, a: list[float], b: list[float], limit: float) -> bool:
    """Whether no resample's ratio can exceed the threshold: a median lies between its sample's
    extremes, so the most a resampled ratio can be is max(b)/min(a) (min(b)/max(a) for a rate).
    Then the check cannot say slower, and its 2 × 2000 resamples are spared: most checks of a
    steady history end here."""
    if METRICS[metric].worse == "lower":
        a, b = b, a
    return min(a) > 0 and max(b) / min(a) <= limit


def slowdowns_across(points: list[CellPoint], window: int = DEFAULT_WINDOW,
                     thresholds: dict[str, float] | None = None, by: str = "time") -> list[Slowdown]:
    """Each point (in the points' order: start order unless `by` says otherwise) against the last
    `window` points before it that passed and measured the metric, per metric, by
    bench.core.perf.slowdown; only the points it calls slower."""
    out: list[Slowdown] = []
    slower: set[tuple[str, str, str]] = set()  # (run id, image, metric) flagged: kept out of that metric's windows
    for i, p in enumerate(points):
        for metric in METRICS:
            b = p.values.get(metric, [])
            if len(b) < MIN_RUNS:
                continue  # the rule's "not enough repeats": nothing to flag
            good = [q for q in points[:i]
                    if q.good and q.values.get(metric) and (q.run_id, q.image, metric) not in slower]
            good = good[-window:]
            a = [v for q in good for v in q.values[metric]]
            if len(a) < MIN_RUNS:
                continue
            limit = (thresholds or {}).get(metric, METRICS[metric].threshold)
            if _cannot_be_slower(metric, a, b, limit):
                continue
            check = slowdown(metric, a, b, limit)
            if check is not None and check.verdict == "slower":
                slower.add((p.run_id, p.image, metric))
                found = Slowdown(run_id=p.run_id, window=[q.run_id for q in good], check=check)
                if by != "time":
                    found.image, found.window_images = p.image, [q.image for q in good]
                    found.names = {"point": point_name(p, by), "first": point_name(good[0], by),
                                   "last": point_name(good[-1], by)}
                out.append(found)
    return out


def cell_histories(
    runs: list[StoredRun], cells: list[StoredCell], fingerprints: list[StoredFingerprint], perf: list[StoredPerf],
    values: list[StoredRunValue] | None = None, window: int = DEFAULT_WINDOW,
    thresholds: dict[str, float] | None = None, by: str = "time",
) -> list[CellHistory]:
    """Every cell across the runs given, cells in id order, each cell's runs by start time, with
    its breaks and its slowdowns against a window of `window` good runs (per metric, above its
    threshold in `thresholds`, else its default). `by` image or vllm: every series (series_of)
    instead, its points in that order (order_key)."""
    if by not in ORDERS:
        raise ValueError(f"by={by!r}: one of {', '.join(ORDERS)}")
    order = {r.run_id: (i, r) for i, r in enumerate(ordered(runs))}
    # A knob's cell runs its original image: one fingerprint for both.
    prints = {(f.run_id, f.image): f for f in fingerprints}
    medians: dict[tuple[str, str], dict[str, float]] = {}
    for m in perf:
        medians.setdefault((m.run_id, m.cell_id), {})[m.metric] = m.median
    per_server: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = {}
    for v in values or []:
        per_server.setdefault((v.run_id, v.cell_id), {}).setdefault(v.metric, []).append((v.repeat, v.value))
    by_cell: dict[str, list[CellPoint]] = {}
    for c in sorted((c for c in cells if c.run_id in order), key=lambda c: (c.cell_id, order[c.run_id][0])):
        fp = prints.get((c.run_id, matrix_image(c.image)))
        run = order[c.run_id][1]
        by_cell.setdefault(c.cell_id, []).append(CellPoint(
            run_id=c.run_id, started_at=run.started_at, image=c.image,
            vllm=fp.vllm if fp else None, runai_model_streamer=fp.runai_model_streamer if fp else None,
            torch=fp.torch if fp else None, image_digest=fp.image_digest if fp else None,
            verdict=c.verdict, failures=c.failures, runs=c.runs, interval=c.interval, reasons=c.reasons,
            signature=c.signature, perf=medians.get((c.run_id, c.cell_id), {}),
            values={k: [x for _, x in sorted(vs)] for k, vs in per_server.get((c.run_id, c.cell_id), {}).items()},
            source=run.source, image_ref=fp.image_ref if fp else None, cell_id=c.cell_id,
        ))
    if by != "time":
        series: dict[str, list[CellPoint]] = defaultdict(list)
        for cid, points in by_cell.items():
            series[series_of(cid)] += points
        key = order_key(by)
        by_cell = {sid: sorted(points, key=key) for sid, points in sorted(series.items())}
    # The images each run's matrix held: its fingerprints' and its cells' (a knob's is its original's).
    held: dict[str, set[str]] = defaultdict(set)
    for f in fingerprints:
        held[f.run_id].add(f.image)
    for c in cells:
        held[c.run_id].add(matrix_image(c.image))
    histories = []
    for cid, points in by_cell.items():
        few = [p for p in points if p.values and max(map(len, p.values.values())) < MIN_RUNS]
        histories.append(CellHistory(
            cell_id=cid, points=points, regressions=regressions(points, cid, by, held),
            slowdowns=slowdowns_across(points, window, thresholds, by),
            too_few_runs=[p.run_id for p in few], too_few_images=[p.image for p in few] if by != "time" else None,
            by=by,
        ))
    return histories
