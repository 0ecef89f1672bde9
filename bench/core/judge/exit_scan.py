"""The exit-time scan: the log a server printed after its stop was requested, cut into alarm
episodes, each benign (vLLM's own shutdown noise, measured) or a finding. Pure."""

from __future__ import annotations

import re

from bench.core.verdicts import (
    ExitEpisode,
)

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


def episodes(shutdown_log: str) -> list[tuple[int, str]]:
    """(first line, counted from 1, and text) of each alarm episode after the stop request."""
    lines = shutdown_log.splitlines()
    episodes: list[tuple[int, list[str]]] = []
    current: list[str] | None = None
    for i, line in enumerate(lines):
        opens = bool(_OPEN.search(line)) or (current is None and bool(_ALWAYS.search(line)))
        chained = current is not None and any(_CHAINED.search(p) for p in lines[max(0, i - 3) : i])
        # Python prints "Exception ignored in: <callback>" and then that exception's traceback.
        chained = chained or (current is not None and _IGNORED.search(current[-1]) is not None
                              and line.lstrip().startswith("Traceback"))
        if opens and not chained:
            # The line before a traceback is usually the log message that introduced it.
            current = [*lines[i - 1 : i], line]
            episodes.append((max(i, 1), current))
        elif current is not None:
            current.append(line)
            if len(current) >= _EPISODE_MAX_LINES:
                current = None
    return [(first, "\n".join(e)) for first, e in episodes]


def exit_time_episodes(shutdown_log: str) -> list[str]:
    """Splits the log after the stop request into alarm episodes (each a block of lines)."""
    return [text for _, text in episodes(shutdown_log)]


def is_benign(episode: str) -> bool:
    return not _ALWAYS.search(episode) and any(p.search(episode) for p in BENIGN_SHUTDOWN_NOISE)


def unexpected_exit_episodes(shutdown_log: str) -> list[str]:
    return [e for e in exit_time_episodes(shutdown_log) if not is_benign(e)]


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$")


def exit_episode(first_line: int, episode: str) -> ExitEpisode:
    raised = [m.group(1) for m in map(_EXCEPTION_LINE.match, episode.splitlines()) if m]
    return ExitEpisode(episode=episode[-2000:], line=first_line, exception=raised[-1] if raised else None)
