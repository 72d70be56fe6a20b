"""Judge a re-measurement of a stored profile: the CI regression gate, data -> verdict (the
measuring is app.checking). Every threshold is the policy's (checkpolicy.CheckPolicy); what the
machine did is an Environment (output.environment); one stored config's evidence is an Evidence.

The speedup is judged with a test, not a single threshold: the bootstrap interval of (speedup now /
speedup stored), over the per-repeat ratios of both, against the floor 1 - tolerance
(`measure.stats.judge_speedup`): a regression, a pass, or "inconclusive" when the machine was too
noisy to tell (CLI exit 6). Greedy acceptance is deterministic on the same hardware and dtype, so
its tolerance is tight.

Before judging, the anchors tell other hardware from a regression (output.anchors). When they
agree, a slower target is a regression even though its speedup holds, so the plain tokens/s is
judged too, with the same test (output.rates); absolute rates move with any other work, so on a
machine that is not quiet a drop of them is inconclusive. The rules, one example each (stored
speedup 1.0, tolerance 0.10, so the floor is 0.90; `tests/output/test_verdict_rules.py`):

    speedup [1.0, 1.01, 0.99], quiet              -> pass
    speedup [0.50, 0.60, 0.55], quiet             -> regression (interval wholly below 0.90)
    speedup [0.84, 0.85, 0.86], shared or busy    -> inconclusive: other work shared the machine
    speedup [0.10, 0.11, 0.12], shared or busy    -> regression (no load took it below 0.5x of stored)
    speedup [0.6, 1.3, 0.85, 1.2, 0.7], quiet     -> inconclusive: too noisy to tell
    acceptance 0.70 stored, 0.69 now, greedy      -> pass (within ±0.02; ±0.08 when sampling)
    acceptance 0.70 stored, 0.50 now              -> regression, whatever the load
    greedy, 1 prompt's output differs             -> greedy exactness fails, whatever the load
    no draft (config none)                        -> no acceptance item
    anchors do not agree (judge_rates False)      -> tokens/s information only
    first speedup [0.85, 0.88, 0.80]              -> not clearly a pass: measured again
                                                     (the repeats its spread needs, 12 at most)
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..errors import SpecDecError
from ..measure.noise import repeats_needed
from ..measure.stats import INCONCLUSIVE, PASS, REGRESSION, Judgement
from ..measurement import Measurement
from ..store.schema import Profile
from .elsewhere import ANSWER, ELSEWHERE, explained_note, machine_floor
from .items import acceptance_item, exactness_item, weights_item
from .rates import OTHER_MACHINE, RATES, floor_test, in_fresh, info_item, judge_rate, rate_items
from .references import REPEATS, reference_side, reference_speedups
from .verdicts import CheckItem, CheckReport, Evidence

__all__ = [  # where callers have always found them
    "CheckItem",
    "CheckReport",
    "Evidence",
    "acceptance_item",
    "exactness_item",
    "rate_items",
    "weights_item",
]

# A speedup measured while other work took a share of the CPUs past the policy's shared line (or
# steal rose): said so, not "busy", which is the OS rule's word (the JSON's noise.busy)
SHARED = "other work shared the machine"


def speedup_floor(profile: Profile, tolerance: float, stored: Any = None) -> float:
    """The lowest speedup that still passes: the stored one (the best config's, or `stored`
    metrics') minus `tolerance` (relative)."""
    check_tolerance(tolerance)
    return (stored or profile.best.metrics).speedup * (1 - tolerance)


def check_tolerance(tolerance: float) -> None:
    if not 0 < tolerance < 1:
        raise SpecDecError(f"--tolerance must be in (0, 1), got {tolerance}")


def judge(
    profile: Profile,
    profile_path: str,
    evidence: Evidence,
    weights_hash: str,
    tolerance: float = CHECK_POLICY.tolerance,
    *,
    acceptance_tolerance: float | None = None,
    policy: CheckPolicy = CHECK_POLICY,
) -> CheckReport:
    """The report of a profile's best config re-measured (`evidence`, output.verdicts): the
    target's weights, then `judge_config`'s items."""
    report = CheckReport(profile=profile_path, config=profile.best.config.label)
    report.items.append(weights_item(profile.target.content_hash, weights_hash))
    report.items += judge_config(
        evidence, tolerance, acceptance_tolerance=acceptance_tolerance, policy=policy
    )
    return report


def judge_config(
    e: Evidence,
    tolerance: float = CHECK_POLICY.tolerance,
    *,
    acceptance_tolerance: float | None = None,
    policy: CheckPolicy = CHECK_POLICY,
) -> list[CheckItem]:
    """The items of one stored config re-measured (`e.where` names it, e.g. " @ B=4"): the speedup,
    the acceptance (a draft's), greedy exactness (temperature 0), and the rates (judged where
    `e.judge_rates`, else information only)."""
    items = [speedup_item(e, tolerance, policy)]
    items += [i for i in (acceptance_item(e, acceptance_tolerance, policy), exactness_item(e)) if i]
    if e.judge_rates:
        return items + rate_items(e, tolerance, policy)
    stored, m = e.stored.metrics, e.measured.metrics
    note = "information only" if e.same_machine else OTHER_MACHINE
    return items + [info_item(f"{k}{e.where}", getattr(stored, k), getattr(m, k), note) for k in RATES]


def speedup_item(e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY) -> CheckItem:
    """The speedup's floor test (`judge_measured`). On a machine that is not quiet other work takes
    the target's cores and speculation gains less, by more than any tolerance: with one core of two
    kept busy, checks of an unchanged setup measured 0.75-0.89 of the stored speedup
    (benchmarks/interference.py). So there the speedup is judged on the repeats rebuilt from
    prompts no other process preempted (`load_free`), as on a quiet machine; where too few are,
    a drop cannot be told from the load: inconclusive, never a regression, and the item says what
    would answer (`answer_for`)."""
    stored, m, measured, again = e.stored.metrics, e.measured.metrics, e.measured, e.again
    free = load_free(e, policy)
    shared = not e.environment.quiet and free is None
    judged = judge_measured(e, tolerance, policy)
    beyond_load = judged.interval[1] < policy.load_explains_down_to
    if shared and judged.verdict == REGRESSION and not beyond_load:
        judged.verdict = INCONCLUSIVE
    lowered = machine_floor(e, tolerance)  # another machine's reference: what its anchors explain
    rejudged = judge_measured(e, 1 - lowered, policy) if judged.verdict == REGRESSION and lowered else None
    explained = rejudged is not None and rejudged.verdict != REGRESSION
    if explained:
        judged.verdict = INCONCLUSIVE
    confirm = ""
    if again is not None:
        # Judged on all repeats together: a real regression stays below the floor, one noisy run
        # on a busy machine does not fail CI alone.
        twice = " twice" if e.looks == 2 else f" {e.looks} times" if e.looks > 2 else ""
        confirm = (
            f"; first {m.speedup:.3f}, so re-measured{twice}: {len(samples_of(measured, again))} repeats"
        )
        if getattr(again, "processes", 0):
            confirm = (
                f"; first {m.speedup:.3f}, so {in_fresh(again.processes, len(samples_of(measured, again)))}"
            )
    ref = reference_speedups(e.reference, policy)
    if ref:
        repeats = len((e.reference or {}).get(REPEATS) or [])
        against = f"the reference ({len(ref)} fresh processes" + (f", {repeats} repeats)" if repeats else ")")
    else:
        against = "stored repeats" if stored.speedup_samples else "stored median"
    note = f"{judged.note} vs {against}{confirm}"
    if free is not None:
        note += f"; {SHARED}: judged on {len(free)} repeats rebuilt from prompts no other process preempted"
        note += f" ({measured.clean_share:.0%} of them; our threads waited {measured.waited_share:.0%} of the time)"
    vague = judged.verdict == INCONCLUSIVE and not explained
    answer = ANSWER if explained else answer_for(e, tolerance, policy, judged) if vague else ""
    if explained:
        note += f"; {explained_note(e, lowered)}"
    elif judged.verdict == INCONCLUSIVE:
        note += "; inconclusive: " + (SHARED if shared else "too noisy to tell") + f"; {answer} would answer"
    elif shared and judged.verdict == REGRESSION:
        note += f"; {SHARED}, but no load measured took a speedup below {policy.load_explains_down_to:.2f}x of stored"
    elif shared:
        note += "; " + SHARED
    if judged.verdict == REGRESSION and not e.same_machine:
        note += f"; {ELSEWHERE}"
    base = statistics.median(ref) if ref else stored.speedup
    return CheckItem(
        f"speedup{e.where}",
        round(base, 4),
        round(judged.ratio * base, 4),
        judged.verdict != REGRESSION,
        note,
        inconclusive=judged.verdict == INCONCLUSIVE,
        answer=answer,
    )


def clean_of(measured: Measurement, again: Measurement | None) -> list[float]:
    """Every speedup of the repeats rebuilt from unpreempted prompts (measure.preemption) in a
    re-measurement and its confirmation (fresh processes' medians keep none)."""
    return list(measured.clean_speedups) + (list(again.clean_speedups) if again is not None else [])


def load_free(e: Evidence, policy: CheckPolicy = CHECK_POLICY) -> list[float] | None:
    """The speedups to judge a measurement that shared the machine by: those of the repeats rebuilt
    from prompts whose threads never waited for a CPU (measure.preemption.clean_ratios), when at
    least the policy's `min_clean_repeats` could be; None on a quiet machine (all repeats are
    judged) or when too few could (the load decides nothing then: inconclusive).

        shared, clean [2.10, 2.12, 2.08] of stored 2.14       -> judged as quiet: pass
        shared, clean [1.80, 1.82, 1.79] of stored 2.14       -> judged as quiet: regression
        shared, clean [2.10] (one prompt in 8 unpreempted)    -> None: inconclusive
        quiet                                                 -> None: every repeat judged"""
    if e.environment.quiet:
        return None
    clean = clean_of(e.measured, e.again)
    return clean if len(clean) >= policy.min_clean_repeats else None


def answer_for(
    e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY, judged: Judgement | None = None
) -> str:
    """What would make an inconclusive speedup answer, in a few words (`repeats_to_answer`'s count,
    or a quiet machine, and why). On a quiet machine where no count of repeats would: the tolerance
    its interval's width resolves (a wider one answers either way), and a reference where there is
    none; `judged`: the floor test already made (`judge_measured`), not bootstrapped again.

        shared, 1 in 4 prompt pairs unpreempted, 3 repeats run -> "about 9 more repeats (--repeats 12) or a quiet machine"
        shared, no prompt unpreempted                          -> "a quiet machine (our threads waited 48% ...)"
        quiet, speedups [0.6, 1.3, 0.85, 1.2, 0.7], no reference -> "`specdec-tune reference` or --tolerance 0.70, ..."
        shared, unpreempted [0.80, 0.88, 0.96, 0.84, 0.92] at 0.75, 3 repeats run
                                                               -> "about 13 more repeats (--repeats 16) or ..."
    """
    ran = len(samples_of(e.measured, e.again))
    more, why = repeats_to_answer(e, tolerance, policy)
    if more is not None:  # on a quiet machine (the check slice's core included) the repeats alone
        tail = "" if e.environment.quiet else " or a quiet machine"
        return f"about {more} more repeats (--repeats {ran + more}){tail}"
    if e.environment.quiet:  # quiet already: only a tolerance this check can resolve would answer,
        lo, hi = (judged or judge_measured(e, tolerance, policy)).interval  # or, judged against one
        tol = f"--tolerance {math.ceil(100 * (hi - lo)) / 100:.2f}, what a quiet machine resolves here{why}"
        # process's stored repeats, a reference in fresh processes (a planted vLLM drop read 0.854 [0.726,
        # 1.004] against 5 stored repeats, 0.864 [0.829, 0.916] against 3 server pairs: docs/vllm.md)
        return tol if reference_speedups(e.reference, policy) else f"`specdec-tune reference` or {tol}"
    return f"a quiet machine{why}"


def repeats_to_answer(
    e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY
) -> tuple[int | None, str]:
    """(how many more repeats would likely answer an inconclusive speedup, None where only a quiet
    machine would; why not, in a few words). Judged on all repeats (quiet) or on enough unpreempted
    ones (`load_free`) but too noisy: the least count of repeats like these (cycled) whose floor
    test answers against the same stored side (its own spread counts: 5 stored repeats 4 % apart
    leave little of a 10 % tolerance), counted at the share of unpreempted prompts seen. Beside
    other work with too few unpreempted repeats: the repeats that would give `min_clean_repeats` of
    them at that share. Either beyond the policy's `max_repeats_asked`, or no prompt unpreempted at
    all: None."""
    ran = len(samples_of(e.measured, e.again))
    share = e.measured.clean_share
    free = load_free(e, policy)
    if e.environment.quiet or free is not None:
        xs = free or samples_of(e.measured, e.again)
        mean = statistics.fmean(xs)
        cv = statistics.stdev(xs) / mean if len(xs) > 1 and mean > 0 else 0.0
        # the judged interval narrower than the tolerance decides (stats.judge_speedup), and the
        # stored side's own repeats count as much as these: the least count of repeats like these
        # (cycled) that answers, up to the policy's max_repeats_asked
        counts = range(len(xs) + 1, policy.max_repeats_asked + 1)
        needed = next((n for n in counts if _answers(e, xs, n, tolerance, policy)), counts.stop)
        needed = math.ceil(needed / share) if free is not None and share else needed
        if needed > policy.max_repeats_asked:
            stored = _against(e, policy)[0]
            why = f"the speedup varied {cv:.0%} from repeat to repeat"
            s_cv = statistics.stdev(stored) / statistics.fmean(stored) if len(stored) > 1 else 0.0
            if s_cv >= policy.stored_spread_said:
                why += f", the stored {len(stored)} {_stored_name(e, policy)} {s_cv:.0%}"
            return None, f" ({why})"
        return max(1, needed - ran), ""
    if not share:
        waited = (
            f" (our threads waited {e.measured.waited_share:.0%} of the time for a CPU)" if share == 0 else ""
        )
        return None, waited
    needed = math.ceil(policy.min_clean_repeats / share)
    if needed > policy.max_repeats_asked:
        return None, f" (only {share:.0%} of prompts ran unpreempted)"
    return max(1, needed - ran), ""


def _against(e: Evidence, policy: CheckPolicy) -> tuple[list[float], float]:
    """What a speedup is judged against (`judge_measured`): the reference processes' speedups and
    their median, else the stored repeats (or median) and the stored speedup."""
    ref = reference_side(e.reference, policy)
    if ref:
        return ref, statistics.median(ref)
    stored = e.stored.metrics
    return list(stored.speedup_samples) or [stored.speedup], stored.speedup


def _stored_name(e: Evidence, policy: CheckPolicy) -> str:
    """How the stored side's samples are named in an answer."""
    return "reference processes varied" if reference_speedups(e.reference, policy) else "repeats varied"


def _answers(e: Evidence, xs: list[float], n: int, tolerance: float, policy: CheckPolicy) -> bool:
    """Whether the floor test of `n` repeats like `xs` (cycled) against what the speedup is judged
    against answers (pass or regression)."""
    stored, median = _against(e, policy)
    return (
        floor_test([xs[i % len(xs)] for i in range(n)], stored, median, tolerance, policy).verdict
        != INCONCLUSIVE
    )


def samples_of(measured: Any, again: Any | None) -> list[float]:
    """Every per-repeat speedup of a re-measurement (and its confirmation)."""
    out = list(measured.speedups or [measured.metrics.speedup])
    return out + (list(again.speedups or [again.metrics.speedup]) if again is not None else [])


def judge_measured(e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY) -> Judgement:
    """The floor test of a re-measurement's speedups (and its confirmation's) against the reference
    processes' speedups where the profile has them (`reference_of`), else against the stored
    metrics (the final round's repeats, all from the one process that ran the search)."""
    check_tolerance(tolerance)
    now = load_free(e, policy) or samples_of(e.measured, e.again)
    ref = reference_side(e.reference, policy)
    if ref:
        return floor_test(now, ref, statistics.median(ref), tolerance, policy)
    stored = e.stored.metrics
    return floor_test(now, stored.speedup_samples, stored.speedup, tolerance, policy)


def needs_confirmation(e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY) -> bool:
    """Measure again? When the speedup (or, where `e.judge_rates`, a judged tokens/s) of the first
    measurement did not clearly pass (`e.again` is not looked at); with the policy's
    `confirm_pair_spread`, also when the speedup's interval reaches below the floor."""
    judged = judge_measured(e, tolerance, policy)
    if judged.verdict != PASS or (policy.confirm_pair_spread and judged.interval[0] < judged.floor):
        return True
    return e.judge_rates and any(
        judge_rate(e, metric, tolerance, policy).verdict != PASS for metric in policy.judged_rates
    )


def straddling_pass(judged: Judgement, policy: CheckPolicy) -> bool:
    """A pass by its estimate alone, its interval reaching below the floor, where the policy passes
    a pair's reading only clear of the floor (`confirm_pair_spread`): worth another look."""
    return policy.confirm_pair_spread and judged.verdict == PASS and judged.interval[0] < judged.floor


def another_look(e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY) -> int | None:
    """The repeats of one more confirmation, or None. Only a speedup the confirmations so far left
    inconclusive for noise (quiet, or judged on unpreempted repeats: `load_free`), measured in the
    session (a fresh-process confirmation has its own count), within the policy's `confirm_looks`:
    as many as `repeats_to_answer` names and at least as many as ran so far, at most
    `max_confirm_repeats`; the caller takes at least a first measurement's repeats. With the
    policy's `confirm_pair_spread`, also a pass by its estimate whose interval reaches below the
    floor (`straddling_pass`), with as many repeats again as ran: on another VM a planted 15 %
    drop read 0.915 [0.852, 0.946] of an agreeing reference after its confirmation and passed, 1
    check of 8 (stop 61); more repeats move such an estimate toward where the drop is, and after
    the last look the estimate decides as before.

        quiet, 0.87 [0.79, 0.935] over 6 repeats (3 + 3), stored 1.0, floor 0.90 -> 12 (16 asked, capped)
        the same after a second confirmation                              -> None (confirm_looks 2)
        the same on a shared machine, no repeat accounted                  -> None (the load, not noise)
        0.75 [0.74, 0.76] (a regression) or 0.99 (a pass)                  -> None (answered)"""
    again = e.again
    if again is None or again.processes or e.looks >= policy.confirm_looks:
        return None
    if not (e.environment.quiet or load_free(e, policy) is not None):
        return None
    judged = judge_measured(e, tolerance, policy)
    if straddling_pass(judged, policy):
        # a pass by its estimate only: as many repeats again as ran, and all of them judged
        return min(policy.max_confirm_repeats, len(samples_of(e.measured, again)))
    if judged.verdict != INCONCLUSIVE:
        return None
    more, _ = repeats_to_answer(e, tolerance, policy)
    if more is None:
        return None
    # at least as many as ran so far: that count assumes new repeats like these, and a new server
    # pair (or a process's new level) is not (vLLM's planted check: "3 more" asked, 3 taken, and the
    # same 0.86 [0.79, 0.91] again over 9, stop 57)
    return min(policy.max_confirm_repeats, max(more, len(samples_of(e.measured, again))))


def confirm_repeats(
    measured: Any, repeats: int, policy: CheckPolicy = CHECK_POLICY, *, shared: bool = False
) -> int:
    """Repeats for the confirming re-measurement: as many as the first one's spread needs to resolve
    the policy's `confirm_resolve_share` (`noise.repeats_needed`; a ratio of two passes varies
    sqrt(2) times one pass), at most `max_confirm_repeats`, never fewer than `repeats`. With
    `shared` (other work shared the machine) and the preemption accounted: as many as give the
    policy's `min_clean_repeats` unpreempted repeats at the share of unpreempted prompts seen, when
    the first has fewer (none seen: `repeats`, one more look).

        speedups [0.97, 1.00, 1.03], 3 repeats -> 6 (cv 3 %: resolving 5 % needs 6)
        speedups [0.85, 0.88, 0.80], 3 repeats -> 12 (cv 4.8 % needs 15: capped)
        speedups [1.0], 3 repeats              -> 3 (no spread to size it by)
        shared, 1 clean repeat, share 0.4      -> 5 (2 more clean ones at 0.4 a repeat)"""
    share = getattr(measured, "clean_share", None)
    have = len(getattr(measured, "clean_speedups", []) or [])
    if shared and share is not None and have < policy.min_clean_repeats:
        if share <= 0:
            return repeats
        return max(
            repeats, min(policy.max_confirm_repeats, math.ceil((policy.min_clean_repeats - have) / share))
        )
    xs = list(measured.speedups or [])
    if len(xs) < 2:
        return repeats
    mean = sum(xs) / len(xs)
    cv = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) / mean if mean > 0 else 0.0
    needed = repeats_needed(cv / math.sqrt(2), policy.confirm_resolve_share)
    return max(repeats, min(policy.max_confirm_repeats, needed))
