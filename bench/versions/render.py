"""A version map or bisect as summary.md and as the console table. Pure: strings and rich tables."""

from __future__ import annotations

from rich.table import Table

from bench.versions.model import VersionMap


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def headline(vmap: VersionMap) -> str:
    if vmap.mode == "bisect" and vmap.bisect is not None:
        tried = len(vmap.outcomes)
        return (f"{vmap.bisect.verdict} — {tried} trial(s) for {len(vmap.versions)} versions "
                f"(a map tries all {len(vmap.versions)})")
    changes = vmap.change_points
    if not vmap.outcomes:
        return "nothing tried yet"
    if not changes:
        return f"one regime: every version {vmap.outcomes[0].kind.words}"
    return f"{len(changes)} change point(s): " + "; ".join(c.describe() for c in changes)


def markdown(vmap: VersionMap) -> str:
    title = "Bisect" if vmap.mode == "bisect" else "Version map"
    lines = [
        f"# {title}: {vmap.axis}",
        "",
        f"Trial: {vmap.trial}.",
        f"A passing version ran {vmap.plan.repeats} fresh run(s): a failure rate of {vmap.plan.rate:.0%} or more "
        f"would show with {vmap.plan.confidence:.0%} confidence; one failing run settles a failing version.",
    ]
    if vmap.mode == "bisect":
        lines.append(f"Ends: good {vmap.good}, bad {vmap.bad}. Bisect sees one change between its ends; "
                     "several changes in the range need the map (`regbench versions`).")
    if vmap.interrupted:
        lines.append("**Interrupted**: run the same command with the same `--dir` to continue.")
    lines += ["", f"**{_cell(headline(vmap))}**", ""]
    if vmap.mode == "map" and vmap.outcomes:
        lines += ["## Regimes", "", "| versions | outcome |", "|---|---|"]
        lines += [f"| {r.span} | {r.kind.words} |" for r in vmap.regimes]
        lines.append("")
    lines += ["## Trials" + (" in the order run" if vmap.mode == "bisect" else ""), "",
              "| version | outcome | how sure | detail | results |", "|---|---|---|---|---|"]
    for o in vmap.outcomes:
        lines.append(f"| {o.version} | {o.kind.words} | {_cell(o.sureness(vmap.plan.rate))} | "
                     f"{_cell(o.detail[:300])} | {o.folder} |")
    return "\n".join(lines) + "\n"


def table(vmap: VersionMap) -> Table:
    t = Table(title=headline(vmap), title_justify="left")
    for name in ("version", "outcome", "how sure", "detail"):
        t.add_column(name, overflow="fold")
    rows = vmap.in_order() if vmap.mode == "map" else vmap.outcomes
    for o in rows:
        style = {True: "green", False: "red", None: "yellow"}[o.good]
        t.add_row(o.version, o.kind.words, o.sureness(vmap.plan.rate), o.detail[:160], style=style)
    return t
