"""The exit-time scan: the log a server printed after its stop was requested, cut into alarm
episodes, each benign (vLLM's own shutdown noise, measured) or a finding. Pure."""

from __future__ import annotations

import re

from bench.core.evidence import ExitEpisode

# Lines that open an exit-time episode worth a look.
_OPEN = re.compile(
    r"Traceback \(most recent call last\)|Exception ignored in|Fatal Python error|"
    r"Segmentation fault|core dumped"
)


# Never benign, wherever it appears: the exit-time error of vLLM issue #38991.
_ALWAYS = re.compile(r"UnicodeDecodeError")


_IGNORED = re.compile(r"Exception ignored in")


# A chained traceback belongs to the episode before it.
_CHAINED = re.compile(r"During handling of the above exception|The above exception was the direct cause")


# What vLLM 0.32 prints on a normal SIGTERM (measured; see docs/judged.md, "Exit-time scan"). An episode
# is benign only if one of these matches it; anything else in the shutdown phase is a finding.
BENIGN_SHUTDOWN_NOISE: tuple[re.Pattern[str], ...] = (
    # The API server's output handler notices the engine going away first.
    re.compile(r"AsyncLLM output_handler failed[\s\S]*EngineDeadError"),
    re.compile(r"EngineDeadError: EngineCore encountered an issue"),
)


_EPISODE_MAX_LINES = 80


def _spans(lines: list[str]) -> list[tuple[int, int]]:
    """[first, end) line indices of each alarm episode."""
    spans: list[list[int]] = []
    current: list[int] | None = None  # the episode being read, as [first, end)
    for i, line in enumerate(lines):
        opens = bool(_OPEN.search(line)) or (current is None and bool(_ALWAYS.search(line)))
        chained = current is not None and any(_CHAINED.search(p) for p in lines[max(0, i - 3) : i])
        # Python prints "Exception ignored in: <callback>" and then that exception's traceback.
        chained = chained or (current is not None and _IGNORED.search(lines[current[1] - 1]) is not None
                              and line.lstrip().startswith("Traceback"))
        if opens and not chained:
            # The line before a traceback is usually the log message that introduced it.
            current = [max(i - 1, 0), i + 1]
            spans.append(current)
        elif current is not None:
            current[1] = i + 1
            if current[1] - current[0] >= _EPISODE_MAX_LINES:
                current = None
    return [(first, end) for first, end in spans]


def episodes(shutdown_log: str) -> list[tuple[int, str]]:
    """(first line, counted from 1, and text) of each alarm episode after the stop request."""
    lines = shutdown_log.splitlines()
    return [(first + 1, "\n".join(lines[first:end])) for first, end in _spans(lines)]


def exit_time_episodes(shutdown_log: str) -> list[str]:
    """Splits the log after the stop request into alarm episodes (each a block of lines)."""
    return [text for _, text in episodes(shutdown_log)]


def is_benign(episode: str) -> bool:
    return not _ALWAYS.search(episode) and any(p.search(episode) for p in BENIGN_SHUTDOWN_NOISE)


def unexpected_exit_episodes(shutdown_log: str) -> list[str]:
    return [e for e in exit_time_episodes(shutdown_log) if not is_benign(e)]


def without_benign_episodes(shutdown_log: str) -> str:
    """The log after the stop request without the lines of its benign episodes (a line that an
    unexpected episode holds too stays), every other line as it was, its line end included. By
    line, not by the episode's text: vLLM ends the lines of a multi-line record (a logged
    traceback) with CR LF, so an episode rejoined with LF is not in the log as written."""
    lines = shutdown_log.splitlines()
    benign: set[int] = set()
    kept: set[int] = set()
    for first, end in _spans(lines):
        (benign if is_benign("\n".join(lines[first:end])) else kept).update(range(first, end))
    return "".join(line for i, line in enumerate(shutdown_log.splitlines(keepends=True))
                   if i not in benign or i in kept)


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$")


def exit_episode(first_line: int, episode: str) -> ExitEpisode:
    raised = [m.group(1) for m in map(_EXCEPTION_LINE.match, episode.splitlines()) if m]
    return ExitEpisode(episode=episode[-2000:], line=first_line, exception=raised[-1] if raised else None)
