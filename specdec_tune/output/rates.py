"""`check`'s judging of absolute tokens/s (the speedup is output.check's).

The plain tokens/s is judged where the machine anchors agree (output.anchors): against the
reference processes of the run (app.reference) where the profile has them, else the final round's
median. Measured beside a decode anchor (measure.decode_anchor), it is judged per anchor step,
against the reference's ratio: the machine's own speed cancels there.
"""

from __future__ import annotations

import statistics

from ..checkpolicy import CHECK_POLICY, CheckPolicy
from ..measure.stats import INCONCLUSIVE, REGRESSION, Judgement, judge_speedup
from ..measurement import Measurement
from .verdicts import CheckItem, Evidence


def floor_test(
    now: list[float], stored: list[float], stored_median: float, tolerance: float, policy: CheckPolicy
) -> Judgement:
    """`stats.judge_speedup` at the policy's confidence and resamples: now / stored against the
    floor 1 - `tolerance` (pass, regression, or inconclusive when too noisy to tell)."""
    return judge_speedup(
        now,
        stored,
        stored_median,
        tolerance,
        confidence=policy.confidence,
        resamples=policy.bootstrap_resamples,
    )


def info_item(name: str, stored: float, measured: float, note: str = "information only") -> CheckItem:
    """A rate reported beside the verdict, never judged (it passes whatever it is)."""
    return CheckItem(name, round(stored, 2), round(measured, 2), True, note)


RATES = {"tokens_per_s": "rates", "baseline_tokens_per_s": "baseline_rates"}  # metric: per-repeat field


def rates_of(measured: Measurement, again: Measurement | None, metric: str) -> list[float]:
    """Every per-repeat tokens/s of `metric` in a re-measurement and its confirmation (the median
    alone where a measurement kept no repeats)."""
    out = []
    for m in (measured, again) if again is not None else (measured,):
        out += list(getattr(m, RATES[metric]) or [getattr(m.metrics, metric)])
    return out


# The reference's plain tokens/s per decode-anchor step/s (measure.decode_anchor), one per process.
PER_ANCHOR = "plain_per_anchor"


def per_anchor_of(measured: Measurement, again: Measurement | None) -> list[float]:
    """Every plain tokens/s per decode-anchor step/s of a re-measurement and its confirmation
    (empty where the first was measured without the anchor)."""
    out = list(measured.plain_per_anchor)
    if out and again is not None:
        out += list(again.plain_per_anchor)
    return out


def judge_rate(e: Evidence, metric: str, tolerance: float, policy: CheckPolicy = CHECK_POLICY) -> Judgement:
    """The floor test of a tokens/s against the reference processes' medians when the profile has
    them (their spread widens the interval), else against the final round's median; the measured
    rates times `e.rate_scale` first (see `rate_items`). The plain tokens/s measured beside a
    decode anchor is judged per anchor step against the reference's (`anchored`)."""
    if anchored(metric, e):
        ref = e.reference[PER_ANCHOR]
        now = clean_per_anchor(e, policy) or per_anchor_of(e.measured, e.again)
        return floor_test(now, ref, statistics.median(ref), tolerance, policy)
    rates = [r * e.rate_scale for r in rates_of(e.measured, e.again, metric)]
    ref = e.reference.get(metric)
    if ref:
        return floor_test(rates, ref, statistics.median(ref), tolerance, policy)
    return floor_test(rates, [], getattr(e.stored.metrics, metric), tolerance, policy)


def anchored(metric: str, e: Evidence) -> bool:
    """Whether the plain tokens/s is judged per decode-anchor step: the profile has that reference
    and this check measured the anchor beside plain decoding. The machine's own speed cancels in
    the ratio, so neither `rate_scale` nor the anchor drift rule applies to it."""
    return (
        metric == "baseline_tokens_per_s"
        and bool(e.reference.get(PER_ANCHOR))
        and bool(per_anchor_of(e.measured, e.again))
    )


def clean_per_anchor(e: Evidence, policy: CheckPolicy = CHECK_POLICY) -> list[float]:
    """On a machine that was not quiet: the plain rate per decode-anchor step of the repeats rebuilt
    from prompts neither the plain pass nor the anchor was preempted in (measure.preemption), when
    at least the policy's `min_clean_repeats` could be; else [] (on a quiet machine, too)."""
    if e.environment.quiet:
        return []
    out = list(e.measured.clean_plain_per_anchor)
    out += list(e.again.clean_plain_per_anchor) if e.again is not None else []
    return out if len(out) >= policy.min_clean_repeats else []


# An absolute rate measured on another machine of the profile's kind, or beside other work
OTHER_MACHINE = (
    "other machine (not the profile's own: absolute rates differ between VMs of one kind): "
    "information only, never a regression; the ratios measured in this run are judged"
)
SHARED_RATE = (
    "information only: other work shared the machine, so absolute rates are the host's; "
    "the speedup, judged on unpreempted prompts, carries the verdict"
)


