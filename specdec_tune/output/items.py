"""`check`'s items beside the speedup and the rates: the target's weights, the acceptance, and greedy
exactness (output.check judges the speedup and gathers them all into one config's items)."""

from __future__ import annotations

import math

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from .verdicts import CheckItem, Evidence


def weights_item(
    stored_hash: str, hash_now: str, changed: str = "the target model files changed"
) -> CheckItem:
    """The target's weights: the same content hash as the profile's, else a failed item."""
    same = hash_now == stored_hash
    return CheckItem("target weights", stored_hash, hash_now, same, "" if same else changed)


def acceptance_item(
    e: Evidence, acceptance_tolerance: float | None = None, policy: CheckPolicy = CHECK_POLICY
) -> CheckItem | None:
    """|α now - α stored| within `acceptance_tolerance` (default: the policy's, greedy or sampled);
    no load changes α, so this is judged on any machine. None for a config without a draft."""
    if e.stored.config.draft.kind == "none":
        return None
    tol = policy.acceptance_tolerance(e.temperature) if acceptance_tolerance is None else acceptance_tolerance
    stored, now = e.stored.metrics.acceptance_rate, e.measured.metrics.acceptance_rate
    return CheckItem(
        f"acceptance_rate{e.where}",
        round(stored, 4),
        round(now, 4),
        abs(now - stored) <= tol,
        f"must be within ±{tol:.3f}",
    )


def exactness_item(e: Evidence) -> CheckItem | None:
    """At temperature 0, no prompt's speculative output may differ from the target's own; None when
    sampling."""
    if e.temperature != 0:
        return None
    n = e.measured.mismatches
    parted, compared = e.stored_divergence
    if parted <= 0 or compared <= 0:
        return CheckItem(
            f"greedy exactness{e.where}",
            0,
            n,
            n == 0,
            "prompts whose speculative output differs from the target's own",
        )
    prompts = int(e.measured.exactness.get("prompts") or compared)
    allowed = math.ceil(parted / compared * prompts)
    return CheckItem(
        f"greedy exactness{e.where}",
        allowed,
        n,
        n <= allowed,
        f"prompts whose speculative output differs from the plain engine's: the engine is not "
        f"token-exact at T = 0 here ({parted} of {compared} parted when the profile was measured, "
        f"backend.exactness), so more than {allowed} of {prompts} would be a change",
    )
