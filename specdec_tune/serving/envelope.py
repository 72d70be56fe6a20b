"""What an export says about the context axis (`run --context-lengths`): no serving engine switches
its speculative config by prompt length, so the export names the lengths its flags were measured
for, each other length range's best, and what to do past L* (where speculation stopped paying)."""

from __future__ import annotations

from typing import Any

from ..domain import Result
from ..store.schema import Profile


def context_notes(profile: Profile, exported: Result) -> list[str]:
    """Lines for an export of `exported` (a Result) from `profile`: the L range it was measured
    best for at the smallest batch size, the other ranges' bests, and L*. [] without the axis.

        B=1: L 256 ngram-simple:4 γ12, L 2048 ngram-simple:4 γ12, L 6144 plain
          -> ["measured best for prompts of 256-2048 tokens ...", "from L 6144 ... did not pay ..."]
    """
    if not profile.context_table:
        return []
    b = min(r.batch_size for r in profile.context_table)
    rows = sorted((r for r in profile.context_table if r.batch_size == b), key=lambda r: r.context_length)
    ranges: list[tuple[int, int, Any]] = []  # (first L, last L, the best there)
    for r in rows:
        if ranges and ranges[-1][2].config.label == r.best.config.label:
            ranges[-1] = (ranges[-1][0], r.context_length, ranges[-1][2])
        else:
            ranges.append((r.context_length, r.context_length, r.best))
    label = exported.config.label
    mine = [f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi, best in ranges if best.config.label == label]
    notes = [
        f"these flags were measured best for prompts of {', '.join(mine) or 'no measured'} tokens (B = {b}); "
        "no engine switches its speculative config by prompt length"
        if mine
        else f"these flags were not the best at any measured context length (B = {b})"
    ]
    for lo, hi, best in ranges:
        if best.config.label == label:
            continue
        where = f"{lo}-{hi}" if lo != hi else f"{lo}"
        if best.config.gamma == 0:
            notes.append(
                f"at L {where} tokens speculation did not pay here (plain decoding was fastest): serve prompts "
                "that long from an instance without speculation"
            )
        else:
            notes.append(
                f"at L {where} tokens the best was {best.config.label} ({best.metrics.speedup:.2f}x): "
                "an instance for those prompts would run it instead"
            )
    star = next((line.l_star for line in profile.envelope if line.batch_size == b), None)
    if star is not None:
        notes.append(f"L* = {star}: from {star} prompt tokens on, speculation stopped paying here")
    return notes
