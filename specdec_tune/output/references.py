"""The reference `check` judges a speedup against: what `run`'s fresh processes measured
(app.reference), one median each, and on the check slice (measure.narrow) every repeat of theirs."""

from __future__ import annotations

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..store.schema import Profile
from .rates import PER_ANCHOR

REPEATS = "speedup_repeats"  # the reference's every repeat (on the check slice), beside its medians


def reference_side(
    reference: dict[str, list[float]] | None, policy: CheckPolicy = CHECK_POLICY
) -> list[float]:
    """The samples a speedup is judged against where the profile has a reference: every repeat of
    the reference processes where they recorded them (the check slice), else one median each."""
    if not reference_speedups(reference, policy):
        return []
    return list((reference or {}).get(REPEATS) or []) or reference_speedups(reference, policy)


def reference_speedups(
    reference: dict[str, list[float]] | None, policy: CheckPolicy = CHECK_POLICY
) -> list[float]:
    """The reference processes' speedups (one each), when at least the policy's
    `min_reference_processes` recorded one."""
    ref = (reference or {}).get("speedup") or []
    return list(ref) if len(ref) >= policy.min_reference_processes else []


def reference_of(profile: Profile) -> dict[str, list[float]]:
    """The profile's reference tokens/s per metric (app.reference: one median per fresh process,
    measured as `check` measures), where it has enough; {} for older profiles."""
    a = profile.anchors
    if a is None or not a.has_reference:
        return {}
    out = {
        "tokens_per_s": list(a.reference_tokens_per_s),
        "baseline_tokens_per_s": list(a.reference_baseline_tokens_per_s),
        "speedup": list(a.reference_speedups),
    }
    if a.sliced and a.reference_speedup_repeats:
        out[REPEATS] = list(a.reference_speedup_repeats)
    if a.has_anchor_reference:
        out[PER_ANCHOR] = list(a.reference_plain_per_anchor)
    return out