def unjudged(e: Evidence, metric: str, policy: CheckPolicy = CHECK_POLICY) -> str:
    """Why a judged rate is reported but not judged here ("" when it is judged): measured on
    another machine of the profile's kind (`e.same_machine` False), unless it is the plain rate per
    decode-anchor step, a ratio measured in this run; or measured beside other work, unless that
    ratio could be rebuilt from unpreempted prompts (`clean_per_anchor`).

        same machine, quiet                        -> "" (judged)
        another VM of the slug, no decode anchor   -> OTHER_MACHINE
        another VM, plain per anchor step measured -> "" (the ratio is judged)
        same machine, shared, no anchor            -> SHARED_RATE"""
    per_anchor = anchored(metric, e)
    if not e.same_machine and not per_anchor:
        return OTHER_MACHINE
    if not e.environment.quiet and not (per_anchor and clean_per_anchor(e, policy)):
        return SHARED_RATE
    return ""


def in_fresh(processes: int, medians: int) -> str:
    """A note's words for a confirmation in fresh processes, judged on one median per process."""
    return f"re-measured in {processes} fresh process{'es' * (processes > 1)}: judged on {medians} process medians"


def rate_items(e: Evidence, tolerance: float, policy: CheckPolicy = CHECK_POLICY) -> list[CheckItem]:
    """The plain tokens/s judged like the speedup (the machine anchors agreed, so a drop is the
    setup's): a regression when clearly below stored × (1 - tolerance); inconclusive instead when
    too noisy, or when the machine's own speed drifted; information only on another machine or
    beside other work (`unjudged`). The speculative tokens/s is reported, not judged (the policy's `judged_rates`).

        stored 80, measured [68.0, 68.5, 67.6], quiet    -> regression (now/stored 0.85 < 0.90)
        the same, others 0.18 of the CPUs (shared)       -> information only (`unjudged`)
        the same, another VM of the profile's kind       -> information only: other machine
        the same, quiet, the matmul anchor drifted 10 %  -> inconclusive
        stored 80, measured [79, 81, 80], quiet          -> pass

    `e.rate_scale` (the matmul anchor's stored / measured rate) puts the measured rates at the speed
    the profile's machine had: a VM measures a few per cent faster or slower from one minute to the
    next, and unscaled that hid a 15 % slower target forward whenever the machine ran 2-5 %
    faster (benchmarks/interference.py). The reported value stays the unscaled one.

    `e.reference` (`reference_of`): the medians of fresh processes that measured the best config as
    `check` does right after the run; the stored value is then their median (app.reference says
    why the final round's own rate is a poorer one)."""
    items = []
    measured, again, where, scale, stored = e.measured, e.again, e.where, e.rate_scale, e.stored.metrics
    busy = e.environment.drifting  # shared or busy: not judged at all (`unjudged`)
    for metric in RATES:
        if metric not in policy.judged_rates:
            ref = e.reference.get(metric)
            items.append(
                info_item(
                    f"{metric}{where}",
                    statistics.median(ref) if ref else getattr(stored, metric),
                    statistics.median(rates_of(measured, again, metric)),
                    "information only: the speedup times the plain tokens/s, both judged",
                )
            )
            continue
        ref = e.reference.get(metric)
        why = unjudged(e, metric, policy)
        if why:
            base = statistics.median(ref) if ref else getattr(stored, metric)
            items.append(
                info_item(f"{metric}{where}", base, statistics.median(rates_of(measured, again, metric)), why)
            )
            continue
        judged = judge_rate(e, metric, tolerance, policy)
        if busy and judged.verdict == REGRESSION:
            judged.verdict = INCONCLUSIVE
        base = statistics.median(ref) if ref else getattr(stored, metric)
        against = f"the reference ({len(ref)} fresh processes)" if ref else "stored median"
        per_anchor = anchored(metric, e)
        if per_anchor:  # judged by the ratio; stored and measured stay the absolute rates
            note = (
                f"per decode-anchor step (timed between the plain passes, the machine's own speed "
                f"cancels): {judged.note} vs {against}; the machine anchors agree"
            )
            shown = statistics.median(rates_of(measured, again, metric))
            if not e.environment.quiet:
                note += "; other work shared the machine: judged on repeats rebuilt from unpreempted prompts"
        else:
            note = f"{judged.note} vs {against}; the machine anchors agree"
            shown = judged.ratio * base / scale
        if getattr(again, "processes", 0):
            note += f"; {in_fresh(again.processes, len(rates_of(measured, again, metric)))}"
        if scale != 1.0 and not per_anchor:
            note += f"; rates scaled ×{scale:.3f} to the profile's machine speed (matmul anchor)"
        if judged.verdict == INCONCLUSIVE:
            why = "the machine's own speed moved (matmul anchor)"
            note += "; inconclusive: " + (why if busy else "too noisy to tell")
        items.append(
            CheckItem(
                f"{metric}{where}",
                round(base, 2),
                round(shown, 2),
                judged.verdict != REGRESSION,
                note,
                inconclusive=judged.verdict == INCONCLUSIVE,
            )
        )
    return items
