"""Comparing token sequences: the one place that says whether two outputs for the same prompt
differ and where. judge (divergence, nondeterminism), report and compare all go through it.

A ``Comparator`` answers with the first position at which two outputs differ, or None when it
takes them as the same. ``Exact`` is the strict rule: token ids equal, lengths equal. Rules that
tolerate numerics (bf16, batching) plug in here with the same interface.
"""

from __future__ import annotations

from typing import Protocol


class Comparator(Protocol):
    name: str

    def first_difference(self, ids: list[int], reference: list[int]) -> int | None:
        """Index of the first token taken as different (a length difference counts), or None."""
        ...


class Exact:
    name = "exact"

    def first_difference(self, ids: list[int], reference: list[int]) -> int | None:
        if ids == reference:  # runs in C; the loop below only for the rare unequal pair
            return None
        for i, (a, b) in enumerate(zip(ids, reference)):
            if a != b:
                return i
        return min(len(ids), len(reference))


EXACT = Exact()
