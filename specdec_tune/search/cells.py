"""Cells that race instead of searching: a budgeted run searches its first cell (its first batch
size, its shortest context length) and each other cell races configs found there head to head
against plain (app.session_search, app.envelope). Which configs, decided once, here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..domain import FIXED_GAMMA, Config, DraftSpec

if TYPE_CHECKING:
    from .results import TuneResult

CONFIRM_TOP = 3  # how many configs of the searched cell a confirming cell races (one per draft first)
# At a raced length (its B = 1 cell itself a race of every draft, `every_draft`, not a search) a
# later batch size races the two fastest of that race: every draft was measured head to head there
# already, and at L = 6 144 a B = 4 pass costs 3-4 B = 1 ones.
CONFIRM_RACED = 2


def later_candidates(result: TuneResult, first_raced: bool, top: int = CONFIRM_TOP) -> list[Config]:
    """What a later batch size races: `confirm_candidates` of a searched first batch size (`top` of
    them; the budget may ask for CONFIRM_RACED, app.session_plan), or the CONFIRM_RACED fastest of a
    raced one (its ranking alone: each draft was raced there). Fewer than CONFIRM_TOP after a
    search: the fastest, whatever their drafts."""
    if first_raced or top <= CONFIRM_RACED:
        return _speculative(result)[: min(top, CONFIRM_RACED)]
    return confirm_candidates(result, top)


def confirm_candidates(result: TuneResult, k: int) -> list[Config]:
    """What a confirming cell races against plain: up to `k` speculative configs of a finished
    search, the best of each draft first (best first: the final round's ranking, then the
    search's), then the next best. One per draft because the best draft kind changes with the
    context length (issue 36: llama.cpp's ngram-mod default drafted nothing at 220 tokens and
    paid at 2 100)."""
    ranked = _speculative(result)
    out: list[Config] = []
    for c in ranked:
        if all(o.draft.name != c.draft.name for o in out):
            out.append(c)
    out += [c for c in ranked if c not in out]
    return out[:k]


def every_draft(result: TuneResult, specs: list[DraftSpec], max_gamma: int) -> list[Config]:
    """What a longer context length races instead of searching: `confirm_candidates` of the
    shortest length's search, then every other draft of the space at its own best config there,
    and a draft it holds no finished trial of (all pruned there) at that search's best gamma:
    untested is not refuted, and the best draft kind changes along L."""
    out = confirm_candidates(result, CONFIRM_TOP)
    ranked = _speculative(result)
    best = ranked[0] if ranked else None
    for d in specs:
        if any(c.draft.name == d.name for c in out):
            continue
        own = next((c for c in ranked if c.draft.name == d.name), None)
        if own is None:
            gamma = FIXED_GAMMA.get(d.kind) or min(max_gamma, best.gamma if best else max(1, max_gamma // 2))
            own = Config(d, gamma, 0.0)
        out.append(own)
    return out


def _speculative(result: TuneResult) -> list[Config]:
    """A finished search's speculative configs, best first."""
    return [r.config for r in result.results if r.config.gamma > 0]


def union(first: list[Config], then: list[Config]) -> list[Config]:
    """`first`, then each config of `then` not already in it."""
    keys = {c.key for c in first}
    return [*first, *(c for c in then if c.key not in keys)]
