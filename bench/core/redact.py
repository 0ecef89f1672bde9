"""Redaction: no secret reaches a file the bench writes.

Two kinds of secret are replaced by ``[REDACTED]`` in every record, log and config copy the
bench writes (and so in every report, which is derived from those only):
  - the values of environment variables that hold secrets: the names the matrix passes through
    to containers (``server.env_passthrough``) and any variable whose name says it is one
    (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*API_KEY*``, ``*ACCESS_KEY*``), wherever the
    value shows up;
  - anything shaped like a well-known credential (Hugging Face, GitHub, GitLab, Slack, OpenAI-
    style and AWS keys, JWTs, bearer tokens), whoever printed it.
Local servers inherit the bench's environment, so their logs are piped through the bench and
redacted line by line before they touch the disk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

MASK = "[REDACTED]"

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY", re.IGNORECASE)
# Values shorter than this are not worth masking everywhere they occur ("1", "true", ...).
MIN_SECRET_LEN = 8

TOKEN_SHAPES = re.compile(
    r"""
      \bhf_[A-Za-z0-9]{20,}                        # Hugging Face
    | \bgh[pousr]_[A-Za-z0-9]{30,}                 # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{30,}
    | \bglpat-[A-Za-z0-9_-]{20,}                   # GitLab
    | \bxox[abposr]-[A-Za-z0-9-]{10,}              # Slack
    | \bsk-[A-Za-z0-9_-]{20,}                      # OpenAI-style API keys
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                # AWS access key ids
    | \beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}   # JWTs
    | (?<=Bearer\ )[A-Za-z0-9._~+/=-]{12,}         # Authorization: Bearer <anything>
    """,
    re.VERBOSE,
)


class Redactor:
    def __init__(self, values: Iterable[str] = ()):
        # Longest first, so that a secret containing another is masked whole. JSON-escaped
        # forms too: records are redacted as serialized JSON lines.
        forms = set()
        for value in values:
            if len(value) >= MIN_SECRET_LEN:
                forms.add(value)
                forms.add(json.dumps(value)[1:-1])
        self._values = sorted(forms, key=len, reverse=True)
        self._bytes = [v.encode("utf-8", "surrogateescape") for v in self._values]

    @classmethod
    def from_env(cls, env: Mapping[str, str], passthrough: Iterable[str] = ()) -> Redactor:
        names = set(passthrough) | {n for n in env if SECRET_NAME.search(n)}
        return cls(env[n] for n in names if n in env)

    def text(self, s: str) -> str:
        for value in self._values:
            s = s.replace(value, MASK)
        return TOKEN_SHAPES.sub(MASK, s)

    def line(self, b: bytes) -> bytes:
        """One line of a log, whatever its encoding: bytes that are not UTF-8 are kept as they
        were (a log is evidence), only the secrets are replaced."""
        for value in self._bytes:
            b = b.replace(value, MASK.encode())
        text = b.decode("utf-8", "surrogateescape")
        if TOKEN_SHAPES.search(text) is None:
            return b
        return TOKEN_SHAPES.sub(MASK, text).encode("utf-8", "surrogateescape")


def redactor_for(passthrough: Iterable[str], env: Mapping[str, str] | None = None) -> Redactor:
    """The redactor of a run: the bench's environment (by default) and the matrix's passed-
    through names."""
    import os

    return Redactor.from_env(os.environ if env is None else env, passthrough)
